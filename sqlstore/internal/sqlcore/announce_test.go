package sqlcore

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"slices"
	"strconv"
	"sync"
	"testing"
	"testing/synctest"
	"time"
)

// sender is an announcer's send for tests: it records each statement's
// payloads, waits at the gate for the calls that have one, and answers
// with the error the test set.
type sender struct {
	mu    sync.Mutex
	sent  [][]string
	at    []time.Time
	gates []chan struct{} // the i-th call waits on gates[i], where set
	fail  []error         // the i-th call's answer, where set
	held  [][]string      // the i-th call's rows held, where set
}

func (s *sender) send(ctx context.Context, payloads []string) ([]string, error) {
	s.mu.Lock()
	i := len(s.sent)
	s.sent = append(s.sent, slices.Clone(payloads))
	s.at = append(s.at, time.Now())
	var gate chan struct{}
	if i < len(s.gates) {
		gate = s.gates[i]
	}
	var err error
	if i < len(s.fail) {
		err = s.fail[i]
	}
	var held []string
	if i < len(s.held) {
		held = s.held[i]
	}
	s.mu.Unlock()
	if gate != nil {
		select {
		case <-gate:
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
	return held, err
}

func (s *sender) calls() [][]string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Clone(s.sent)
}

// inFlight returns an announcer whose first statement, of "a", is in
// flight, held until the returned gate closes; it fails with fail's
// errors, one per statement. Call it inside a synctest bubble.
func inFlight(fail ...error) (*sender, *announcer, chan struct{}) {
	gate := make(chan struct{})
	s := &sender{gates: []chan struct{}{gate}, fail: fail}
	a := newAnnouncer(s.send, slog.New(slog.DiscardHandler))
	a.add([]string{"a"})
	synctest.Wait()
	return s, a, gate
}

func ids(prefix string, n int) []string {
	out := make([]string, n)
	for i := range out {
		out[i] = prefix + strconv.Itoa(i)
	}
	return out
}

// Notices added while a statement is in flight go together in the next,
// at most announceMax to a statement, in the order they came.
func TestAnnouncerGathersNoticesBehindAStatementInFlight(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s, a, gate := inFlight()
		defer a.stop()
		a.add([]string{"b", "c"})
		many := ids("m", announceMax)
		a.add(many)
		close(gate)
		synctest.Wait()
		want := [][]string{{"a"}, append([]string{"b", "c"}, many[:announceMax-2]...), many[announceMax-2:]}
		if got := s.calls(); !slices.EqualFunc(got, want, slices.Equal) {
			t.Errorf("statements of %d, want 1, %d and 2 notices in order", lens(got), announceMax)
		}
	})
}

func lens(b [][]string) []int {
	n := make([]int, len(b))
	for i, p := range b {
		n[i] = len(p)
	}
	return n
}

// A statement that fails is tried again after a backoff, with the
// notices queued since behind its own; the backoff grows while the
// failures go on.
func TestAnnouncerTriesAFailedStatementAgain(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		down := errors.New("down")
		s, a, gate := inFlight(down, down)
		defer a.stop()
		a.add([]string{"b"})
		close(gate) // the first statement fails
		synctest.Wait()
		if !a.failing.Load() {
			t.Error("not failing after a statement failed")
		}
		time.Sleep(time.Second)
		synctest.Wait()
		if a.failing.Load() {
			t.Error("still failing after a statement went")
		}
		want := [][]string{{"a"}, {"a", "b"}, {"a", "b"}}
		if got := s.calls(); !slices.EqualFunc(got, want, slices.Equal) {
			t.Fatalf("statements %q, want %q", got, want)
		}
		first, second := s.at[1].Sub(s.at[0]), s.at[2].Sub(s.at[1])
		if first <= 0 || second <= first {
			t.Errorf("backoffs %v then %v, want a growing wait", first, second)
		}
	})
}

// More notices waiting than maxAnnounced give way to one empty notice,
// which listeners take as "re-read everything"; notices added once it
// has gone are sent as they come.
func TestAnnouncerOverflowSendsOneEmptyNotice(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s, a, gate := inFlight()
		defer a.stop()
		a.add(ids("m", maxAnnounced))
		a.add([]string{"over"})
		a.add([]string{"covered"})
		close(gate)
		synctest.Wait()
		a.add([]string{"after"})
		synctest.Wait()
		want := [][]string{{"a"}, {""}, {"after"}}
		if got := s.calls(); !slices.EqualFunc(got, want, slices.Equal) {
			t.Errorf("statements of %v notices, want %q", lens(got), want)
		}
	})
}

