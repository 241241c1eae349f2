package workers

import (
	"testing"
	"unsafe"

	"github.com/stretchr/testify/assert"
)

// field is where a struct field lies: its offset and size.
type field struct {
	name       string
	off, bytes uintptr
}

// fields is a group of a struct's fields, and who touches them.
type fields struct {
	role string
	list []field
}

// assertApart checks that every field of b starts at least a cache line
// after the end of every field of a, so that no two of them can share a
// line (see cacheLinePad).
func assertApart(t *testing.T, what string, a, b fields) {
	t.Helper()
	for _, x := range a.list {
		for _, y := range b.list {
			assert.GreaterOrEqual(t, y.off, x.off+x.bytes+64,
				"%s: %s, %s, is within a cache line of %s, %s", what, y.name, b.role, x.name, a.role)
		}
	}
}

func TestSubmissionWritesKeepOffTheLinesRunsRead(t *testing.T) {
	var rt Runtime[*MemStore]
	read := fields{"read by the runs and the submissions", []field{
		{"store", unsafe.Offsetof(rt.store), unsafe.Sizeof(rt.store)},
		{"cfg", unsafe.Offsetof(rt.cfg), unsafe.Sizeof(rt.cfg)},
		{"life", unsafe.Offsetof(rt.life), unsafe.Sizeof(rt.life)},
		{"adm", unsafe.Offsetof(rt.adm), unsafe.Sizeof(rt.adm)},
		{"keys", unsafe.Offsetof(rt.keys), unsafe.Sizeof(rt.keys)},
		{"runners", unsafe.Offsetof(rt.runners), unsafe.Sizeof(rt.runners)},
		{"noOpts", unsafe.Offsetof(rt.noOpts), unsafe.Sizeof(rt.noOpts)},
		{"lease", unsafe.Offsetof(rt.lease), unsafe.Sizeof(rt.lease)},
		{"hooks", unsafe.Offsetof(rt.hooks), unsafe.Sizeof(rt.hooks)},
		{"runs", unsafe.Offsetof(rt.runs), unsafe.Sizeof(rt.runs)},
		{"mem", unsafe.Offsetof(rt.mem), unsafe.Sizeof(rt.mem)},
	}}
	listeners := fields{"written by Wait and the subscribers", []field{
		{"bells", unsafe.Offsetof(rt.bells), unsafe.Sizeof(rt.bells)},
		{"hub", unsafe.Offsetof(rt.hub), unsafe.Sizeof(rt.hub)},
	}}
	submissions := fields{"written by every submission", []field{
		{"runSeq", unsafe.Offsetof(rt.runSeq), unsafe.Sizeof(rt.runSeq)},
		{"gate", unsafe.Offsetof(rt.gate), unsafe.Sizeof(rt.gate)},
		{"mu", unsafe.Offsetof(rt.mu), unsafe.Sizeof(rt.mu)},
	}}
	assertApart(t, "Runtime", read, listeners)
	assertApart(t, "Runtime", read, submissions)
	assertApart(t, "Runtime", listeners, submissions)

	var s MemStore
	assertApart(t, "MemStore", fields{"read by every write", []field{
		{"seed", unsafe.Offsetof(s.seed), unsafe.Sizeof(s.seed)},
		{"shards", unsafe.Offsetof(s.shards), unsafe.Sizeof(s.shards)},
		{"listeners", unsafe.Offsetof(s.listeners), unsafe.Sizeof(s.listeners)},
	}}, fields{"written by every insert", []field{
		{"mu", unsafe.Offsetof(s.mu), unsafe.Sizeof(s.mu)},
		{"all", unsafe.Offsetof(s.all), unsafe.Sizeof(s.all)},
		{"byUser", unsafe.Offsetof(s.byUser), unsafe.Sizeof(s.byUser)},
	}})

	var r runners
	assertApart(t, "runners", fields{"read by every submission", []field{
		{"work", unsafe.Offsetof(r.work), unsafe.Sizeof(r.work)},
	}}, fields{"written by the runners as they park", []field{
		{"mu", unsafe.Offsetof(r.mu), unsafe.Sizeof(r.mu)},
		{"idle", unsafe.Offsetof(r.idle), unsafe.Sizeof(r.idle)},
	}})

	var q queue
	assertApart(t, "queue", fields{"read by the runs", []field{
		{"opts", unsafe.Offsetof(q.opts), unsafe.Sizeof(q.opts)},
	}}, fields{"written by every submission", []field{
		{"mu", unsafe.Offsetof(q.mu), unsafe.Sizeof(q.mu)},
		{"items", unsafe.Offsetof(q.items), unsafe.Sizeof(q.items)},
	}})
}
