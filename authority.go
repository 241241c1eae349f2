package workers

import (
	"context"
	"fmt"
	"strings"
	"unicode"
	"unicode/utf8"
)

// Limits on identifiers. They keep ids indexable by every store and rule
// out values that are certainly mistakes.
const (
	// MaxOwnerIDLen is the longest owner id NewOwner accepts, in bytes.
	MaxOwnerIDLen = 256
	// MaxKeyLen is the longest task key or queue name accepted, in bytes.
	MaxKeyLen = 1024
)

// scopeSep joins an owner id and a key into a user-scoped task id.
const scopeSep = "::"

// TaskAuthority is the identity a task API call acts for: an [Owner] or
// [System]. Every task API takes one as a required argument; a nil
// authority or a zero Owner is refused with ErrNoAuthority, never treated
// as unscoped.
//
// The interface is sealed: only this package's types implement it.
type TaskAuthority interface {
	taskAuthority()
}

// Owner is a validated user identity. Obtain one from [NewOwner] or
// [MustOwner]; the zero Owner is refused by every API.
//
// An owner id is non-empty, at most MaxOwnerIDLen bytes of valid UTF-8
// without control characters, contains no "::" and does not end in ":".
// The last two rules are what make user-scoped task ids injective: the
// first "::" in an id always ends the owner half.
type Owner struct {
	id string
}

// NewOwner validates id against the rules [Owner] states and returns the
// Owner for it. The error is a *ValidationError wrapping ErrInvalidOwner
// that says which rule id breaks.
func NewOwner(id string) (Owner, error) {
	if err := validateOwnerID(id); err != nil {
		return Owner{}, err
	}
	return Owner{id: id}, nil
}

// MustOwner is like NewOwner but panics if id is invalid. Use it for
// constants and tests.
func MustOwner(id string) Owner {
	o, err := NewOwner(id)
	if err != nil {
		panic(err)
	}
	return o
}

// ID returns the owner id; "" for the zero Owner.
func (o Owner) ID() string { return o.id }

// String returns the owner id.
func (o Owner) String() string { return o.id }

func (Owner) taskAuthority() {}

// SystemAuthority is the type of [System].
type SystemAuthority struct{}

func (SystemAuthority) taskAuthority() {}

// String returns "system".
func (SystemAuthority) String() string { return "system" }

// System is the explicit, unscoped authority: it reads, lists and cancels
// every task, is not asked by the queue authorizer, and submits into the
// global scope (it has no owner half to scope by). Use it where the
// application deliberately acts for nobody in particular; because it is
// named, every such call is easy to find.
var System SystemAuthority

// caller is a resolved authority: system, or a validated user id.
type caller struct {
	system bool
	userID string
}

// isSystem reports whether auth resolves to System.
func isSystem(auth TaskAuthority) bool {
	c, err := resolve(auth)
	return err == nil && c.system
}

// resolve turns an authority into a caller, refusing nil and zero values.
func resolve(auth TaskAuthority) (caller, error) {
	switch a := auth.(type) {
	case Owner:
		if a.id == "" {
			return caller{}, ErrNoAuthority
		}
		return caller{userID: a.id}, nil
	case *Owner:
		if a == nil || a.id == "" {
			return caller{}, ErrNoAuthority
		}
		return caller{userID: a.id}, nil
	case SystemAuthority:
		return caller{system: true}, nil
	case *SystemAuthority:
		if a == nil {
			return caller{}, ErrNoAuthority
		}
		return caller{system: true}, nil
	default: // nil
		return caller{}, ErrNoAuthority
	}
}

// resolveIn is resolve for a call made with ctx, which checkContext
// checks first.
func resolveIn(ctx context.Context, auth TaskAuthority) (caller, error) {
	if err := checkContext(ctx); err != nil {
		return caller{}, err
	}
	return resolve(auth)
}

// Scope decides which callers can collide on a key, since a task id is
// also its deduplication key.
type Scope int

const (
	// ScopeUser, the default, prefixes the key with the owner id, so two
	// owners' keys can never collide: "user_123::report_42".
	ScopeUser Scope = iota
	// ScopeGlobal keeps the key verbatim for system-wide deduplication.
	// A global key may not contain "::", which keeps the two scopes' id
	// spaces disjoint. A caller who is not a watcher of an existing global
	// task is refused unless the store's watch authorizer allows it.
	ScopeGlobal
)

// String returns "user" or "global".
func (s Scope) String() string {
	switch s {
	case ScopeUser:
		return "user"
	case ScopeGlobal:
		return "global"
	}
	return fmt.Sprintf("Scope(%d)", int(s))
}

