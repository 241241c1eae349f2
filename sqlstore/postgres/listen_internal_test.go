package postgres

import (
	"testing"

	"github.com/taskgate/workers"
)

// TestDecodeNotice: the trigger's payloads become Changes; an empty one
// (what the trigger sends when the payload would pass NOTIFY's limit)
// and one that cannot be read become a Resync.
func TestDecodeNotice(t *testing.T) {
	for payload, want := range map[string]workers.Change{
		`{"id" : "a::k", "run" : "i.1", "status" : "running"}`: {ID: "a::k", RunID: "i.1", Status: workers.StatusRunning},
		`{"id" : "a::k"}`: {ID: "a::k"},
		``:                {Resync: true},
		`{"run":"i.1"}`:   {Resync: true},
		`not json`:        {Resync: true},
	} {
		if got := decodeNotice(payload); got != want {
			t.Errorf("decodeNotice(%q) = %+v, want %+v", payload, got, want)
		}
	}
}
