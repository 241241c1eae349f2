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

// assertApart checks that every field in writes starts at least a cache
// line after the end of every field in reads, so that none of them can
// share a line (see cacheLinePad).
func assertApart(t *testing.T, what string, reads, writes []field) {
	t.Helper()
	for _, r := range reads {
		for _, w := range writes {
			assert.GreaterOrEqual(t, w.off, r.off+r.bytes+64,
				"%s: %s, written by every submission, is within a cache line of %s, read by the runs", what, w.name, r.name)
		}
	}
}

func TestSubmissionWritesKeepOffTheLinesRunsRead(t *testing.T) {
	var rt Runtime[*MemStore]
	assertApart(t, "Runtime", []field{
		{"store", unsafe.Offsetof(rt.store), unsafe.Sizeof(rt.store)},
		{"cfg", unsafe.Offsetof(rt.cfg), unsafe.Sizeof(rt.cfg)},
		{"life", unsafe.Offsetof(rt.life), unsafe.Sizeof(rt.life)},
		{"runners", unsafe.Offsetof(rt.runners), unsafe.Sizeof(rt.runners)},
		{"bells", unsafe.Offsetof(rt.bells), unsafe.Sizeof(rt.bells)},
		{"hub", unsafe.Offsetof(rt.hub), unsafe.Sizeof(rt.hub)},
		{"noOpts", unsafe.Offsetof(rt.noOpts), unsafe.Sizeof(rt.noOpts)},
		{"runs", unsafe.Offsetof(rt.runs), unsafe.Sizeof(rt.runs)},
	}, []field{
		{"runSeq", unsafe.Offsetof(rt.runSeq), unsafe.Sizeof(rt.runSeq)},
		{"gate", unsafe.Offsetof(rt.gate), unsafe.Sizeof(rt.gate)},
		{"mu", unsafe.Offsetof(rt.mu), unsafe.Sizeof(rt.mu)},
	})

	var s MemStore
	assertApart(t, "MemStore", []field{
		{"seed", unsafe.Offsetof(s.seed), unsafe.Sizeof(s.seed)},
		{"shards", unsafe.Offsetof(s.shards), unsafe.Sizeof(s.shards)},
		{"listeners", unsafe.Offsetof(s.listeners), unsafe.Sizeof(s.listeners)},
	}, []field{
		{"mu", unsafe.Offsetof(s.mu), unsafe.Sizeof(s.mu)},
		{"all", unsafe.Offsetof(s.all), unsafe.Sizeof(s.all)},
		{"byUser", unsafe.Offsetof(s.byUser), unsafe.Sizeof(s.byUser)},
	})

	var r runners
	assertApart(t, "runners", []field{
		{"work", unsafe.Offsetof(r.work), unsafe.Sizeof(r.work)},
	}, []field{
		{"mu", unsafe.Offsetof(r.mu), unsafe.Sizeof(r.mu)},
		{"idle", unsafe.Offsetof(r.idle), unsafe.Sizeof(r.idle)},
	})

	var q queue
	assertApart(t, "queue", []field{
		{"opts", unsafe.Offsetof(q.opts), unsafe.Sizeof(q.opts)},
	}, []field{
		{"mu", unsafe.Offsetof(q.mu), unsafe.Sizeof(q.mu)},
		{"items", unsafe.Offsetof(q.items), unsafe.Sizeof(q.items)},
	})
}
