package workers

import (
	"context"
	"encoding/base64"
	"encoding/binary"
	"fmt"
	"math"
	"time"
)

// DefaultPageSize is the page size of ListPage without WithLimit.
const DefaultPageSize = 100

// Page is one page of a listing, as ListPage returns it.
type Page struct {
	// Tasks are the page's tasks, in the listing's order.
	Tasks []Snapshot
	// Next is the cursor of the following page, for WithCursor; it is
	// empty when this page is the last.
	Next string
}

// List returns the tasks auth may see, newest first unless WithOrder says
// otherwise: for an Owner, the tasks it owns or watches; for System,
// every task. Options narrow the list; WithLimit keeps the first n and
// WithCursor starts after a ListPage cursor. Errors: ErrNoAuthority,
// ErrInvalidOption (a nil ctx, a negative WithLimit, a WithStatus or
// WithOrder value that names no status or order), a *ValidationError
// (ErrInvalidKey) for WithQueue's name, ErrInvalidCursor, or a store
// error.
func (rt *Runtime[S]) List(ctx context.Context, auth TaskAuthority, opts ...ListOption) ([]Snapshot, error) {
	if err := checkContext(ctx); err != nil {
		return nil, err
	}
	c, f, err := listFilter(auth, opts)
	if err != nil {
		return nil, err
	}
	tasks, _, err := rt.listSnapshots(ctx, f, c.system, false)
	return tasks, err
}

// ListPage returns one page of the tasks List would return: at most
// WithLimit tasks (DefaultPageSize without it), and the cursor of the
// next page. Pass it to WithCursor, with the same filters, to read on.
// Tasks deleted meanwhile never break the walk. Tasks are ordered by
// their current run's creation, so a task submitted meanwhile, or re-run
// (a new run of its key), takes its new run's place: newest first, behind
// the walk, where it is not listed (unless it was re-run by a process
// whose clock runs behind the walk's place, which may put it ahead, to
// be listed a second time); oldest first, usually ahead of it,
// where it is, a re-run key then a second time. A walk is no feed of new
// tasks, though: a run's creation time is read before its record is
// written, on the clock of the process that submits it, so a submission
// still in flight as a page is read, or made by a process whose clock
// runs behind, may land behind the cursor and be missed. Subscribe
// follows new tasks. Each page costs one store query:
// unfiltered, in proportion to the page, whatever the user's history; with
// WithStatus or WithQueue, in proportion to the user's tasks it passes
// over, except that a MemStore reads a page of PENDING and RUNNING tasks
// alone from its live tasks, when those are fewer. A MemStore reads under
// its lock, which it lets go every 4,096 tasks it passes over, so that
// one caller's long walk does not hold up other callers' writes: a page,
// or a List, that passes over more may then miss or repeat a task re-run
// as it was read, as a walk across pages does. Errors are List's.
func (rt *Runtime[S]) ListPage(ctx context.Context, auth TaskAuthority, opts ...ListOption) (Page, error) {
	if err := checkContext(ctx); err != nil {
		return Page{}, err
	}
	c, f, err := listFilter(auth, opts)
	if err != nil {
		return Page{}, err
	}
	size := f.Limit
	if size <= 0 {
		size = DefaultPageSize
	}
	size = min(size, math.MaxInt-1) // as good as no bound
	f.Limit = size + 1              // one more tells whether a next page exists
	tasks, more, err := rt.listSnapshots(ctx, f, c.system, true)
	if err != nil {
		return Page{}, err
	}
	p := Page{Tasks: tasks}
	if more {
		last := &tasks[len(tasks)-1]
		p.Next = encodeCursor(f.Order, &Position{CreatedAt: last.CreatedAt, ID: last.ID})
	}
	return p, nil
}

// listSnapshots returns the snapshots of the records the store lists for
// f, with live progress where this runtime runs the task. Over a MemStore
// itself (not a type that embeds one, whose ListTasks may differ) the
// snapshots are made straight from the stored records, without copying
// the records first. With peek (and f.Limit set) the last of the
// f.Limit records is only looked for, not returned: more reports that it
// exists.
func (rt *Runtime[S]) listSnapshots(ctx context.Context, f Filter, system, peek bool) (out []Snapshot, more bool, err error) {
	if m, ok := any(rt.store).(*MemStore); ok {
		if out, more, err = m.listSnapshots(ctx, f, system, peek); err != nil {
			return nil, false, err
		}
	} else {
		recs, err := rt.store.ListTasks(ctx, f)
		if err != nil {
			return nil, false, err
		}
		if peek && len(recs) == f.Limit {
			recs, more = recs[:f.Limit-1], true
		}
		out = make([]Snapshot, len(recs))
		for i := range recs {
			out[i].fromRecord(&recs[i], system)
		}
	}
	if out == nil {
		out = []Snapshot{} // an empty list, not a null one, in JSON
	}
	for i := range out {
		rt.live(&out[i])
	}
	return out, more, nil
}

