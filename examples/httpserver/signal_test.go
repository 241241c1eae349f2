//go:build unix

package main

import (
	"bufio"
	"net/http"
	"os"
	"os/exec"
	"os/signal"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// A second SIGINT while the shutdown drains ends the process at once, as
// a user pressing Ctrl-C again expects: the drain would otherwise wait
// for the running task until the grace point of its two-minute bound.
func TestSecondSignalQuitsAtOnce(t *testing.T) {
	// The command inherits the signals this process ignores, as a
	// background job of a shell without job control does SIGINT: the
	// first one reaches the command all the same (signal.Notify takes
	// it), but the second stays ignored. SIGTERM stands in for it then.
	sig := syscall.SIGINT
	if signal.Ignored(sig) {
		sig = syscall.SIGTERM
	}
	if signal.Ignored(sig) {
		t.Skip("SIGINT and SIGTERM are ignored: the second would not end the command")
	}
	cmd := exec.Command(os.Args[0], "-addr=127.0.0.1:0", "-drain=2m")
	cmd.Env = append(os.Environ(), runMain+"=1")
	stderr, err := cmd.StderrPipe()
	require.NoError(t, err)
	require.NoError(t, cmd.Start())
	// The process is killed if it is still there after 20 s, which
	// fails the test (the drain alone would take 90 s), or once the test
	// ends.
	kill := time.AfterFunc(20*time.Second, func() { cmd.Process.Kill() })
	t.Cleanup(func() {
		kill.Stop()
		if cmd.ProcessState == nil {
			cmd.Process.Kill()
			cmd.Wait()
		}
	})
	lines := bufio.NewScanner(stderr)
	await := func(prefix string) string {
		t.Helper()
		for lines.Scan() {
			if _, rest, ok := strings.Cut(lines.Text(), prefix); ok {
				return rest
			}
		}
		t.Fatalf("the command ended without logging %q", prefix)
		return ""
	}

	c := client{t, "http://" + await("listening on ")}
	require.Equal(t, http.StatusAccepted, c.do("POST", "/tasks?key=long&steps=1000", "alice", nil))
	http.DefaultClient.CloseIdleConnections()
	require.NoError(t, cmd.Process.Signal(sig))
	await("shutting down")
	require.NoError(t, cmd.Process.Signal(sig))
	for lines.Scan() { // the rest of the log, until the process ends
	}
	err = cmd.Wait()
	var exit *exec.ExitError
	require.ErrorAs(t, err, &exit)
	ws := exit.Sys().(syscall.WaitStatus)
	if !ws.Signaled() || ws.Signal() != sig {
		t.Fatalf("after a second %v during the drain the command ended with %v, not by the signal", sig, err)
	}
}
