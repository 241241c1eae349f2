package workershttp

import (
	"context"
	"io"
	"net/url"

	"github.com/taskgate/workers"
)

var errEOF = io.EOF

// pathEscape escapes s as one segment of a path. url.PathEscape leaves
// dots alone, and a segment that is only "." or ".." (either is a valid
// global key) would name the directory or its parent to a client and to
// the router: those are escaped whole.
func pathEscape(s string) string {
	switch s {
	case ".":
		return "%2E"
	case "..":
		return "%2E%2E"
	}
	return url.PathEscape(s)
}

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
