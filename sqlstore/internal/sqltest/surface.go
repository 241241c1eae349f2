package sqltest

import (
	"reflect"
	"slices"
	"testing"

	"github.com/taskgate/workers"
)

// CheckSurface checks that a store type T shows its users nothing of
// the implementation it shares with the other SQL store: no exported
// field (an embedded type from an internal package would be one), and
// no exported method on *T but those of the capabilities it implements
// (workers.Store, workers.Leaser, workers.Notifier) and own, the
// methods T declares itself.
func CheckSurface[T any](t *testing.T, own ...string) {
	t.Helper()
	typ := reflect.TypeFor[T]()
	for f := range typ.Fields() {
		if f.IsExported() {
			t.Errorf("%v has the exported field %s (of type %v): the implementation it embeds shows in its API", typ, f.Name, f.Type)
		}
	}
	allowed := slices.Clone(own)
	for _, capability := range []reflect.Type{
		reflect.TypeFor[workers.Store](),
		reflect.TypeFor[workers.Leaser](),
		reflect.TypeFor[workers.Notifier](),
	} {
		for m := range capability.Methods() {
			allowed = append(allowed, m.Name)
		}
	}
	ptr := reflect.PointerTo(typ)
	for m := range ptr.Methods() {
		if !slices.Contains(allowed, m.Name) {
			t.Errorf("%v has the method %s, of no capability it implements and not its own", ptr, m.Name)
		}
	}
}
