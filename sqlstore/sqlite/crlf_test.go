package sqlite_test

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

// Tables migrated by a build of this same release from a checkout whose
// migration files have CRLF line endings (Git for Windows' default
// core.autocrlf=true; there is no .gitattributes to prevent it) record
// the checksums of those bytes. The migrations are the same SQL: a build
// from an LF checkout must accept the tables, as Migrate's doc promises
// for every version whose file was not edited.
func TestMigrateAcceptsTablesMigratedFromACRLFCheckout(t *testing.T) {
	path := filepath.Join(t.TempDir(), "tasks.db")
	s := openAt(t, path) // migrated
	files, err := filepath.Glob("migrations/*.sql")
	if err != nil || len(files) == 0 {
		t.Fatalf("migration files: %v, %v", files, err)
	}
	raw := openRaw(t, path)
	for _, f := range files {
		text, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		crlf := bytes.ReplaceAll(bytes.ReplaceAll(text, []byte("\r\n"), []byte("\n")), []byte("\n"), []byte("\r\n"))
		sum := sha256.Sum256(crlf)
		num, _, _ := strings.Cut(filepath.Base(f), "_")
		v, err := strconv.Atoi(num)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := raw.ExecContext(t.Context(), `UPDATE workers_schema_version SET checksum = $1 WHERE version = $2`, hex.EncodeToString(sum[:]), v); err != nil {
			t.Fatal(err)
		}
	}
	if err := s.Migrate(t.Context()); err != nil {
		t.Fatalf("Migrate over tables a CRLF checkout of the same release migrated: %v", err)
	}
}
