package sqlcore

import (
	"time"

	"github.com/taskgate/workers"
)

// Statement is one query of a Store with its arguments.
type Statement struct {
	Name string
	SQL  string
	Args []any
}

// IndexedStatements returns the reads whose plans must be index lookups,
// for the dialect packages' plan tests: the status read of id, the
// listing of userID's tasks, the scan for RUNNING records that recovery
// makes, and the cleanup's delete of old terminal records. It is a function rather than a method so that it is
// not promoted into the dialect packages' API.
func IndexedStatements(s *Store, id, userID string) []Statement {
	list, listArgs := s.listQuery(workers.Filter{VisibleTo: userID})
	running, runningArgs := s.listQuery(workers.Filter{Statuses: []workers.Status{workers.StatusRunning}})
	return []Statement{
		{Name: "get task", SQL: s.q.get, Args: []any{id}},
		{Name: "list visible to user", SQL: list, Args: listArgs},
		{Name: "list running", SQL: running, Args: runningArgs},
		{Name: "delete finished", SQL: s.q.deleteFinished, Args: []any{s.time(time.Unix(1e9, 0)),
			string(workers.StatusCompleted), string(workers.StatusFailed), string(workers.StatusCancelled)}},
	}
}
