package storetest_test

import (
	"errors"
	"maps"
	"os"
	"os/exec"
	"slices"
	"strings"
	"testing"

	"go.uber.org/goleak"

	"github.com/taskgate/workers"
	"github.com/taskgate/workers/storetest"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func newMemStore(*testing.T) workers.Store { return workers.NewMemStore() }

func TestMemStore(t *testing.T) {
	t.Run("Parallel", func(t *testing.T) { storetest.Run(t, newMemStore) })
	t.Run("Serial", func(t *testing.T) { storetest.Run(t, newMemStore, storetest.Serial()) })
}

func TestMemStoreRuntime(t *testing.T) {
	t.Run("Parallel", func(t *testing.T) { storetest.RunRuntime(t, newMemStore) })
	t.Run("Serial", func(t *testing.T) { storetest.RunRuntime(t, newMemStore, storetest.Serial()) })
}

// brokenEnv names the broken store TestHelperBroken runs the suite
// against.
const brokenEnv = "STORETEST_BROKEN_STORE"

// TestHelperBroken runs the suite the entry in brokenStores names (Run or
// RunRuntime) against the broken store brokenEnv names. It runs only as
// TestSuiteBites' child process, where its failure is the expected
// outcome.
func TestHelperBroken(t *testing.T) {
	name := os.Getenv(brokenEnv)
	if name == "" {
		t.Skip("runs only as a child of TestSuiteBites")
	}
	b, ok := brokenStores[name]
	if !ok {
		t.Fatalf("no broken store named %q", name)
	}
	b.suite(t, func(*testing.T) workers.Store { return b.newStore() }, b.opts...)
}

// TestSuiteBites runs the suite against each broken store in a child
// process, so that its failures do not fail this test, and checks that
// the suite failed the case that should catch the breakage.
func TestSuiteBites(t *testing.T) {
	for _, name := range slices.Sorted(maps.Keys(brokenStores)) {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			cmd := exec.CommandContext(t.Context(), os.Args[0], "-test.run=^TestHelperBroken$", "-test.timeout=2m")
			cmd.Env = append(os.Environ(), brokenEnv+"="+name)
			out, err := cmd.CombinedOutput()
			if exit := (*exec.ExitError)(nil); !errors.As(err, &exit) {
				t.Fatalf("the suite against %s: want a failing exit status, got %v\n%s", name, err, out)
			}
			want := "--- FAIL: TestHelperBroken/" + brokenStores[name].fails + " ("
			if !strings.Contains(string(out), want) {
				t.Errorf("the suite against %s did not fail %s; output:\n%s", name, brokenStores[name].fails, out)
			}
		})
	}
}
