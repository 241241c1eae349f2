package workers

// table is an open-addressing hash table of values keyed by 64-bit
// hashes, with linear probing: what idMap keeps its values in. A lookup
// reads the slot array at the key's place and the slots after it, a few
// for a key it holds and, at three quarters full, about eight (two cache
// lines, which follow each other) for a key it does not; a Go map
// reaches its directory, a table and a group first, each a line of its
// own that a submission after an idle spell finds out of cache.
//
// It grows without a pause: when it needs room it makes a new array,
// twice as large unless tombstones take the room, and each later insert
// moves a few of the old array's slots into it, so that no insert copies
// a large table at once (a Go map bounds its pauses the same way, by
// splitting tables of at most 1024 slots). Until then a lookup that
// misses in the new array looks in the old one, and the old array stays
// allocated: a table that stops growing halfway through keeps it.
//
// The zero value is an empty table. It is not safe for concurrent use.
type table[V comparable] struct {
	slots []hslot[V] // a power of two of them, or nil
	used  int        // slots of slots holding a value or a tombstone
	live  int        // values, in slots and old
	old   []hslot[V] // the array slots replaced, until its values have moved
	moved int        // old's slots below this one have moved
}

// hslot is a table's entry. Its key is a hash moved off the two values
// that mark an empty slot and a tombstone (see slotKey).
type hslot[V comparable] struct {
	k uint64
	v V
}

const (
	emptySlot = 0
	tombSlot  = 1 // a removed value's slot: probes go past it
	minTable  = 8
	moveStep  = 8 // old slots moved per insert while the table grows
)

// reserve's bound needs moveStep of at least 4: this does not compile
// otherwise.
var _ [moveStep - 4]struct{}

// slotKey returns the key of hash h: h, moved off the two marks.
func slotKey(h uint64) uint64 {
	if h <= tombSlot {
		h += 2
	}
	return h
}

// find returns the slot holding k, or nil. The slot is valid until the
// next insert, which may move its value: a write through it after that
// is lost. find writes nothing, so callers may share a read lock.
func (t *table[V]) find(k uint64) *hslot[V] {
	if t.live == 0 {
		return nil
	}
	if s := lookup(t.slots, k); s != nil || t.old == nil {
		return s
	}
	return lookup(t.old, k)
}

// lookup returns the slot of slots holding k, or nil. slots has an empty
// slot, which ends the probe.
func lookup[V comparable](slots []hslot[V], k uint64) *hslot[V] {
	mask := len(slots) - 1
	for i := int(k) & mask; ; i = (i + 1) & mask {
		switch s := &slots[i]; s.k {
		case k:
			return s
		case emptySlot:
			return nil
		}
	}
}

// insert stores v under k, which the table does not hold.
func (t *table[V]) insert(k uint64, v V) {
	t.reserve()
	t.place(k, v)
	t.live++
}

// place puts v under k in slots, in the first free slot of k's probe: k
// is not there, so a tombstone can take it.
func (t *table[V]) place(k uint64, v V) {
	mask := len(t.slots) - 1
	i := int(k) & mask
	for t.slots[i].k > tombSlot {
		i = (i + 1) & mask
	}
	if t.slots[i].k == emptySlot {
		t.used++
	}
	t.slots[i] = hslot[V]{k, v}
}

// remove takes out the value of s, a slot find returned, leaving a
// tombstone, so that probes past it and a walk in progress miss nothing.
func (t *table[V]) remove(s *hslot[V]) {
	*s = hslot[V]{k: tombSlot}
	t.live--
}

// reserve makes room for one more value in slots, which it keeps at most
// three quarters used, so that every probe ends at an empty slot.
//
// Moving moveStep slots per insert empties the old array before the new
// one needs to grow: a doubling starts with at most 3/4 of the old
// array's n slots used, and the n/moveStep inserts that move the rest
// add as many values, so the new array's 2n slots are at most 7/16 used
// when the move ends; a rebuild of the same size starts with at most n/2
// values (else it would double), and ends at most 5/8 used. So a
// rebuild never starts while the old array holds values, which the
// tests of growth and of churn check; the bound needs a moveStep of at
// least 4, which a declaration below the constants enforces.
func (t *table[V]) reserve() {
	if t.old != nil {
		t.move(moveStep)
	}
	if (t.used+1)*4 <= len(t.slots)*3 {
		return
	}
	n := len(t.slots)
	switch {
	case n == 0:
		t.slots = make([]hslot[V], minTable)
		return
	case (t.live+1)*2 > n:
		n *= 2 // else tombstones take the room: rebuild at the same size
	}
	t.old, t.moved = t.slots, 0
	t.slots, t.used = make([]hslot[V], n), 0
	t.move(moveStep)
}

// move moves up to n of old's slots into slots, and drops old once it
// has none left.
func (t *table[V]) move(n int) {
	end := min(t.moved+n, len(t.old))
	for i := t.moved; i < end; i++ {
		if s := &t.old[i]; s.k > tombSlot {
			t.place(s.k, s.v)
			*s = hslot[V]{k: tombSlot} // found in slots from now on
		}
	}
	if t.moved = end; end == len(t.old) {
		t.old, t.moved = nil, 0
	}
}

// walk yields every value until yield returns false, and reports whether
// it did not. Values may be removed during the walk, but none inserted.
func (t *table[V]) walk(yield func(V) bool) bool {
	for _, slots := range [2][]hslot[V]{t.slots, t.old} {
		for i := range slots {
			if s := &slots[i]; s.k > tombSlot && !yield(s.v) {
				return false
			}
		}
	}
	return true
}
