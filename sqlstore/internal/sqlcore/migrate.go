package sqlcore

import (
	"cmp"
	"context"
	"crypto/sha256"
	"database/sql"
	"encoding/hex"
	"errors"
	"fmt"
	"hash/fnv"
	"io/fs"
	"math/rand/v2"
	"path"
	"slices"
	"strconv"
	"strings"
	"time"
)

// ErrSchemaTooNew is returned by Migrate when the database's schema
// version is newer than any migration this code knows, and a version it
// does not know was not recorded as compatible with its code: a newer
// release migrated it, and this one could fail on what it changed.
var ErrSchemaTooNew = errors.New("schema is newer than this release knows")

// ErrSchemaMismatch is returned by Migrate when the tables do not match
// the migrations recorded as applied: a migration file was edited after it
// was applied (its checksum differs), a recorded version has no file, or a
// table or column the store needs is missing.
var ErrSchemaMismatch = errors.New("schema does not match its recorded migrations")

// ErrNoSchema is returned, wrapped, by Migrate and by every other call
// of a store whose Config names a schema that does not exist (where the
// dialect can tell: Dialect.SchemaExists). Migrate does not create it.
var ErrNoSchema = errors.New("no such schema")

// migration is one versioned schema file.
type migration struct {
	version  int
	name     string
	sql      string
	checksum string // hex SHA-256 of the file's text, its line endings LF
	// also are the checksums a build from a checkout with other line
	// endings (CRLF, as Git for Windows checks files out by default)
	// recorded for the same file: the same SQL.
	also []string
	// compatibleFrom is the oldest version whose code can use the tables
	// once this one is applied: Dialect.CompatibleFrom's, or version.
	compatibleFrom int
}

// Migrate creates the tables or brings them up to date, and is a no-op
// when they are current. It runs in one transaction that first lifts
// the session's limits (Dialect.MigrationBegin) and takes the dialect's
// migration lock, so processes migrating at once apply each version
// exactly once; the applied versions are kept in the
// {prefix}schema_version table, each with the oldest version whose code
// can use the tables it leaves. A database already at versions newer
// than the newest migration is accepted when each of them was recorded
// as compatible with this code, and is otherwise refused with
// ErrSchemaTooNew, untouched.
func (s *Store) Migrate(ctx context.Context) error {
	return s.migrate(ctx, int(^uint(0)>>1))
}

// migrate is Migrate applying the versions up to upTo only; tests use it
// to build an older schema.
func (s *Store) migrate(ctx context.Context, upTo int) error {
	migs, err := loadMigrations(s.d.Migrations, s.d.CompatibleFrom)
	if err != nil {
		return s.wrap(ctx, "migrate", err)
	}
	backoff := migrateBackoffMin
	for {
		err := s.migrateOnce(ctx, migs, upTo)
		busy := s.d.LockBusy != nil && s.d.LockBusy(err)
		deadlock := s.d.Deadlock != nil && s.d.Deadlock(err)
		if err == nil || !busy && !deadlock {
			return err
		}
		// A transaction held a lock the migration needs, or waited for
		// one the migration held while the migration waited for it:
		// the migration let the others go, and tries again.
		if !Sleep(ctx, backoff/2+rand.N(backoff/2+1)) {
			return fmt.Errorf("%w (last try: %w)", ctx.Err(), err)
		}
		backoff = min(2*backoff, migrateBackoffMax)
	}
}

// Backoff of a migration that could not take a lock on the tables in
// time (see Dialect.MigrationLockWait), or was cancelled to break a
// deadlock (Dialect.Deadlock).
const (
	migrateBackoffMin = 100 * time.Millisecond
	migrateBackoffMax = 5 * time.Second
)

// Sleep waits d, or until ctx ends, and reports whether it waited d.
func Sleep(ctx context.Context, d time.Duration) bool {
	timer := time.NewTimer(d)
	defer timer.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-timer.C:
		return true
	}
}