// ScopedTaskKey returns the user-scoped task id for key submitted by auth:
// "owner::key" for an Owner. System has no owner half, so for System it
// returns the global id, exactly as [GlobalTaskKey]. Use it to rebuild an
// id whose Submit result was not kept; never build ids by concatenation.
func ScopedTaskKey(key string, auth TaskAuthority) (string, error) {
	c, err := resolve(auth)
	if err != nil {
		return "", err
	}
	return scopedID(key, c, ScopeUser)
}

// GlobalTaskKey returns the global-scope task id for key: the key itself,
// once validated. It fails for a key containing "::".
func GlobalTaskKey(key string) (string, error) {
	return scopedID(key, caller{system: true}, ScopeGlobal)
}

func scopedID(key string, c caller, scope Scope) (string, error) {
	owner, err := idOwner(key, c, scope)
	if err != nil || owner == "" {
		return key, err
	}
	return owner + scopeSep + key, nil
}

// idOwner validates key for scope and returns the user id that prefixes
// its scoped id, or "" when the id is the key itself (global scope).
func idOwner(key string, c caller, scope Scope) (string, error) {
	if err := validateText("key", key, MaxKeyLen, ErrInvalidKey); err != nil {
		return "", err
	}
	switch {
	case scope == ScopeGlobal || c.system:
		if strings.Contains(key, scopeSep) {
			return "", invalid("key", key, `a global-scope key may not contain "::"`, ErrInvalidKey)
		}
		return "", nil
	case scope == ScopeUser:
		return c.userID, nil
	}
	return "", fmt.Errorf("%w: unknown scope %v", ErrInvalidOption, scope)
}

// OwnerOf returns the owner half of a user-scoped task id. It reports
// false for a global-scope id (which has no owner) and for any string no
// user-scoped id could be. For every valid owner o and key k,
// OwnerOf(ScopedTaskKey(k, o)) returns o.
func OwnerOf(id string) (Owner, bool) {
	i := strings.Index(id, scopeSep)
	if i < 0 {
		return Owner{}, false
	}
	o, err := NewOwner(id[:i])
	if err != nil {
		return Owner{}, false
	}
	if validateText("key", id[i+len(scopeSep):], MaxKeyLen, ErrInvalidKey) != nil {
		return Owner{}, false
	}
	return o, true
}

// ownerOfStored is OwnerOf for an id that passed validateID, as every
// stored record's has: the parts of an id that is valid UTF-8 without
// control characters are too, split as they are at an ASCII separator,
// and the owner part cannot end in ':' (the separator would then have
// begun a byte earlier). Only the lengths are left to check.
func ownerOfStored(id string) (string, bool) {
	i := strings.Index(id, scopeSep)
	if i <= 0 || i > MaxOwnerIDLen {
		return "", false
	}
	if key := len(id) - i - len(scopeSep); key == 0 || key > MaxKeyLen {
		return "", false
	}
	return id[:i], true
}

func validateOwnerID(id string) error {
	if err := validateText("owner", id, MaxOwnerIDLen, ErrInvalidOwner); err != nil {
		return err
	}
	if strings.Contains(id, scopeSep) {
		return invalid("owner", id, `contains "::"`, ErrInvalidOwner)
	}
	if strings.HasSuffix(id, ":") {
		return invalid("owner", id, `ends in ":"`, ErrInvalidOwner)
	}
	return nil
}

// validateText applies the rules every identifier shares.
func validateText(field, s string, max int, sentinel error) error {
	switch {
	case s == "":
		return invalid(field, s, "empty", sentinel)
	case len(s) > max:
		return invalid(field, s, fmt.Sprintf("longer than %d bytes", max), sentinel)
	case !utf8.ValidString(s):
		return invalid(field, s, "not valid UTF-8", sentinel)
	case hasControl(s):
		return invalid(field, s, "contains a control character", sentinel)
	}
	return nil
}

// hasControl reports whether s, valid UTF-8, holds a control character
// (unicode.IsControl): one of C0, DEL or C1, all below U+0100. ASCII
// bytes are checked without decoding.
func hasControl(s string) bool {
	for i := 0; i < len(s); {
		if b := s[i]; b < utf8.RuneSelf {
			if b < 0x20 || b == 0x7f {
				return true
			}
			i++
			continue
		}
		r, n := utf8.DecodeRuneInString(s[i:])
		if unicode.IsControl(r) {
			return true
		}
		i += n
	}
	return false
}

// validateID checks a task id handed to a read or cancel call.
func validateID(id string) error {
	return validateText("task id", id, MaxOwnerIDLen+len(scopeSep)+MaxKeyLen, ErrInvalidKey)
}

func invalid(field, value, reason string, sentinel error) error {
	if len(value) > 64 {
		value = truncateText(value, 64)
	}
	return &ValidationError{Field: field, Value: value, Reason: reason, err: sentinel}
}