// check refuses the options a listing cannot take: an unknown order, a
// negative limit, a selection checkSelection refuses. (A cursor is
// checked as it is decoded.)
func (o *listOptions) check() error {
	if o.f.Order != OldestFirst && o.f.Order != NewestFirst {
		return fmt.Errorf("%w: unknown order %d", ErrInvalidOption, o.f.Order)
	}
	if o.f.Limit < 0 {
		return fmt.Errorf("%w: negative limit %d", ErrInvalidOption, o.f.Limit)
	}
	return checkSelection(o.f)
}

// listFilter builds the store filter of a listing.
func listFilter(auth TaskAuthority, opts []ListOption) (caller, Filter, error) {
	c, err := resolve(auth)
	if err != nil {
		return caller{}, Filter{}, err
	}
	o := listOptions{f: Filter{Order: NewestFirst}}
	for _, opt := range opts {
		if opt != nil {
			opt(&o)
		}
	}
	if err := o.check(); err != nil {
		return caller{}, Filter{}, err
	}
	if o.cursor != "" {
		order, pos, err := decodeCursor(o.cursor)
		if err != nil {
			return caller{}, Filter{}, err
		}
		o.f.Order, o.f.After = order, pos
	}
	if !c.system {
		o.f.VisibleTo = c.userID
	}
	return c, o.f, nil
}

// checkSelection checks the options that choose tasks, WithStatus and
// WithQueue, for List, ListPage and Subscribe alike.
func checkSelection(f Filter) error {
	for _, st := range f.Statuses {
		if !st.Valid() {
			return fmt.Errorf("%w: unknown status %q", ErrInvalidOption, st)
		}
	}
	if f.Queue != "" {
		// Checked as a queue's name is at submission: a store may refuse
		// bytes no queue's name has.
		if err := validateText("queue", f.Queue, MaxKeyLen, ErrInvalidKey); err != nil {
			return err
		}
	}
	return nil
}

// A cursor is the base64url encoding of a version byte, the order, a flag
// for a zero CreatedAt, its seconds and nanoseconds, and the task id.
const (
	cursorVersion = 1
	cursorHeader  = 1 + 1 + 1 + 8 + 4
)

func encodeCursor(order Order, p *Position) string {
	b := make([]byte, cursorHeader, cursorHeader+len(p.ID))
	b[0], b[1] = cursorVersion, byte(order)
	if !p.CreatedAt.IsZero() {
		b[2] = 1
		binary.BigEndian.PutUint64(b[3:], uint64(p.CreatedAt.Unix()))
		binary.BigEndian.PutUint32(b[11:], uint32(p.CreatedAt.Nanosecond()))
	}
	b = append(b, p.ID...)
	return base64.RawURLEncoding.EncodeToString(b)
}

// A cursor's position is a record's creation time. Every store keeps
// its times within cursorMin and cursorMax, the range of 64-bit counts
// of microseconds since 1970: a cursor with a time outside is one no
// page gave, and is refused.
var (
	cursorMin = time.UnixMicro(math.MinInt64).UTC()
	cursorMax = time.UnixMicro(math.MaxInt64).UTC()
)

func decodeCursor(s string) (Order, *Position, error) {
	b, err := base64.RawURLEncoding.DecodeString(s)
	if err != nil || len(b) <= cursorHeader || b[0] != cursorVersion || b[1] > byte(NewestFirst) || b[2] > 1 {
		return 0, nil, ErrInvalidCursor
	}
	p := &Position{ID: string(b[cursorHeader:])}
	if validateID(p.ID) != nil {
		return 0, nil, ErrInvalidCursor
	}
	nanos := binary.BigEndian.Uint32(b[11:])
	if b[2] == 1 {
		if nanos >= 1e9 {
			return 0, nil, ErrInvalidCursor
		}
		p.CreatedAt = time.Unix(int64(binary.BigEndian.Uint64(b[3:])), int64(nanos)).UTC()
		if p.CreatedAt.Before(cursorMin) || p.CreatedAt.After(cursorMax) {
			return 0, nil, ErrInvalidCursor
		}
	} else if nanos != 0 || binary.BigEndian.Uint64(b[3:]) != 0 {
		return 0, nil, ErrInvalidCursor
	}
	return Order(b[1]), p, nil
}
