package workers

import "iter"

// fifo is a first-in, first-out list in blocks: the first holds
// fifoMinBlock items, each next one twice its predecessor's up to
// fifoBlockLen. It grows without copying what it holds, and gives back a
// block's memory once the block has been read, so a long backlog costs
// its items and little more, while it fills and while it drains; an
// emptied list keeps a small block only. The zero value is an empty
// list. It is not safe for concurrent use.
type fifo[T any] struct {
	head, tail *fifoBlock[T]
	first      int // the index of the first item in head
	n          int
}

// The sizes of a fifo's blocks: a block of 256 pointers is 2 KiB.
const (
	fifoMinBlock = 8
	fifoBlockLen = 256
)

type fifoBlock[T any] struct {
	items []T
	n     int // how many items were written to the block
	next  *fifoBlock[T]
}

// push appends v.
func (f *fifo[T]) push(v T) {
	if f.tail == nil || f.tail.n == len(f.tail.items) {
		size := fifoMinBlock
		if f.tail != nil {
			size = min(2*len(f.tail.items), fifoBlockLen)
		}
		b := &fifoBlock[T]{items: make([]T, size)}
		if f.tail == nil {
			f.head = b
		} else {
			f.tail.next = b
		}
		f.tail = b
	}
	f.tail.items[f.tail.n] = v
	f.tail.n++
	f.n++
}

// pop removes and returns the first item, or reports false if there is
// none.
func (f *fifo[T]) pop() (T, bool) {
	var zero T
	if f.n == 0 {
		return zero, false
	}
	b := f.head
	v := b.items[f.first]
	b.items[f.first] = zero
	f.first++
	f.n--
	switch {
	case f.n == 0:
		// Emptied (b is the last block): a small block is written again
		// from the start, a large one let go.
		if len(b.items) > fifoMinBlock {
			f.head, f.tail = nil, nil
		}
		b.n, f.first = 0, 0
	case f.first == b.n:
		// The block is read, and the next one leads.
		f.head, f.first = b.next, 0
	}
	return v, true
}

// len returns how many items the list holds.
func (f *fifo[T]) len() int { return f.n }

// all yields the items in order.
func (f *fifo[T]) all() iter.Seq[T] {
	return func(yield func(T) bool) {
		start := f.first
		for b := f.head; b != nil; b = b.next {
			for _, v := range b.items[start:b.n] {
				if !yield(v) {
					return
				}
			}
			start = 0
		}
	}
}

// takeAll empties the list and returns its items in order.
func (f *fifo[T]) takeAll() []T {
	if f.n == 0 {
		*f = fifo[T]{}
		return nil
	}
	items := make([]T, 0, f.n)
	for v := range f.all() {
		items = append(items, v)
	}
	*f = fifo[T]{}
	return items
}
