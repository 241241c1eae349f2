package workers

import (
	"hash/maphash"
	"iter"
)

// idMap maps task ids to values that carry their own id: a runtime's
// runs, a MemStore's records. It keys a Go map by a 64-bit hash of the id
// instead of the id itself, so that an entry is 16 bytes instead of 24,
// and growing the map rehashes integers instead of reading every id
// again; a lookup compares the id the value carries. An id whose hash
// another id holds already (about one pair in 10^8 among a million ids)
// is kept in a second map, by the id itself.
//
// The zero value is not usable; call newIDMap. It is not safe for
// concurrent use.
type idMap[V interface {
	comparable
	taskID() string
}] struct {
	seed   maphash.Seed
	mask   uint64 // all ones; fewer bits in tests, to make hashes clash
	byHash map[uint64]V
	clash  map[string]V // nil until an id's hash is held by another
}

func newIDMap[V interface {
	comparable
	taskID() string
}]() *idMap[V] {
	return &idMap[V]{seed: maphash.MakeSeed(), mask: ^uint64(0), byHash: make(map[uint64]V)}
}

func (m *idMap[V]) hash(id string) uint64 { return maphash.String(m.seed, id) & m.mask }

// get returns the value for id.
func (m *idMap[V]) get(id string) (V, bool) {
	if v, ok := m.byHash[m.hash(id)]; ok && v.taskID() == id {
		return v, true
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
	h := m.hash(id)
	cur, ok := m.byHash[h]
	switch {
	case ok && cur.taskID() != id:
		// Another id holds the hash: v goes by its id.
		if m.clash == nil {
			m.clash = make(map[string]V)
		}
		old, replaced = m.clash[id]
		m.clash[id] = v
		return old, replaced
	case !ok && m.clash != nil:
		// The hash is free, but v's id may be kept by id since another
		// id held it: keep one entry only.
		if old, replaced = m.clash[id]; replaced {
			delete(m.clash, id)
		}
	}
	m.byHash[h] = v
	if ok {
		return cur, true
	}
	return old, replaced
}

// add stores v unless its id has a value already, and reports whether
// it did: one hash and one lookup where get and then set take two.
func (m *idMap[V]) add(v V) bool {
	id := v.taskID()
	h := m.hash(id)
	cur, ok := m.byHash[h]
	switch {
	case ok && cur.taskID() == id:
		return false
	case ok:
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
		m.byHash[h] = v
	}
	return true
}

// deleteValue removes v if it is the value for its id, and reports
// whether it was.
func (m *idMap[V]) deleteValue(v V) bool {
	id := v.taskID()
	h := m.hash(id)
	if cur, ok := m.byHash[h]; ok && cur == v {
		delete(m.byHash, h)
		return true
	}
	if cur, ok := m.clash[id]; ok && cur == v {
		delete(m.clash, id)
		return true
	}
	return false
}

// len returns the number of values.
func (m *idMap[V]) len() int { return len(m.byHash) + len(m.clash) }

// all yields every value, in no particular order. Values may be deleted
// during the walk; a value set during it may be missed, even one whose id
// was there before (it may move between the two maps).
func (m *idMap[V]) all() iter.Seq[V] {
	return func(yield func(V) bool) {
		for _, v := range m.byHash {
			if !yield(v) {
				return
			}
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
	clear(m.byHash)
	m.clash = nil
}
