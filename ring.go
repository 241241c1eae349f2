package workers

// runRing holds a shard's runs whose records keep their handles (see
// runSet), in the order they were published, in a ring of slots. A run
// knows its slot (Task.pos), so that settling it writes that slot and the
// run itself, nothing else: a linked list wrote the next run too, which,
// a million runs deep in a queue, was a cache miss per settled run.
//
// Positions count up, modulo 2^32, which the differences between them
// never near. The runs sit at positions [head, tail), a settled run's
// slot left nil; when the oldest run settles, head moves past the nil
// slots, and a ring whose positions in use then fit in a quarter of it
// shrinks to fit them. A run that stays while those after it settle
// keeps head behind, and the ring its size: when such a ring is full and
// at least half of it is nil, its runs move to a new ring that fits them,
// each told its new slot. A ring grows only when more than half of it
// holds runs, so it is never over four times the most runs it held at
// once (or minRing); one kept large behind a run that stays shrinks when
// that run settles, or at the next compaction.
type runRing struct {
	slots      []*Task // a power of two long, or empty; position p is at p&(len-1)
	head, tail uint32  // the positions in use
	n          uint32  // runs held
}

// minRing is the fewest slots a ring keeps once it has any.
const minRing = 16

// push adds t, which no ring holds.
func (g *runRing) push(t *Task) {
	if int(g.tail-g.head) == len(g.slots) {
		g.full()
	}
	g.slots[g.tail&uint32(len(g.slots)-1)] = t
	t.pos = uint64(g.tail) + 1 // 0 says no ring holds it
	g.tail++
	g.n++
}

// holds reports whether t is in the ring; t is in this ring or none.
func (g *runRing) holds(t *Task) bool { return t.pos != 0 }

// remove takes out t, which the ring holds.
func (g *runRing) remove(t *Task) {
	p := uint32(t.pos - 1)
	mask := uint32(len(g.slots) - 1)
	g.slots[p&mask] = nil
	t.pos = 0
	g.n--
	if p != g.head {
		return
	}
	for g.head != g.tail && g.slots[g.head&mask] == nil {
		g.head++
	}
	if span := int(g.tail - g.head); len(g.slots) > minRing && span <= len(g.slots)/4 {
		g.resize(ringFor(span))
	}
}

// ringFor returns the size of a ring for n runs: a power of two, at
// least minRing, at least twice n.
func ringFor(n int) int {
	size := minRing
	for size < 2*n {
		size *= 2
	}
	return size
}

// full makes room for one more run: in a new ring of the same size or
// smaller when at least half the slots are nil, else in one twice as big.
func (g *runRing) full() {
	if len(g.slots) == 0 {
		g.slots = make([]*Task, minRing)
		return
	}
	if int(g.n) > len(g.slots)/2 {
		g.resize(2 * len(g.slots))
		return
	}
	size := ringFor(int(g.n))
	slots := make([]*Task, size)
	mask, to := uint32(len(g.slots)-1), g.tail
	for p := g.head; p != g.tail; p++ {
		if t := g.slots[p&mask]; t != nil {
			slots[to&uint32(size-1)] = t
			t.pos = uint64(to) + 1
			to++
		}
	}
	g.slots, g.head, g.tail = slots, g.tail, to
}

// resize moves the ring's slots to a ring of size slots, which holds
// them all: every run keeps its position.
func (g *runRing) resize(size int) {
	slots := make([]*Task, size)
	mask := uint32(len(g.slots) - 1)
	for p := g.head; p != g.tail; p++ {
		slots[p&uint32(size-1)] = g.slots[p&mask]
	}
	g.slots = slots
}

// appendTo appends the ring's runs to runs, oldest first.
func (g *runRing) appendTo(runs []*Task) []*Task {
	mask := uint32(len(g.slots) - 1)
	for p := g.head; p != g.tail; p++ {
		if t := g.slots[p&mask]; t != nil {
			runs = append(runs, t)
		}
	}
	return runs
}

// clear takes every run out and returns them, oldest first.
func (g *runRing) clear() []*Task {
	runs := g.appendTo(nil)
	for _, t := range runs {
		t.pos = 0
	}
	*g = runRing{}
	return runs
}
