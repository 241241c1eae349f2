package workershttp

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"io"
	"net/url"
	"slices"
	"strings"
	"time"

	"github.com/taskgate/workers"
)

var errEOF = io.EOF

func pathEscape(s string) string { return url.PathEscape(s) }

// cursor is where a page ends: the last task's creation time and id.
type cursor struct {
	Created int64  `json:"c"`
	ID      string `json:"i"`
}

func encodeCursor(s workers.Snapshot) string {
	b, _ := json.Marshal(cursor{Created: s.CreatedAt.UnixNano(), ID: s.ID})
	return base64.RawURLEncoding.EncodeToString(b)
}

func decodeCursor(s string) (cursor, error) {
	var c cursor
	b, err := base64.RawURLEncoding.DecodeString(s)
	if err == nil {
		err = json.Unmarshal(b, &c)
	}
	if err != nil || c.ID == "" {
		return c, fmt.Errorf("%w: malformed cursor", ErrBadRequest)
	}
	return c, nil
}

// newer orders tasks newest first, by id among equals.
func newer(a, b workers.Snapshot) int {
	if c := b.CreatedAt.Compare(a.CreatedAt); c != 0 {
		return c
	}
	return strings.Compare(b.ID, a.ID)
}

// listPage returns one page of the caller's tasks, newest first, after
// the cursor, and the cursor of the next page. It is the one place that
// pages: it reads every visible task with List and pages in memory, and
// is to become a call of the runtime's own paged listing once it has one.
func listPage(ctx context.Context, rt runtime, auth workers.TaskAuthority, statuses []workers.Status, limit int, after string) ([]workers.Snapshot, string, error) {
	var from *cursor
	if after != "" {
		c, err := decodeCursor(after)
		if err != nil {
			return nil, "", err
		}
		from = &c
	}
	var opts []workers.ListOption
	if len(statuses) > 0 {
		opts = append(opts, workers.WithStatus(statuses...))
	}
	all, err := rt.List(ctx, auth, opts...)
	if err != nil {
		return nil, "", err
	}
	slices.SortFunc(all, newer)
	if from != nil {
		mark := workers.Snapshot{ID: from.ID, CreatedAt: time.Unix(0, from.Created).UTC()}
		i, _ := slices.BinarySearchFunc(all, mark, newer)
		for i < len(all) && newer(all[i], mark) <= 0 {
			i++
		}
		all = all[i:]
	}
	next := ""
	if len(all) > limit {
		all = all[:limit]
		next = encodeCursor(all[limit-1])
	}
	return all, next, nil
}
