package sqlite

import (
	"math"
	"testing"
	"time"
)

// SQLite's busy_timeout is whole milliseconds in an int32: a timeout is
// rounded up, so that one under a millisecond still waits, and capped,
// so that a longer one is not read as none.
func TestBusyMillis(t *testing.T) {
	for d, want := range map[time.Duration]int64{
		0:                                0,
		500 * time.Microsecond:           1,
		time.Millisecond:                 1,
		1500 * time.Microsecond:          2,
		5 * time.Second:                  5000,
		30 * 24 * time.Hour:              math.MaxInt32,
		time.Duration(math.MaxInt64):     math.MaxInt32,
		math.MaxInt32 * time.Millisecond: math.MaxInt32,
	} {
		if got := busyMillis(d); got != want {
			t.Errorf("busyMillis(%v) = %d, want %d", d, got, want)
		}
	}
}