// The notices of rows a statement found held are tried again after a
// backoff, alone, or at once with notices added meanwhile, which the held
// rows never hold back.
func TestAnnouncerTriesHeldRowsAgain(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s := &sender{}
		for range 50 {
			s.held = append(s.held, []string{"h"}) // held throughout
		}
		a := newAnnouncer(s.send, slog.New(slog.DiscardHandler))
		defer a.stop()
		a.add([]string{"a", "h"})
		synctest.Wait() // "h" held; the backoff after it may be cut short by the add that started the loop
		time.Sleep(time.Second)
		synctest.Wait()
		n := len(s.calls())
		if n < 2 {
			t.Fatalf("statements %q, want the held row tried again", s.calls())
		}
		start := time.Now()
		a.add([]string{"b"})
		synctest.Wait()
		if d := time.Since(start); d != 0 {
			t.Errorf("a notice added while a row is held waited %v", d)
		}
		got := s.calls()
		if len(got) != n+1 || !slices.Equal(got[n], []string{"h", "b"}) {
			t.Errorf("statements %q, want one more, of the held row and the new one", got)
		}
		for _, c := range got {
			if slices.Contains(c, "a") && !slices.Equal(c, []string{"a", "h"}) {
				t.Errorf("statements %q: the notice sent went again", got)
			}
		}
	})
}

// stop sends what is queued and waits for it; a statement that fails
// then is tried once more and dropped, one that hangs is cut off after
// announceStopped, and notices added after stop are dropped.
func TestAnnouncerStop(t *testing.T) {
	t.Run("SendsWhatIsQueued", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			s, a, gate := inFlight()
			a.add([]string{"b"})
			go func() {
				time.Sleep(100 * time.Millisecond)
				close(gate)
			}()
			a.stop()
			a.add([]string{"dropped"})
			synctest.Wait()
			want := [][]string{{"a"}, {"b"}}
			if got := s.calls(); !slices.EqualFunc(got, want, slices.Equal) {
				t.Errorf("statements %q, want %q", got, want)
			}
		})
	})
	t.Run("TriesAFailedStatementOnceMore", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			down := errors.New("down")
			s, a, gate := inFlight(down, down)
			stopped := make(chan time.Duration)
			go func() {
				start := time.Now()
				a.stop()
				stopped <- time.Since(start)
			}()
			synctest.Wait()
			close(gate) // it fails; its backoff ends at once, and so does the next try
			if d := <-stopped; d != 0 {
				t.Errorf("stop took %v, want no wait beyond the tries", d)
			}
			if got := s.calls(); len(got) != 2 {
				t.Errorf("statements %q, want the one that failed and one more try", got)
			}
		})
	})
	t.Run("CutsOffAHungStatement", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			_, a, _ := inFlight()
			start := time.Now()
			a.stop()
			if d := time.Since(start); d != announceStopped {
				t.Errorf("stop returned after %v, want %v", d, announceStopped)
			}
		})
	})
}

// The rows announced after an InsertMany statement are those it
// inserted; after a failure that leaves its commit unknown, every row of
// the batch, since each may be in; after one that landed nothing, none.
func TestAnnouncedRows(t *testing.T) {
	batch := []*call[groupWrite]{{key: "a", ok: true}, {key: "b"}, {key: "c", ok: true}}
	for end, want := range map[groupEnd][]string{groupWrote: {"a", "c"}, groupUnsure: {"a", "b", "c"}, groupNone: nil} {
		if got := announced(batch, end); !slices.Equal(got, want) {
			t.Errorf("announced after %d = %q, want %q", end, got, want)
		}
	}
}

// An outage of the announcements is logged once as it begins, at warn
// level, and once as it ends, at info level, however many statements
// fail in between; a second outage is logged again.
func TestAnAnnouncementOutageIsLoggedOnceEachWay(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var buf bytes.Buffer
		log := slog.New(slog.NewTextHandler(&buf, &slog.HandlerOptions{
			ReplaceAttr: func(_ []string, a slog.Attr) slog.Attr {
				if a.Key == slog.TimeKey {
					return slog.Attr{}
				}
				return a
			},
		}))
		lost := errors.New("connection lost")
		s := &sender{fail: []error{lost, lost, lost, nil, lost}}
		a := newAnnouncer(s.send, log)
		a.add([]string{"a"}) // three failures, then sent
		time.Sleep(time.Second)
		a.add([]string{"b"}) // one failure, then sent
		time.Sleep(time.Second)
		a.stop()
		if n := len(s.calls()); n != 6 {
			t.Fatalf("%d statements, want 6", n)
		}
		warn := `level=WARN msg="sqlstore: new tasks cannot be announced; each insert notifies from its own transaction meanwhile" err="connection lost"` + "\n"
		want := warn + `level=INFO msg="sqlstore: new tasks are announced again" "failed statements"=3` + "\n" +
			warn + `level=INFO msg="sqlstore: new tasks are announced again" "failed statements"=1` + "\n"
		if got := buf.String(); got != want {
			t.Errorf("logged:\n%s\nwant:\n%s", got, want)
		}
	})
}
