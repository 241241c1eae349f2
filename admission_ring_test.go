package workers

import (
	"context"
	"math/rand/v2"
	"slices"
	"strconv"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestAdmissionHoldsItsRulesThroughAnyOrderOfEvents drives the admission
// controller alone through random submissions, settles and cancels, with
// owners' running caps that the OwnerLimits hook changes as it goes, and
// checks after every step, against a model of what each owner has running
// and waiting:
//   - each owner's tasks start in submission order;
//   - once an owner may start a task, no other owner starts more than
//     its weight's worth of tasks before that owner's first (one round);
//   - no slot stays free while an owner under its own cap has a task
//     waiting, even between a submission's reservation and its enqueue
//     (a raised cap included);
//   - the ring holds exactly the owners that may start a task, linked
//     both ways;
//   - the counts are the model's, and withdrawn tickets never outnumber
//     the others by more than the sweep allows.
func TestAdmissionHoldsItsRulesThroughAnyOrderOfEvents(t *testing.T) {
	for seed := range uint64(40) {
		t.Run(strconv.FormatUint(seed, 10), func(t *testing.T) {
			rng := rand.New(rand.NewPCG(seed, 7))
			owners := []string{"a", "b", "c", "d", "e"}
			caps, weights := map[string]int{}, map[string]int{}
			for _, o := range owners {
				caps[o] = rng.IntN(3) // 0: no cap
				weights[o] = rng.IntN(3)
			}
			maxRunning := 1 + rng.IntN(4)
			var started []*admit
			a := newAdmission(Limits{MaxRunning: maxRunning, OwnerLimits: func(_ context.Context, o Owner) (OwnerLimits, error) {
				return OwnerLimits{Running: caps[o.ID()], Weight: weights[o.ID()]}, nil
			}}, func(t *Task) { started = append(started, t.adm) })

			waiting := map[string][]*admit{} // the model: each owner's, in order
			var running []*admit
			owned := func(r *admit) string { return r.load.id }
			// ahead counts, for each owner that may start a task, the
			// tasks each other owner started since it could.
			ahead := map[string]map[string]int{}
			startedNow := func() {
				for _, r := range started {
					o := owned(r)
					require.NotEmpty(t, waiting[o], "%s started a task it had not waiting", o)
					require.Same(t, waiting[o][0], r, "%s's tasks started out of submission order", o)
					waiting[o] = waiting[o][1:]
					running = append(running, r)
					delete(ahead, o)
					for x, n := range ahead {
						n[o]++
						require.LessOrEqual(t, n[o], max(1, weights[o]), "%s started more than a round's worth of tasks while %s could start one", o, x)
					}
				}
				started = started[:0]
			}
			mayStart := func(o string) bool {
				n := 0
				for _, r := range running {
					if owned(r) == o {
						n++
					}
				}
				return len(waiting[o]) > 0 && (caps[o] == 0 || n < caps[o])
			}
			noSlotIdle := func(step int) {
				a.mu.Lock()
				defer a.mu.Unlock()
				if a.ring != nil {
					require.GreaterOrEqual(t, a.running, maxRunning, "step %d: a slot is free while %s may start a task", step, a.ring.id)
				}
			}

			for step := range 2000 {
				switch op := rng.IntN(10); {
				case op < 5: // a submission, the owner's cap perhaps changed
					o := owners[rng.IntN(len(owners))]
					if rng.IntN(8) == 0 {
						caps[o] = rng.IntN(4)
					}
					r, err := a.reserve(ctx, caller{userID: o}, false)
					require.NoError(t, err)
					startedNow() // a raised cap starts waiting tasks at once
					noSlotIdle(step)
					switch {
					case r.slot == slotRunning:
						running = append(running, r)
					case r.waits:
						r.t = &Task{adm: r}
						waiting[o] = append(waiting[o], r)
						require.True(t, a.enqueue(r))
						startedNow()
					default:
						t.Fatalf("step %d: a task neither started nor waits", step)
					}
				case op < 8 && len(running) > 0: // a run settles
					i := rng.IntN(len(running))
					r := running[i]
					running = slices.Delete(running, i, i+1)
					a.release(r)
					startedNow()
				default: // a waiting task is cancelled, then settles
					var all []*admit
					for _, o := range owners {
						all = append(all, waiting[o]...)
					}
					if len(all) == 0 {
						continue
					}
					r := all[rng.IntN(len(all))]
					require.True(t, a.cancelWaiting(r), "a waiting task was not in its fifo")
					o := owned(r)
					waiting[o] = slices.DeleteFunc(waiting[o], func(x *admit) bool { return x == r })
					a.release(r)
					startedNow()
				}
				checkAdmission(t, a, step, owners, caps, maxRunning, waiting, running)
				for _, o := range owners {
					switch {
					case !mayStart(o):
						delete(ahead, o)
					case ahead[o] == nil:
						ahead[o] = map[string]int{}
					}
				}
			}
		})
	}
}

// checkAdmission checks the rules TestAdmissionHoldsItsRulesThroughAnyOrderOfEvents
// lists against the model.
func checkAdmission(t *testing.T, a *admission, step int, owners []string, caps map[string]int, maxRunning int, waiting map[string][]*admit, running []*admit) {
	t.Helper()
	a.mu.Lock()
	defer a.mu.Unlock()
	require.Equal(t, len(running), a.running, "step %d: running", step)
	total := 0
	for _, id := range owners {
		total += len(waiting[id])
	}
	require.Equal(t, total, a.waiting, "step %d: waiting", step)
	ringed := map[*ownerLoad]bool{}
	if a.ring != nil {
		o := a.ring
		for {
			require.True(t, o.inRing, "step %d: %s is linked but not marked", step, o.id)
			require.Same(t, o, o.next.prev, "step %d: %s's links disagree", step, o.id)
			require.False(t, ringed[o], "step %d: %s is in the ring twice", step, o.id)
			ringed[o] = true
			if o = o.next; o == a.ring {
				break
			}
		}
		require.GreaterOrEqual(t, a.running, maxRunning, "step %d: a slot is free while %s may start a task", step, a.ring.id)
	}
	for _, id := range owners {
		o := a.owners[id]
		if o == nil {
			require.Empty(t, waiting[id], "step %d: %s has waiting tasks and no entry", step, id)
			continue
		}
		n := 0
		for _, r := range running {
			if r.load == o {
				n++
			}
		}
		require.Equal(t, n, o.running, "step %d: %s's running", step, id)
		require.Equal(t, len(waiting[id]), o.waiting, "step %d: %s's waiting", step, id)
		require.Equal(t, len(waiting[id]), o.queued, "step %d: %s's tickets", step, id)
		live := []*admit{}
		for _, r := range o.fifo {
			if r.queued {
				live = append(live, r)
			}
		}
		require.Equal(t, append([]*admit{}, waiting[id]...), live, "step %d: %s's fifo", step, id)
		require.LessOrEqual(t, len(o.fifo)-o.queued, max(sweepAfter, o.queued)+1, "step %d: %s's fifo keeps too many withdrawn tickets", step, id)
		eligible := o.queued > 0 && (caps[id] == 0 || o.running < caps[id])
		require.Equal(t, eligible, ringed[o], "step %d: %s in the ring (cap %d, running %d, waiting %d)", step, id, caps[id], o.running, o.queued)
	}
}

// aliceBehindOneSlot returns an admission controller with one running
// slot, which alice's head holds, and n tasks of hers waiting behind it.
func aliceBehindOneSlot(t *testing.T, n int) (a *admission, head *admit, waiting []*admit) {
	t.Helper()
	a = newAdmission(Limits{MaxRunning: 1}, func(*Task) {})
	c := caller{userID: "alice"}
	head, err := a.reserve(ctx, c, false)
	require.NoError(t, err)
	for range n {
		r, err := a.reserve(ctx, c, false)
		require.NoError(t, err)
		r.t = &Task{adm: r}
		require.True(t, a.enqueue(r))
		waiting = append(waiting, r)
	}
	return a, head, waiting
}

// A storm of cancels of one owner's waiting tasks, in any order, leaves
// its fifo holding no more withdrawn tickets than the sweep allows, and
// the tasks left start in submission order.
func TestWithdrawnTicketsAreSweptFromTheFifo(t *testing.T) {
	a, head, tickets := aliceBehindOneSlot(t, 1000)
	rng := rand.New(rand.NewPCG(1, 2))
	order := rng.Perm(len(tickets))
	left := map[*admit]bool{}
	for _, i := range order[:900] {
		require.True(t, a.cancelWaiting(tickets[i]))
		o := tickets[i].load
		require.LessOrEqual(t, len(o.fifo)-o.queued, max(sweepAfter, o.queued)+1, "withdrawn tickets kept")
	}
	for _, i := range order[900:] {
		left[tickets[i]] = true
	}
	var want []*admit
	for _, r := range tickets {
		if left[r] {
			want = append(want, r)
		}
	}
	var got []*admit
	a.start = func(t *Task) { got = append(got, t.adm) }
	a.release(head)
	for len(got) < len(want) {
		n := len(got)
		a.release(got[n-1])
		require.Len(t, got, n+1, "a slot freed and no task started")
	}
	require.Equal(t, want, got, "the tasks left started out of order")
}

// Withdrawn tickets behind live ones are swept once the live ones ahead
// of them start, not only by a withdrawal.
func TestWithdrawnTicketsBehindStartedOnesAreSwept(t *testing.T) {
	a, head, tickets := aliceBehindOneSlot(t, 201)
	for _, r := range tickets[100:200] { // never more withdrawn than live: no sweep yet
		require.True(t, a.cancelWaiting(r))
	}
	var got []*admit
	a.start = func(t *Task) { got = append(got, t.adm) }
	a.release(head)
	for len(got) < 100 {
		a.release(got[len(got)-1])
	}
	o := a.owners["alice"]
	require.Equal(t, 1, o.queued)
	require.LessOrEqual(t, len(o.fifo)-o.queued, max(sweepAfter, o.queued)+1, "withdrawn tickets kept")
	a.release(got[len(got)-1])
	require.Same(t, tickets[200], got[len(got)-1])
}
