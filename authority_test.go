package workers

import (
	"errors"
	"strings"
	"testing"
	"unicode"
	"unicode/utf8"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestNewOwnerRejectsIDsThatBreakInjectivity(t *testing.T) {
	t.Parallel()
	for _, id := range []string{
		"",
		"a::b",
		"::",
		"alice:",
		":",
		"bad\x00id",
		"tab\tid",
		"\xff\xfe",
		strings.Repeat("x", MaxOwnerIDLen+1),
	} {
		_, err := NewOwner(id)
		require.ErrorIs(t, err, ErrInvalidOwner, "NewOwner(%q)", id)
		var ve *ValidationError
		require.ErrorAs(t, err, &ve)
		assert.Equal(t, "owner", ve.Field)
	}
	for _, id := range []string{"alice", "user_123", ":alice", "a:b", "ünï", strings.Repeat("x", MaxOwnerIDLen)} {
		o, err := NewOwner(id)
		require.NoError(t, err, "NewOwner(%q)", id)
		assert.Equal(t, id, o.ID())
	}
	assert.Panics(t, func() { MustOwner("a::b") })
}

func TestZeroAndNilAuthoritiesAreRefused(t *testing.T) {
	t.Parallel()
	var nilOwner *Owner
	for _, auth := range []TaskAuthority{nil, Owner{}, &Owner{}, nilOwner} {
		_, err := resolve(auth)
		require.ErrorIs(t, err, ErrNoAuthority, "%#v", auth)
		_, err = ScopedTaskKey("k", auth)
		require.ErrorIs(t, err, ErrNoAuthority, "%#v", auth)
	}
	alice := MustOwner("alice")
	c, err := resolve(&alice)
	require.NoError(t, err)
	assert.Equal(t, caller{userID: "alice"}, c)
	c, err = resolve(&System)
	require.NoError(t, err)
	assert.True(t, c.system)
}

func TestScopedTaskKey(t *testing.T) {
	t.Parallel()
	alice := MustOwner("alice")
	id, err := ScopedTaskKey("report_42", alice)
	require.NoError(t, err)
	assert.Equal(t, "alice::report_42", id)

	// A user-scoped key may contain "::"; only the owner half may not.
	id, err = ScopedTaskKey("a::b", alice)
	require.NoError(t, err)
	o, ok := OwnerOf(id)
	require.True(t, ok)
	assert.Equal(t, alice, o)

	id, err = ScopedTaskKey("warm-cache", System)
	require.NoError(t, err)
	assert.Equal(t, "warm-cache", id, "System submits into the global scope")

	id, err = GlobalTaskKey("warm-cache")
	require.NoError(t, err)
	assert.Equal(t, "warm-cache", id)
	_, ok = OwnerOf(id)
	assert.False(t, ok, "a global id has no owner")

	for _, key := range []string{"", "bad\nkey", "del\x7f", "nel\u0085", "é\u009f", "\xff", strings.Repeat("k", MaxKeyLen+1)} {
		_, err := ScopedTaskKey(key, alice)
		require.ErrorIs(t, err, ErrInvalidKey, "key %q", key)
	}
	_, err = GlobalTaskKey("a::b")
	require.ErrorIs(t, err, ErrInvalidKey)
	_, err = ScopedTaskKey("a::b", System)
	require.ErrorIs(t, err, ErrInvalidKey, "System's global scope refuses '::' too")
}

func TestOwnerOfRejectsStringsNoUserIDCouldBe(t *testing.T) {
	t.Parallel()
	for _, id := range []string{"", "plain", "::key", "a:::key" + "\x00", "alice::", "\xff::k"} {
		_, ok := OwnerOf(id)
		assert.False(t, ok, "OwnerOf(%q)", id)
	}
	o, ok := OwnerOf("a:::key")
	require.True(t, ok)
	assert.Equal(t, "a", o.ID(), "the first '::' ends the owner half; the key may start with ':'")
}

// FuzzScopedIDs proves the id rules: (owner, key) -> id is injective, the
// user and global id spaces are disjoint, and OwnerOf inverts user-scoped
// ids exactly.
func FuzzScopedIDs(f *testing.F) {
	f.Add("alice", "report", "bob", "report", "report")
	f.Add("a", ":b", "a:", "b", "a::b")
	f.Add("a:b", "c", "a", "b::c", "x")
	f.Add(":a", "::", ":a:", ":", "g")
	f.Fuzz(func(t *testing.T, o1, k1, o2, k2, g string) {
		id1, err1 := userID(o1, k1)
		id2, err2 := userID(o2, k2)
		if err1 == nil {
			owner, ok := OwnerOf(id1)
			if !ok || owner.ID() != o1 {
				t.Fatalf("OwnerOf(%q) = %q, %v; want %q", id1, owner.ID(), ok, o1)
			}
			if !strings.HasSuffix(id1, "::"+k1) {
				t.Fatalf("id %q does not end in its key %q", id1, k1)
			}
		}
		if err1 == nil && err2 == nil && (id1 == id2) != (o1 == o2 && k1 == k2) {
			t.Fatalf("(%q, %q) -> %q and (%q, %q) -> %q", o1, k1, id1, o2, k2, id2)
		}
		gid, err := GlobalTaskKey(g)
		if err != nil {
			return
		}
		if _, ok := OwnerOf(gid); ok {
			t.Fatalf("global id %q has an owner", gid)
		}
		if err1 == nil && gid == id1 {
			t.Fatalf("global id %q collides with user id of (%q, %q)", gid, o1, k1)
		}
	})
}

func userID(owner, key string) (string, error) {
	o, err := NewOwner(owner)
	if err != nil {
		return "", err
	}
	id, err := ScopedTaskKey(key, o)
	if err != nil && !errors.Is(err, ErrInvalidKey) {
		panic(err)
	}
	return id, err
}

// FuzzOwnerOfStored proves the MemStore's shortcut: for every id a store
// can hold, ownerOfStored agrees with OwnerOf.
func FuzzOwnerOfStored(f *testing.F) {
	for _, id := range []string{"alice::k", "a:::key", "::key", "alice::", "a:b::c", "plain", "a::b::c",
		strings.Repeat("o", MaxOwnerIDLen+1) + "::k", "o::" + strings.Repeat("k", MaxKeyLen+1)} {
		f.Add(id)
	}
	f.Fuzz(func(t *testing.T, id string) {
		if validateID(id) != nil {
			return
		}
		o, ok := OwnerOf(id)
		got, gotOK := ownerOfStored(id)
		if ok != gotOK || o.ID() != got {
			t.Fatalf("ownerOfStored(%q) = %q, %v; OwnerOf says %q, %v", id, got, gotOK, o.ID(), ok)
		}
	})
}

// hasControl is unicode.IsControl over a string, for every rune alone and
// after other text.
func TestHasControlIsIsControl(t *testing.T) {
	for r := rune(0); r <= unicode.MaxRune; r++ {
		if !utf8.ValidRune(r) {
			continue
		}
		s := string(r)
		if got, want := hasControl(s), unicode.IsControl(r); got != want {
			t.Fatalf("hasControl(%U) = %v, want %v", r, got, want)
		}
		if got, want := hasControl("é-k"+s), unicode.IsControl(r); got != want {
			t.Fatalf("hasControl(\"é-k\" + %U) = %v, want %v", r, got, want)
		}
	}
}

// A long value is cut at a rune boundary, so that the error of a valid
// UTF-8 value does not show half a character.
func TestValidationErrorCutsALongValueAtARuneBoundary(t *testing.T) {
	t.Parallel()
	key := "a" + strings.Repeat("é", MaxKeyLen)
	_, err := ScopedTaskKey(key, MustOwner("alice"))
	var ve *ValidationError
	require.ErrorAs(t, err, &ve)
	assert.True(t, utf8.ValidString(ve.Value), "%q", ve.Value)
	assert.True(t, strings.HasPrefix(key, ve.Value))
	assert.Len(t, ve.Value, 63)
	assert.NotContains(t, err.Error(), `\x`)
}
