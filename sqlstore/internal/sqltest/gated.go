package sqltest

import (
	"context"
	"sync"
	"time"

	"github.com/taskgate/workers"
)

// gated wraps a Leaser store so that a scenario can stall its lease
// renewals. It hides the store's other capabilities; notifying adds the
// Notifier back.
type gated struct {
	workers.Store
	l workers.Leaser

	mu     sync.Mutex
	listen chan struct{} // closed: Listen may start; nil: no gate
	stall  chan struct{} // non-nil: renewals block until it closes
}

// leased returns a wrapper whose renewals can be stalled; it keeps s's
// Leaser and hides any Notifier of s.
func leased(s workers.Store) *gated {
	return &gated{Store: s, l: s.(workers.Leaser)}
}

// RenewLease implements workers.Leaser; while the wrapper is stalled it
// blocks until ctx ends or the stall is lifted.
func (g *gated) RenewLease(ctx context.Context, instance string, ttl time.Duration) (bool, error) {
	g.mu.Lock()
	stall := g.stall
	g.mu.Unlock()
	if stall != nil {
		select {
		case <-ctx.Done():
			return false, ctx.Err()
		case <-stall:
		}
	}
	return g.l.RenewLease(ctx, instance, ttl)
}

// ReleaseLease implements workers.Leaser.
func (g *gated) ReleaseLease(ctx context.Context, instance string) error {
	return g.l.ReleaseLease(ctx, instance)
}

// LiveInstances implements workers.Leaser.
func (g *gated) LiveInstances(ctx context.Context) ([]string, error) {
	return g.l.LiveInstances(ctx)
}

// stallRenewals makes every renewal block until resume is called.
func (g *gated) stallRenewals() (resume func()) {
	ch := make(chan struct{})
	g.mu.Lock()
	g.stall = ch
	g.mu.Unlock()
	return func() {
		g.mu.Lock()
		g.stall = nil
		g.mu.Unlock()
		close(ch)
	}
}

// notifying is gated with the inner store's Notifier, whose Listen waits
// until open is called.
type notifying struct {
	*gated
	n    workers.Notifier
	open chan struct{}
	once sync.Once
}

// gatedListen wraps s, a Leaser and Notifier, so that Listen starts
// listening only once openListen is called.
func gatedListen(s workers.Store) *notifying {
	return &notifying{gated: leased(s), n: s.(workers.Notifier), open: make(chan struct{})}
}

// Listen implements workers.Notifier, once the gate is open.
func (g *notifying) Listen(ctx context.Context, changed func(workers.Change)) error {
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-g.open:
	}
	return g.n.Listen(ctx, changed)
}

// openListen lets Listen start.
func (g *notifying) openListen() { g.once.Do(func() { close(g.open) }) }
