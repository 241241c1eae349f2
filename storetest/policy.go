package storetest

import (
	"context"
	"slices"
	"testing"

	"github.com/taskgate/workers"
)

// onlyQueue returns a queue authorizer that admits user to queue and
// nobody else anywhere.
func onlyQueue(queue, user string) workers.QueueAuthorizer {
	return func(q, u string) bool { return q == queue && u == user }
}

// onlyJoin returns a watch authorizer that lets user join a task listing
// watcher, and nothing else.
func onlyJoin(watcher, user string) workers.WatchAuthorizer {
	return func(_ string, watchers []string, u string) bool {
		return u == user && slices.Contains(watchers, watcher)
	}
}

// wantQueueAuth fails t unless the store's queue authorizer admits
// exactly user to queue among the pairs it is asked about.
func wantQueueAuth(t *testing.T, s workers.Store, queue, user string) {
	t.Helper()
	f := s.QueueAuthorizer()
	if f == nil {
		t.Fatal("QueueAuthorizer() = nil after SetQueueAuthorizer")
	}
	for _, q := range []string{queue, "other"} {
		for _, u := range []string{user, "mallory"} {
			if got, want := f(q, u), q == queue && u == user; got != want {
				t.Errorf("stored queue authorizer(%q, %q) = %v, want %v", q, u, got, want)
			}
		}
	}
}

// wantWatchAuth fails t unless the store's watch authorizer lets exactly
// user join a task listing watcher among the cases it is asked about.
func wantWatchAuth(t *testing.T, s workers.Store, watcher, user string) {
	t.Helper()
	f := s.WatchAuthorizer()
	if f == nil {
		t.Fatal("WatchAuthorizer() = nil after SetWatchAuthorizer")
	}
	for _, w := range []string{watcher, "other"} {
		for _, u := range []string{user, "mallory"} {
			if got, want := f("nightly", []string{w}, u), w == watcher && u == user; got != want {
				t.Errorf("stored watch authorizer(nightly, [%q], %q) = %v, want %v", w, u, got, want)
			}
		}
	}
}

func (*suite) authUnset(t *testing.T, s workers.Store) {
	if s.QueueAuthorizer() != nil {
		t.Error("a new store's QueueAuthorizer() is not nil")
	}
	if s.WatchAuthorizer() != nil {
		t.Error("a new store's WatchAuthorizer() is not nil")
	}
}

func (*suite) authSetGet(t *testing.T, s workers.Store) {
	s.SetQueueAuthorizer(onlyQueue("reports", "alice"))
	wantQueueAuth(t, s, "reports", "alice")
	if s.WatchAuthorizer() != nil {
		t.Error("SetQueueAuthorizer set the watch authorizer too")
	}
	s.SetWatchAuthorizer(onlyJoin("bob", "carol"))
	wantWatchAuth(t, s, "bob", "carol")
	wantQueueAuth(t, s, "reports", "alice")
}

func (*suite) authReplace(t *testing.T, s workers.Store) {
	s.SetQueueAuthorizer(onlyQueue("reports", "alice"))
	s.SetWatchAuthorizer(onlyJoin("bob", "carol"))
	s.SetQueueAuthorizer(onlyQueue("exports", "dave"))
	s.SetWatchAuthorizer(onlyJoin("erin", "frank"))
	wantQueueAuth(t, s, "exports", "dave")
	wantWatchAuth(t, s, "erin", "frank")
}

func (*suite) authClear(t *testing.T, s workers.Store) {
	s.SetQueueAuthorizer(onlyQueue("reports", "alice"))
	s.SetWatchAuthorizer(onlyJoin("bob", "carol"))
	s.SetQueueAuthorizer(nil)
	s.SetWatchAuthorizer(nil)
	if s.QueueAuthorizer() != nil {
		t.Error("QueueAuthorizer() is not nil after SetQueueAuthorizer(nil)")
	}
	if s.WatchAuthorizer() != nil {
		t.Error("WatchAuthorizer() is not nil after SetWatchAuthorizer(nil)")
	}
}

func (*suite) authNotCalled(t *testing.T, s workers.Store) {
	s.SetQueueAuthorizer(func(string, string) bool { panic("queue authorizer called by the store") })
	s.SetWatchAuthorizer(func(string, []string, string) bool { panic("watch authorizer called by the store") })
	if s.QueueAuthorizer() == nil || s.WatchAuthorizer() == nil {
		t.Error("a stored panicking authorizer came back nil")
	}
}

func (su *suite) authRace(t *testing.T, s workers.Store) {
	su.within(t, func(context.Context) {
		race(racers, func(i int) {
			user := []string{"alice", "bob"}[i%2]
			s.SetQueueAuthorizer(onlyQueue("reports", user))
			s.SetWatchAuthorizer(onlyJoin("bob", user))
			q, w := s.QueueAuthorizer(), s.WatchAuthorizer()
			if q == nil || w == nil {
				t.Error("an authorizer came back nil while others were being set")
				return
			}
			// Another racer may have replaced them; any stored one answers.
			if !q("reports", "alice") && !q("reports", "bob") {
				t.Error("the queue authorizer fetched admits neither racer's user")
			}
			if !w("nightly", []string{"bob"}, "alice") && !w("nightly", []string{"bob"}, "bob") {
				t.Error("the watch authorizer fetched admits neither racer's user")
			}
		})
	})
}

func (*suite) clearEmpties(t *testing.T, s workers.Store) {
	c, ok := s.(workers.RecordClearer)
	if !ok {
		t.Log("the store does not implement workers.RecordClearer; nothing to check")
		return
	}
	done := record("bob::b", "run-1", "bob")
	done.State = outcome(workers.StatusCompleted, 1)
	insert(t, s, record("alice::a", "run-1", "alice"), done, record("nightly", "run-1"))
	if err := c.ClearRecords(t.Context()); err != nil {
		t.Fatalf("ClearRecords: %v", err)
	}
	if got := list(t, s, workers.Filter{}); len(got) != 0 {
		t.Errorf("ListTasks after ClearRecords returned %q", ids(got))
	}
	wantMissing(t, s, "alice::a")
}

func (su *suite) clearDurable(t *testing.T, s workers.Store) {
	if !su.durable {
		t.Skip("the store is not declared Durable")
	}
	if _, ok := s.(workers.RecordClearer); ok {
		t.Errorf("%T is declared Durable but implements workers.RecordClearer: Runtime.Reset would delete its records", s)
	}
}
