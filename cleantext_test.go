package workers

import (
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// A callback's error that no store could hold verbatim is recorded with
// each NUL byte and each byte of invalid UTF-8 replaced by U+FFFD, as the
// README's failure table says: a run of such bytes is not one
// replacement, and valid text around them, a U+FFFD of its own
// included, stays as it was.
func TestAnErrorsUnstorableBytesAreEachReplaced(t *testing.T) {
	rt := memRuntime(t)
	for i, c := range []struct{ in, want string }{
		{"a\xff\xfeb", "a\uFFFD\uFFFDb"},
		{"nul\x00\x00", "nul\uFFFD\uFFFD"},
		{"cut \xe2\x82", "cut \uFFFD\uFFFD"},
		{"kept \uFFFD é", "kept \uFFFD é"},
	} {
		sub, err := rt.Submit(ctx, fmt.Sprint("k", i), returns(nil, errors.New(c.in)), alice)
		require.NoError(t, err)
		snap, err := rt.Wait(ctx, sub.ID, alice)
		require.NoError(t, err)
		assert.Equal(t, c.want, snap.Error, "%q", c.in)
	}
}

// An error of any size that needs cleaning is cleaned only as far as a
// record keeps it, and the record keeps its first MaxErrorLen bytes
// cleaned: cleaning never builds a copy the size of the whole error.
func TestAHugeUnstorableErrorIsCleanedOnlyAsFarAsItIsKept(t *testing.T) {
	huge := strings.Repeat("\xff", 1<<20)
	cleaned := cleanText(huge)
	assert.LessOrEqual(t, len(cleaned), 3*cleanKept, "a cleaned copy of the whole text")
	assert.GreaterOrEqual(t, len(cleaned), MaxErrorLen, "less than a record keeps")

	rt := memRuntime(t)
	sub, err := rt.Submit(ctx, "huge", returns(nil, errors.New(huge)), alice)
	require.NoError(t, err)
	snap, err := rt.Wait(ctx, sub.ID, alice)
	require.NoError(t, err)
	assert.Equal(t, strings.Repeat("\uFFFD", MaxErrorLen/3), snap.Error)
}
