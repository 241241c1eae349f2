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
	// Each section of the output is checked on its own: the same line in
	// another one proves nothing of it.
	sections := []struct {
		name, from, to string
		want           []string
	}{
		{"phase one, live, just before the kill", "phase 1: a process", "the process was killed (signal: killed)", []string{
			`alice::invoice-batch   completed 100%  result {"invoices":42}`,
			"alice::thumbnails      running    40%\n",
			"bob::csv-export        running    70%  on queue exports",
			"bob::archive           pending     0%  on queue exports",
		}},
		{"the records as the crash left them", "before recovery the records say", "no process is left", []string{
			`alice::invoice-batch   completed 100%  result {"invoices":42}`,
			"alice::thumbnails      running    40%\n",
			"bob::csv-export        running    70%  on queue exports",
			"bob::archive           pending     0%  on queue exports",
		}},
		{"after recovery", "the recovery loop ended its runs", "3 records abandoned by the crash, 1 completed one intact", []string{
			`alice::invoice-batch   completed 100%  result {"invoices":42}`,
			"alice::thumbnails      failed     40%  Abandoned: its run is no longer alive",
			"bob::csv-export        failed     70%  Abandoned: its run is no longer alive",
			"bob::archive           failed      0%  Abandoned: its run is no longer alive",
		}},
		{"after the restart", "", "shut down cleanly", []string{
			"bob lists 2 tasks; asking for alice::invoice-batch he is told: workers: task not found",
			"alice submits thumbnails again: joined false, new run true",
			`alice::thumbnails      completed 100%  result {"thumbnails":120}`,
		}},
	}
	rest := got
	for _, sec := range sections {
		_, after, ok := strings.Cut(rest, sec.from)
		body, tail, ok2 := strings.Cut(after, sec.to)
		if !ok || !ok2 {
			t.Errorf("%s: no section from %q to %q", sec.name, sec.from, sec.to)
			continue
		}
		for _, want := range sec.want {
			if !strings.Contains(body, want) {
				t.Errorf("%s: the section lacks %q", sec.name, want)
			}
		}
		rest = tail
	}
	if n := strings.Count(got, `result {"invoices":42}`); n != 3 {
		t.Errorf("the completed task's result appears %d times, want 3 (live, stored, recovered)", n)
	}
}
