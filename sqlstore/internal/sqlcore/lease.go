package sqlcore

import (
	"context"
	"fmt"

	"time"

	"github.com/taskgate/workers"
)

// RenewLease implements workers.Leaser: one upsert whose expiry the
// database computes from its own clock. A renewal that created a lease
// (extended is false) also deletes the leases that have expired, which
// count as none: deleting them changes nothing, so a failure to (a lost
// connection, ctx ending while another process's prune holds their
// rows) leaves them for the next such renewal, and the renewal, which
// landed, is reported as it was.
func (s *Store) RenewLease(ctx context.Context, instance string, ttl time.Duration) (bool, error) {
	if ttl <= 0 {
		return false, fmt.Errorf("%w: lease ttl %v, want a positive duration", workers.ErrInvalidOption, ttl)
	}
	var extended bool
	if err := s.w.QueryRowContext(ctx, s.q.renewLease, instance, ttl.Microseconds()).Scan(&extended); err != nil {
		return false, s.wrap(ctx, "renew lease", err)
	}
	if !extended {
		if _, err := s.w.ExecContext(ctx, s.q.pruneLeases); err != nil {
			s.lost(err) // unreported, but for a lost connection
		}
	}
	return extended, nil
}

// ReleaseLease implements workers.Leaser: the lease's row is deleted.
func (s *Store) ReleaseLease(ctx context.Context, instance string) error {
	if _, err := s.w.ExecContext(ctx, s.q.releaseLease, instance); err != nil {
		return s.wrap(ctx, "release lease", err)
	}
	return nil
}

// LiveInstances implements workers.Leaser: the instances whose expiry is
// after the database's clock. Like every read, it is made again on a
// lost connection (see read).
func (s *Store) LiveInstances(ctx context.Context) ([]string, error) {
	var ids []string
	err := s.read(ctx, func() error {
		ids = ids[:0]
		rows, err := s.r.QueryContext(ctx, s.q.liveLeases)
		if err != nil {
			return err
		}
		defer rows.Close()
		for rows.Next() {
			var id string
			if err := rows.Scan(&id); err != nil {
				return err
			}
			ids = append(ids, id)
		}
		return rows.Err()
	})
	if err != nil {
		return nil, s.wrap(ctx, "live instances", err)
	}
	return ids, nil
}
