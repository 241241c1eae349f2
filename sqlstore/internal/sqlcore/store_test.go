package sqlcore

import (
	"slices"
	"testing"

	"github.com/taskgate/workers"
)

// TestKnownStatusesDropsUnknownOnes: a fence keeps the known statuses of
// from, in order, and drops the others, those that hold a comma
// included; a from of known statuses only is kept as it is, without an
// allocation.
func TestKnownStatusesDropsUnknownOnes(t *testing.T) {
	const (
		pending   = workers.StatusPending
		running   = workers.StatusRunning
		completed = workers.StatusCompleted
		failed    = workers.StatusFailed
	)
	for _, c := range []struct{ from, want []workers.Status }{
		{nil, nil},
		{[]workers.Status{pending}, []workers.Status{pending}},
		{[]workers.Status{pending, running}, []workers.Status{pending, running}},
		{[]workers.Status{"completed,failed"}, nil},
		{[]workers.Status{"bogus", running, "", completed, "pending,running", failed}, []workers.Status{running, completed, failed}},
		{[]workers.Status{running, "Running"}, []workers.Status{running}},
	} {
		if got := knownStatuses(slices.Clone(c.from)); !slices.Equal(got, c.want) {
			t.Errorf("knownStatuses(%q) = %q, want %q", c.from, got, c.want)
		}
	}
	known := []workers.Status{pending, running, completed}
	if n := testing.AllocsPerRun(100, func() { known = knownStatuses(known) }); n != 0 {
		t.Errorf("knownStatuses of known statuses made %v allocations, want 0", n)
	}
}
