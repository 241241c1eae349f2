package workershttp

import (
	"encoding/json"
	"time"

	"github.com/taskgate/workers"
)

// Task is a task as the API shows it. Its JSON field names are part of
// the API and stable; times are RFC 3339 and left out while unset. Each
// field is the workers.Snapshot field of the same name.
type Task struct {
	ID           string          `json:"id"`
	RunID        string          `json:"run_id"`
	Status       workers.Status  `json:"status"`
	Progress     int             `json:"progress"`
	Attempt      int             `json:"attempt"`
	Result       json.RawMessage `json:"result,omitempty"`
	Error        string          `json:"error,omitempty"`
	Cause        workers.Cause   `json:"cause,omitempty"`
	Queue        string          `json:"queue,omitempty"`
	WatcherCount int             `json:"watcher_count"`
	CancelledBy  string          `json:"cancelled_by,omitempty"`
	CancelReason string          `json:"cancel_reason,omitempty"`
	CreatedAt    time.Time       `json:"created_at,omitzero"`
	StartedAt    time.Time       `json:"started_at,omitzero"`
	CompletedAt  time.Time       `json:"completed_at,omitzero"`
}

// FromSnapshot returns the API view of a snapshot.
func FromSnapshot(s workers.Snapshot) Task {
	return Task{
		ID: s.ID, RunID: s.RunID, Status: s.Status, Progress: s.Progress, Attempt: s.Attempt,
		Result: s.Result, Error: s.Error, Cause: s.Cause, Queue: s.Queue,
		WatcherCount: s.WatcherCount, CancelledBy: s.CancelledBy, CancelReason: s.CancelReason,
		CreatedAt: s.CreatedAt, StartedAt: s.StartedAt, CompletedAt: s.CompletedAt,
	}
}

// Page is one page of the list route.
type Page struct {
	// Tasks are the page's tasks, newest first; [] when there are none.
	Tasks []Task `json:"tasks"`
	// Next is the cursor of the following page, or "" on the last one.
	Next string `json:"next,omitempty"`
}

// SubmissionResponse is the body WriteSubmission writes.
type SubmissionResponse struct {
	ID     string `json:"id"`     // the scoped task id (workers.Submission.ID)
	RunID  string `json:"run_id"` // the run started or joined
	Joined bool   `json:"joined"` // the submission joined a live run
}
