package workershttp

import (
	"context"
	"io"
	"net/url"

	"github.com/taskgate/workers"
)

var errEOF = io.EOF

func pathEscape(s string) string { return url.PathEscape(s) }

// listPage returns one page of the caller's tasks, newest first, after
// the cursor, and the cursor of the next page: one call of the runtime's
// paged listing, whose cursors are opaque.
func listPage(ctx context.Context, rt runtime, auth workers.TaskAuthority, statuses []workers.Status, limit int, after string) ([]workers.Snapshot, string, error) {
	opts := []workers.ListOption{workers.WithOrder(workers.NewestFirst), workers.WithLimit(limit)}
	if after != "" {
		opts = append(opts, workers.WithCursor(after))
	}
	if len(statuses) > 0 {
		opts = append(opts, workers.WithStatus(statuses...))
	}
	p, err := rt.ListPage(ctx, auth, opts...)
	return p.Tasks, p.Next, err
}
