package main

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// TestPhaseOne is phase one's process when TestDurable re-executes the
// test binary; run on its own, it does nothing.
func TestPhaseOne(t *testing.T) {
	if os.Getenv(phaseEnv) != "1" {
		return
	}
	if err := phaseOne(context.Background(), os.Stdout, os.Stdin, os.Getenv(dbEnv)); err != nil {
		t.Fatal(err)
	}
}

func TestDurable(t *testing.T) {
	path := filepath.Join(t.TempDir(), "tasks.db")
	var out bytes.Buffer
	if err := run(t.Context(), &out, path, []string{os.Args[0], "-test.run=^TestPhaseOne$"}); err != nil {
		t.Fatalf("run: %v\noutput:\n%s", err, out.String())
	}
	got := out.String()
	t.Logf("output:\n%s", got)
	for _, want := range []string{
		// Phase one, live, just before the kill.
		`alice::invoice-batch   completed 100%  result {"invoices":42}`,
		"alice::thumbnails      running    40%",
		"bob::csv-export        running    70%",
		"bob::archive           pending     0%  on queue exports",
		"the process was killed (signal: killed)",
		// The records as the crash left them.
		"alice::thumbnails      running    40%",
		"bob::csv-export        running    70%  on queue exports",
		// After recovery.
		"alice::thumbnails      failed     40%  Abandoned: its run is no longer alive",
		"bob::csv-export        failed     70%  Abandoned: its run is no longer alive",
		"bob::archive           failed      0%  Abandoned: its run is no longer alive",
		"3 records abandoned by the crash, 1 completed one intact",
		"bob lists 2 tasks; asking for alice::invoice-batch he is told: workers: task not found",
		"alice submits thumbnails again: joined false, new run true",
		`alice::thumbnails      completed 100%  result {"thumbnails":120}`,
		"shut down cleanly",
	} {
		if !strings.Contains(got, want) {
			t.Errorf("the output lacks %q", want)
		}
	}
	if n := strings.Count(got, `result {"invoices":42}`); n != 3 {
		t.Errorf("the completed task's result appears %d times, want 3 (live, stored, recovered)", n)
	}
}
