package sqlcore

import (
	"cmp"
	"context"
	"database/sql"
	"errors"
	"fmt"
	"hash/fnv"
	"io/fs"
	"path"
	"slices"
	"strconv"
	"strings"
)

// ErrSchemaTooNew is returned by Migrate when the database's schema
// version is newer than any migration this code knows: a newer release
// migrated it, and this one would fail on columns it does not know.
var ErrSchemaTooNew = errors.New("schema is newer than this release knows")

// migration is one versioned schema file.
type migration struct {
	version int
	name    string
	sql     string
}

// Migrate creates the tables or brings them up to date, and is a no-op
// when they are current. It runs in one transaction that first takes the
// dialect's migration lock, so processes migrating at once apply each
// version exactly once; the applied versions are kept in the
// {prefix}schema_version table. A database already at a version newer
// than the newest migration is refused with ErrSchemaTooNew, untouched.
func (s *Store) Migrate(ctx context.Context) error {
	migs, err := loadMigrations(s.d.Migrations)
	if err != nil {
		return s.wrap("migrate", err)
	}
	return s.inTx(ctx, func(tx *sql.Tx) error {
		if s.d.MigrationLock != "" {
			if _, err := tx.ExecContext(ctx, s.d.MigrationLock, s.lockKey()); err != nil {
				return s.wrap("migrate: lock", err)
			}
		}
		if _, err := tx.ExecContext(ctx, s.q.createVersions); err != nil {
			return s.wrap("migrate", err)
		}
		var cur int
		if err := tx.QueryRowContext(ctx, s.q.version).Scan(&cur); err != nil {
			return s.wrap("migrate: read version", err)
		}
		if known := migs[len(migs)-1].version; cur > known {
			return s.wrap("migrate", fmt.Errorf("%w: the database is at version %d, this release knows versions up to %d; upgrade the code or use another table prefix",
				ErrSchemaTooNew, cur, known))
		}
		for _, m := range migs {
			if m.version <= cur {
				continue
			}
			if _, err := tx.ExecContext(ctx, s.cfg.expand(m.sql)); err != nil {
				return s.wrap(fmt.Sprintf("migrate: version %d (%s)", m.version, m.name), err)
			}
			if _, err := tx.ExecContext(ctx, s.q.recordVersion, m.version, m.name); err != nil {
				return s.wrap("migrate: record version", err)
			}
		}
		return nil
	})
}

// lockKey names the store's tables for the migration lock.
func (s *Store) lockKey() int64 {
	h := fnv.New64a()
	h.Write([]byte("taskgate/workers:" + s.cfg.Schema + "." + s.cfg.Prefix))
	return int64(h.Sum64())
}

// loadMigrations reads the migrations/NNNN_name.sql files of fsys in
// version order.
func loadMigrations(fsys fs.FS) ([]migration, error) {
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
		migs = append(migs, migration{version: v, name: name, sql: string(text)})
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
	return migs, nil
}
