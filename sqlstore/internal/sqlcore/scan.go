package sqlcore

import (
	"encoding/json"
	"fmt"
	"time"

	"github.com/taskgate/workers"
)

// scanRecord reads one row of sqlSelect.
func scanRecord(row interface{ Scan(dest ...any) error }) (workers.Record, error) {
	var (
		r        workers.Record
		status   string
		cause    string
		result   []byte
		watchers []byte
	)
	err := row.Scan(&r.ID, &r.RunID, &r.Queue, timeDest{&r.CreatedAt}, &status, &r.Progress, &r.Attempt,
		&result, &r.Error, timeDest{&r.StartedAt}, timeDest{&r.CompletedAt},
		&cause, &r.CancelledBy, &r.CancelReason, &r.Stack, &watchers)
	if err != nil {
		return workers.Record{}, err
	}
	r.Status = workers.Status(status)
	r.Cause = workers.Cause(cause)
	r.Result = result // a copy made by Scan; nil for NULL
	if string(watchers) != "[]" {
		if err := json.Unmarshal(watchers, &r.Watchers); err != nil {
			return workers.Record{}, fmt.Errorf("decode watchers of %q: %w", r.ID, err)
		}
	}
	return r, nil
}

// timeDest scans a nullable time column: NULL is the zero time, and a
// time is returned in UTC whether the driver hands over a time.Time or
// integer Unix microseconds.
type timeDest struct{ t *time.Time }

func (d timeDest) Scan(v any) error {
	switch v := v.(type) {
	case nil:
		*d.t = time.Time{}
	case time.Time:
		*d.t = v.UTC()
	case int64:
		*d.t = time.UnixMicro(v).UTC()
	default:
		return fmt.Errorf("cannot scan %T into a time", v)
	}
	return nil
}
