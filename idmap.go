package workers

import (
	"hash/maphash"
	"iter"
)

// idMap maps task ids to values that carry their own id: a runtime's
// runs, a MemStore's records. It keeps them in a table keyed by a 64-bit
// hash of the id instead of the id itself, so that an entry is 16 bytes
// instead of 24, and growing the table moves integers instead of reading
// every id again; a lookup compares the id the value carries. An id whose
// hash another id holds already (about one pair in 10^8 among a million
// ids) is kept in a Go map, by the id itself.
//
// The zero value is not usable; call newIDMap. It is not safe for
// concurrent use.
type idMap[V interface {
	comparable
	taskID() string
}] struct {
	seed   maphash.Seed
	mask   uint64 // all ones; fewer bits in tests, to make hashes clash
	byHash table[V]
	clash  map[string]V // nil until an id's hash is held by another
}

func newIDMap[V interface {
	comparable
	taskID() string
}]() *idMap[V] {
	return &idMap[V]{seed: maphash.MakeSeed(), mask: ^uint64(0)}
}

// key returns id's key in the table.
func (m *idMap[V]) key(id string) uint64 { return slotKey(maphash.String(m.seed, id) & m.mask) }

// get returns the value for id.
func (m *idMap[V]) get(id string) (V, bool) {
	if s := m.byHash.find(m.key(id)); s != nil && s.v.taskID() == id {
		return s.v, true
	}
	if m.clash != nil {
		v, ok := m.clash[id]
		return v, ok
	}
	var zero V
	return zero, false
}

// set stores v under its id and returns the value it replaced, if any.
func (m *idMap[V]) set(v V) (old V, replaced bool) {
	id := v.taskID()
	k := m.key(id)
	switch s := m.byHash.find(k); {
	case s != nil && s.v.taskID() == id:
		old, s.v = s.v, v
		return old, true
	case s != nil:
		// Another id holds the hash: v goes by its id.
		if m.clash == nil {
			m.clash = make(map[string]V)
		}
		old, replaced = m.clash[id]
		m.clash[id] = v
		return old, replaced
	case m.clash != nil:
		// The hash is free, but v's id may be kept by id since another
		// id held it: keep one entry only.
		if old, replaced = m.clash[id]; replaced {
			delete(m.clash, id)
		}
	}
	m.byHash.insert(k, v)
	return old, replaced
}

// add stores v unless its id has a value already, and reports whether
// it did.
func (m *idMap[V]) add(v V) bool {
	id := v.taskID()
	k := m.key(id)
	switch s := m.byHash.find(k); {
	case s != nil && s.v.taskID() == id:
		return false
	case s != nil:
		// Another id holds the hash: v goes by its id.
		if _, ok := m.clash[id]; ok {
			return false
		}
		if m.clash == nil {
			m.clash = make(map[string]V)
		}
		m.clash[id] = v
	default:
		if _, ok := m.clash[id]; ok {
			return false // kept by id since another id held the hash
		}
		m.byHash.insert(k, v)
	}
	return true
}

// deleteValue removes v if it is the value for its id, and reports
// whether it was.
func (m *idMap[V]) deleteValue(v V) bool {
	id := v.taskID()
	if s := m.byHash.find(m.key(id)); s != nil && s.v == v {
		m.byHash.remove(s)
		return true
	}
	if cur, ok := m.clash[id]; ok && cur == v {
		delete(m.clash, id)
		return true
	}
	return false
}

// len returns the number of values.
func (m *idMap[V]) len() int { return m.byHash.live + len(m.clash) }

// all yields every value, in no particular order. Values may be deleted
// during the walk, but none may be set.
func (m *idMap[V]) all() iter.Seq[V] {
	return func(yield func(V) bool) {
		if !m.byHash.walk(yield) {
			return
		}
		for _, v := range m.clash {
			if !yield(v) {
				return
			}
		}
	}
}

// clear removes every value.
func (m *idMap[V]) clear() {
	m.byHash = table[V]{}
	m.clash = nil
}

// rebuilt returns a map of m's values in a table that fits them, with
// m's seed: a table never shrinks as values leave it.
func (m *idMap[V]) rebuilt() *idMap[V] {
	n := &idMap[V]{seed: m.seed, mask: m.mask}
	for v := range m.all() {
		n.set(v)
	}
	return n
}
