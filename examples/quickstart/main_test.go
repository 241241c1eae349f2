package main

import (
	"bytes"
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func TestQuickstartRuns(t *testing.T) {
	for _, live := range []bool{false, true} {
		var out bytes.Buffer
		require.NoError(t, run(context.Background(), &out, live, time.Millisecond))
		got := out.String()
		assert.Contains(t, got, "bob asks for alice::quarterly-report: workers: task not found")
		assert.Contains(t, got, "bob tries to cancel alice::reindex: workers: task not found")
		assert.Contains(t, got, `alice::reindex ended cancelled`)
		assert.Contains(t, got, `"Cancelled by user" (cancelled by user: true), by alice: "the report reads the old index"`)
		assert.Contains(t, got, "alice::quarterly-report result: map[steps:25]")
		assert.Contains(t, got, "alice lists 2 tasks")
		assert.Contains(t, got, "shut down")
		assert.Equal(t, live, bytes.Contains(out.Bytes(), []byte("\x1b[")), "ANSI redraw only on a terminal")
	}
}
