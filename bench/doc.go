// Package bench measures this repository's library beside its peers in
// one process: raw goroutines, pond, ants and River. It is a module of its
// own, so that none of the peers reaches the library's users.
//
// Everything here is a benchmark; a plain go test runs only quick smoke
// tests of the harness. See BENCHMARKS.md for the commands and figures.
package bench

import (
	"log/slog"
	"os"
	"slices"
	"strconv"
	"strings"
	"time"
)

// percentile returns the p-th percentile (0 to 100) of d, sorting d.
func percentile(d []time.Duration, p float64) time.Duration {
	if len(d) == 0 {
		return 0
	}
	slices.Sort(d)
	i := int(float64(len(d)-1) * p / 100)
	return d[i]
}

// rssBytes returns the process's resident set size, or 0 where
// /proc/self/status cannot be read.
func rssBytes() int64 {
	b, err := os.ReadFile("/proc/self/status")
	if err != nil {
		return 0
	}
	for line := range strings.SplitSeq(string(b), "\n") {
		if rest, ok := strings.CutPrefix(line, "VmRSS:"); ok {
			kb, err := strconv.ParseInt(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(rest), "kB")), 10, 64)
			if err != nil {
				return 0
			}
			return kb << 10
		}
	}
	return 0
}

// quietLogger drops River's logs, which would interleave with the
// benchmark output.
var quietLogger = slog.New(slog.DiscardHandler)