// migrateOnce is one try of migrate, in one transaction.
func (s *Store) migrateOnce(ctx context.Context, migs []migration, upTo int) error {
	return s.inTxWith(ctx, s.d.MigrationTx, func(tx *sql.Tx) error {
		if s.d.MigrationBegin != "" {
			if _, err := tx.ExecContext(ctx, s.d.MigrationBegin); err != nil {
				return s.wrap(ctx, "migrate", err)
			}
		}
		if err := s.schemaExists(ctx, tx, "migrate"); errors.Is(err, ErrNoSchema) {
			return err
		} else if err != nil {
			// A lost connection, say: ErrUnavailable, reported as any
			// other statement's (Config.Lost).
			return s.wrap(ctx, fmt.Sprintf("migrate: schema %q", s.cfg.Schema), err)
		}
		if s.d.MigrationLock != "" {
			if _, err := tx.ExecContext(ctx, s.d.MigrationLock, s.lockKey()); err != nil {
				return s.wrap(ctx, "migrate: lock", err)
			}
		}
		if s.d.MigrationLockWait != "" {
			if _, err := tx.ExecContext(ctx, s.d.MigrationLockWait); err != nil {
				return s.wrap(ctx, "migrate: lock wait", err)
			}
		}
		done, err := s.checkApplied(ctx, tx, migs)
		if err != nil {
			return err
		}
		for _, m := range migs {
			if m.version > upTo {
				break
			}
			if done[m.version] {
				continue // a version is applied once, even one numbered below a later one applied first
			}
			if _, err := tx.ExecContext(ctx, s.cfg.expand(m.sql)); err != nil {
				return s.wrap(ctx, fmt.Sprintf("migrate: version %d (%s)", m.version, m.name), err)
			}
			if _, err := tx.ExecContext(ctx, s.q.recordVersion, m.version, m.name, m.checksum, m.compatibleFrom); err != nil {
				return s.wrap(ctx, "migrate: record version", err)
			}
		}
		// Every statement the store runs reads its tables' columns; one
		// that matches no row proves they are all there. (An older
		// schema, built for a test, lacks some by design.)
		if upTo < migs[len(migs)-1].version {
			return nil
		}
		for _, probe := range s.q.probes {
			if _, err := tx.ExecContext(ctx, probe); err != nil {
				return s.wrap(ctx, "migrate", fmt.Errorf("%w: the tables lack what the store needs: %w", ErrSchemaMismatch, err))
			}
		}
		return nil
	})
}

// checkApplied creates the version table if need be and compares the
// versions recorded in it with migs: it returns an error for a version
// newer than migs know that was not recorded as compatible with them
// (ErrSchemaTooNew), or for one whose file is gone or was edited
// (ErrSchemaMismatch). A version table from before checksums, or before
// compatibility, gains the column, and the versions recorded without
// them get their files' values now. It returns the set of applied
// versions.
func (s *Store) checkApplied(ctx context.Context, tx *sql.Tx, migs []migration) (map[int]bool, error) {
	// The table is created only if it cannot be read: a role that may
	// use current tables but create none migrates them (a no-op) too.
	if err := s.ensureVersions(ctx, tx, s.q.readVersions, s.q.createVersions); err != nil {
		return nil, err
	}
	if err := s.ensureVersions(ctx, tx, s.q.readChecksum, s.q.addChecksum); err != nil {
		return nil, err
	}
	if err := s.ensureVersions(ctx, tx, s.q.readCompatible, s.q.addCompatible); err != nil {
		return nil, err
	}
	rows, err := tx.QueryContext(ctx, s.q.applied)
	if err != nil {
		return nil, s.wrap(ctx, "migrate: read versions", err)
	}
	type applied struct {
		version        int
		name, checksum string
		compatibleFrom sql.NullInt64
	}
	var done []applied
	for rows.Next() {
		var a applied
		if err := rows.Scan(&a.version, &a.name, &a.checksum, &a.compatibleFrom); err != nil {
			rows.Close()
			return nil, s.wrap(ctx, "migrate: read versions", err)
		}
		done = append(done, a)
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return nil, s.wrap(ctx, "migrate: read versions", err)
	}
	known := migs[len(migs)-1].version
	seen := make(map[int]bool, len(done))
	for _, a := range done {
		seen[a.version] = true
		if a.version > known {
			// Written by a newer release, which recorded whether the
			// code of this one can use what it did; NULL, written by a
			// release that kept no such record, says it cannot.
			if needs := cmp.Or(a.compatibleFrom.Int64, int64(a.version)); needs > int64(known) {
				return nil, s.wrap(ctx, "migrate", fmt.Errorf("%w: the database is at version %d, and its version %d (%s) needs code that knows version %d; this release knows versions up to %d; upgrade the code or use another table prefix",
					ErrSchemaTooNew, done[len(done)-1].version, a.version, a.name, needs, known))
			}
			continue
		}
		i := slices.IndexFunc(migs, func(m migration) bool { return m.version == a.version })
		switch {
		case i < 0:
			return nil, s.wrap(ctx, "migrate", fmt.Errorf("%w: version %d (%s) is recorded as applied, but this release has no such migration", ErrSchemaMismatch, a.version, a.name))
		case a.checksum == "":
			if _, err := tx.ExecContext(ctx, s.q.setChecksum, a.version, migs[i].checksum); err != nil {
				return nil, s.wrap(ctx, "migrate: record checksum", err)
			}
		case a.checksum != migs[i].checksum && !slices.Contains(migs[i].also, a.checksum):
			return nil, s.wrap(ctx, "migrate", fmt.Errorf("%w: version %d (%s) was applied from a file that differs from this release's", ErrSchemaMismatch, a.version, a.name))
		}
		// A row recorded without the column gets it; one recorded as
		// usable by older code than this release says is corrected. A
		// record is only ever raised, so that two releases in a rollout
		// never undo each other's.
		if !a.compatibleFrom.Valid || a.compatibleFrom.Int64 < int64(migs[i].compatibleFrom) {
			if _, err := tx.ExecContext(ctx, s.q.setCompatible, a.version, migs[i].compatibleFrom); err != nil {
				return nil, s.wrap(ctx, "migrate: record compatibility", err)
			}
		}
	}
	return seen, nil
}

