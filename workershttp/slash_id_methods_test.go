package workershttp_test

import (
	"context"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/taskgate/workers"
)

// A route of the id "/" asked with a method it does not take is answered
// as the same route of any other id: 405 with its Allow header, not 404
// "no such route" (Handler's doc: "a request no route takes too: 404, or
// 405 with the route's Allow header").
func TestASlashIDsRoutesAnswer405AsOtherIDs(t *testing.T) {
	f := newFixture(t)
	release := make(chan struct{})
	defer close(release)
	for _, id := range []string{"/", "a"} {
		_, err := f.rt.Submit(context.Background(), id, blocker(release), alice, workers.WithScope(workers.ScopeGlobal))
		require.NoError(t, err)
	}
	for _, c := range []struct{ method, suffix string }{
		{"POST", ""}, {"PUT", ""}, {"GET", "/cancel"}, {"POST", "/events"},
	} {
		want, wantBody := f.do(t, c.method, "/tasks/a"+c.suffix, "alice", nil)
		require.Equal(t, 405, want.StatusCode, "%s /tasks/a%s: %s", c.method, c.suffix, wantBody)
		got, body := f.do(t, c.method, "/tasks/%2F"+c.suffix, "alice", nil)
		assert.Equal(t, want.StatusCode, got.StatusCode, "%s /tasks/%%2F%s: %s", c.method, c.suffix, body)
		assert.Equal(t, want.Header.Values("Allow"), got.Header.Values("Allow"), "%s /tasks/%%2F%s", c.method, c.suffix)
	}
}
