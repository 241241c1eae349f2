package workers

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// Many owners and System submit at once under Limits, to shared and
// own queues and for slots, with keys that repeat (joins and re-runs),
// timeouts, cancels, callbacks that fail, panic or ignore their context,
// and an OwnerLimits hook whose answers change, fail and panic: once
// every run has ended, or Shutdown has returned in the middle of it all,
// every count of admission is back to zero, no ticket is left, and no
// record is left PENDING or RUNNING.
func TestAdmissionCountsDrainUnderRandomLoad(t *testing.T) {
	for seed := range uint64(4) {
		t.Run(strconv.FormatUint(seed, 10), func(t *testing.T) { admissionUnderRandomLoad(t, seed, false) })
		t.Run("Shutdown"+strconv.FormatUint(seed, 10), func(t *testing.T) { admissionUnderRandomLoad(t, seed, true) })
	}
}

func admissionUnderRandomLoad(t *testing.T, seed uint64, shut bool) {
	var hookMu sync.Mutex
	hookRng := rand.New(rand.NewPCG(seed, 99))
	hook := func(_ context.Context, o Owner) (OwnerLimits, error) {
		hookMu.Lock()
		defer hookMu.Unlock()
		switch hookRng.IntN(40) {
		case 0:
			return OwnerLimits{}, errors.New("plans unavailable")
		case 1:
			panic("plans bug")
		}
		return OwnerLimits{Running: hookRng.IntN(4), Waiting: hookRng.IntN(30), Weight: hookRng.IntN(4)}, nil
	}
	rt := NewRuntime(NewMemStore(), Config{Logger: slog.New(slog.DiscardHandler),
		Limits: Limits{MaxRunning: 3, MaxWaiting: 150, QueueConcurrency: 1 + int(seed%2), OwnerLimits: hook}})
	release := make(chan struct{})
	const owners, each = 8, 200
	auths := []TaskAuthority{System}
	for i := range owners {
		auths = append(auths, MustOwner(fmt.Sprint("o", i)))
	}
	var submitted atomic.Int64
	halfway := make(chan struct{})
	var wg sync.WaitGroup
	for i, auth := range auths {
		wg.Go(func() {
			rng := rand.New(rand.NewPCG(seed, uint64(i)))
			var ids []string
			for n := range each {
				if submitted.Add(1) == int64(len(auths)*each/2) {
					close(halfway)
				}
				queue := ""
				switch rng.IntN(4) {
				case 0:
					queue = "shared"
				case 1:
					queue = fmt.Sprint("own-", i)
				}
				var opts []SubmitOption
				if rng.IntN(5) == 0 {
					opts = append(opts, WithTimeout(time.Duration(1+rng.IntN(3))*time.Millisecond))
				}
				behaviour := rng.IntN(6)
				fn := func(ctx context.Context, _ *Task) (any, error) {
					switch behaviour {
					case 0:
						panic("callback bug")
					case 1:
						return nil, errors.New("failed")
					case 2: // heeds its context
						select {
						case <-ctx.Done():
							return nil, ctx.Err()
						case <-release:
							return nil, nil
						}
					case 3: // ignores it
						<-release
						return nil, nil
					}
					return n, nil
				}
				sub, err := submitOn(rt, queue, strconv.Itoa(rng.IntN(40)), fn, auth, opts...)
				switch {
				case errors.Is(err, ErrClosed) && shut:
					return
				case errors.Is(err, ErrQuotaExceeded), err != nil && strings.Contains(err.Error(), "owner limits of"):
					continue // refused, or the hook failed or panicked
				case err != nil:
					t.Error(err)
					return
				}
				ids = append(ids, sub.ID)
				if rng.IntN(3) == 0 {
					err := rt.Cancel(ctx, ids[rng.IntN(len(ids))], auth)
					if err != nil && !errors.Is(err, ErrFinished) && !errors.Is(err, ErrNotFound) && !(shut && errors.Is(err, ErrClosed)) {
						t.Error(err)
					}
				}
			}
		})
	}
	if shut {
		<-halfway
		close(release)
		sctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		defer cancel()
		require.NoError(t, rt.Shutdown(sctx))
		wg.Wait()
	} else {
		wg.Wait()
		close(release)
		eventually(t, func() bool {
			st, err := rt.Stats(ctx, System)
			require.NoError(t, err)
			return st.Running+st.Waiting == 0
		}, "the counts to drain")
		snaps, err := rt.List(ctx, System, WithStatus(StatusPending, StatusRunning))
		require.NoError(t, err)
		assert.Empty(t, snaps, "runs left unended")
		defer func() {
			sctx, cancel := context.WithTimeout(ctx, 10*time.Second)
			defer cancel()
			require.NoError(t, rt.Shutdown(sctx))
		}()
	}
	a := rt.adm
	a.mu.Lock()
	defer a.mu.Unlock()
	assert.Zero(t, a.running)
	assert.Zero(t, a.waiting)
	for _, o := range append([]*ownerLoad{&a.system}, mapValues(a.owners)...) {
		assert.Zero(t, o.running, o.id)
		assert.Zero(t, o.waiting, o.id)
		assert.Zero(t, o.queued, o.id)
		assert.Empty(t, o.fifo, o.id)
		assert.False(t, o.inRing, o.id)
	}
	assert.Nil(t, a.ring)
}

func mapValues[K comparable, V any](m map[K]V) []V {
	vs := make([]V, 0, len(m))
	for _, v := range m {
		vs = append(vs, v)
	}
	return vs
}
