package sqlcore

import (
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"testing/fstest"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func TestLoadMigrations(t *testing.T) {
	file := func(s string) *fstest.MapFile { return &fstest.MapFile{Data: []byte(s)} }
	two := fstest.MapFS{
		"migrations/0010_later.sql": file("B"),
		"migrations/0002_first.sql": file("A"),
		"migrations/README":         file("not a migration"),
	}
	migs, err := loadMigrations(two, map[int]int{10: 2})
	if err != nil || len(migs) != 2 || migs[0].version != 2 || migs[0].name != "first" || migs[1].sql != "B" {
		t.Fatalf("loadMigrations = %+v, %v", migs, err)
	}
	if migs[0].compatibleFrom != 2 || migs[1].compatibleFrom != 2 {
		t.Errorf("compatible from versions %d and %d, want 2 and 2", migs[0].compatibleFrom, migs[1].compatibleFrom)
	}
	for _, compatible := range []map[int]int{{3: 2}, {10: 10}, {10: 11}, {10: 0}} {
		if _, err := loadMigrations(two, compatible); err == nil {
			t.Errorf("loadMigrations accepted compatibility %v", compatible)
		}
	}
	for name, fsys := range map[string]fstest.MapFS{
		"none":       {},
		"unnumbered": {"migrations/init.sql": file("")},
		"zero":       {"migrations/0000_init.sql": file("")},
		"duplicate":  {"migrations/0001_a.sql": file(""), "migrations/1_b.sql": file("")},
	} {
		if _, err := loadMigrations(fsys, nil); err == nil {
			t.Errorf("%s: loadMigrations accepted it", name)
		}
	}
}

func TestConfig(t *testing.T) {
	c := Config{Schema: "jobs", Prefix: "w_"}
	if err := c.Validate(); err != nil {
		t.Fatal(err)
	}
	if got, want := c.expand(`{tasks} {watchers} {versions} {schema}"{prefix}x"`),
		`"jobs"."w_tasks" "jobs"."w_watchers" "jobs"."w_schema_version" "jobs"."w_x"`; got != want {
		t.Errorf("expand = %s, want %s", got, want)
	}
	for _, c := range []Config{
		{Schema: `a"b`}, {Schema: "a.b"}, {Schema: "1a"}, {Schema: strings.Repeat("s", 64)},
		{Prefix: "a b"}, {Prefix: "é"}, {Prefix: strings.Repeat("p", 33)},
	} {
		if c.Validate() == nil {
			t.Errorf("Validate accepted %+v", c)
		}
	}
}

// A missing table or function is the store's own when its name, bare,
// quoted or qualified, is the prefix and one of the names the migrations
// make; a name the error does not give (a column) counts as the store's.
func TestOwnsItsTablesAndFunctionsOnly(t *testing.T) {
	c := Config{Schema: "s", Prefix: "workers_"}
	for name, want := range map[string]bool{
		"workers_tasks":             true,
		`"s"."workers_leases"`:      true,
		"main.workers_changes":      true,
		"s.workers_write_many":      true,
		"":                          true,
		"audit":                     false,
		"main.audit":                false,
		"workers_audit":             false,
		"tasks":                     false,
		"operator":                  false,
		"s.other_prefix_tasks":      false,
		`"s"."workers_tasks_extra"`: false,
	} {
		if got := c.owns(name); got != want {
			t.Errorf("owns(%q) = %v, want %v", name, got, want)
		}
	}
}

// Every table and function the migrations of either store create is one
// the store owns (see Config.owns), so that a table a later migration
// adds, missing, still says to call Migrate.
func TestOwnsEveryTableAndFunctionTheMigrationsCreate(t *testing.T) {
	c := Config{Schema: "s", Prefix: "p_"}
	created := regexp.MustCompile(`(?i)CREATE\s+(?:OR\s+REPLACE\s+)?(?:TABLE|FUNCTION)\s+(?:IF\s+NOT\s+EXISTS\s+)?([^\s(]+)`)
	files, err := filepath.Glob("../../*/migrations/*.sql")
	if err != nil || len(files) == 0 {
		t.Fatalf("no migrations found: %v", err)
	}
	names := 0
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		for _, m := range created.FindAllStringSubmatch(c.expand(string(b)), -1) {
			names++
			if !c.owns(m[1]) {
				t.Errorf("%s creates %s, which the store does not count as its own", f, m[1])
			}
		}
	}
	if names == 0 {
		t.Fatal("the migrations create no table or function")
	}
	if versions := c.expand("{versions}"); !c.owns(versions) {
		t.Errorf("the store does not count its versions table %s as its own", versions)
	}
}