// ensureVersions runs add, which creates the version table or adds a
// column to it that older releases made it without, unless read, a
// statement that selects what add makes, succeeds. The savepoint keeps
// the transaction usable after the failed read.
func (s *Store) ensureVersions(ctx context.Context, tx *sql.Tx, read, add string) error {
	if _, err := tx.ExecContext(ctx, "SAVEPOINT version_column"); err != nil {
		return s.wrap(ctx, "migrate", err)
	}
	if _, readErr := tx.ExecContext(ctx, read); readErr != nil {
		if ctx.Err() != nil {
			return s.wrap(ctx, "migrate", readErr)
		}
		if _, err := tx.ExecContext(ctx, "ROLLBACK TO SAVEPOINT version_column"); err != nil {
			return s.wrap(ctx, "migrate", errors.Join(readErr, err))
		}
		// The read failed for want of the column, or for another
		// reason, which the add then fails on too: both are told.
		if _, err := tx.ExecContext(ctx, add); err != nil {
			return s.wrap(ctx, "migrate: the version table", errors.Join(readErr, err))
		}
	}
	if _, err := tx.ExecContext(ctx, "RELEASE SAVEPOINT version_column"); err != nil {
		return s.wrap(ctx, "migrate", err)
	}
	return nil
}

// lockKey names the store's tables for the migration lock.
func (s *Store) lockKey() int64 {
	h := fnv.New64a()
	h.Write([]byte("taskgate/workers:" + s.cfg.Schema + "." + s.cfg.Prefix))
	return int64(h.Sum64())
}

// checksum is the hex SHA-256 of text.
func checksum(text string) string {
	sum := sha256.Sum256([]byte(text))
	return hex.EncodeToString(sum[:])
}

// loadMigrations reads the migrations/NNNN_name.sql files of fsys in
// version order, with the compatibility compatible declares for them
// (see Dialect.CompatibleFrom).
func loadMigrations(fsys fs.FS, compatible map[int]int) ([]migration, error) {
	names, err := fs.Glob(fsys, "migrations/*.sql")
	if err != nil {
		return nil, err
	}
	var migs []migration
	for _, file := range names {
		num, name, ok := strings.Cut(strings.TrimSuffix(path.Base(file), ".sql"), "_")
		v, err := strconv.Atoi(num)
		if !ok || err != nil || v <= 0 {
			return nil, fmt.Errorf("migration file %q: want NNNN_name.sql", file)
		}
		text, err := fs.ReadFile(fsys, file)
		if err != nil {
			return nil, err
		}
		lf := strings.ReplaceAll(string(text), "\r\n", "\n")
		m := migration{version: v, name: name, sql: string(text), checksum: checksum(lf), compatibleFrom: v}
		for _, sum := range []string{checksum(string(text)), checksum(strings.ReplaceAll(lf, "\n", "\r\n"))} {
			if sum != m.checksum && !slices.Contains(m.also, sum) {
				m.also = append(m.also, sum)
			}
		}
		migs = append(migs, m)
	}
	slices.SortFunc(migs, func(a, b migration) int { return cmp.Compare(a.version, b.version) })
	for i := 1; i < len(migs); i++ {
		if migs[i].version == migs[i-1].version {
			return nil, fmt.Errorf("two migrations with version %d", migs[i].version)
		}
	}
	if len(migs) == 0 {
		return nil, fmt.Errorf("no migrations")
	}
	for v, from := range compatible {
		i := slices.IndexFunc(migs, func(m migration) bool { return m.version == v })
		if i < 0 || from < 1 || from >= v {
			return nil, fmt.Errorf("migration %d compatible from version %d: want a migration's version and an older one", v, from)
		}
		migs[i].compatibleFrom = from
	}
	return migs, nil
}
