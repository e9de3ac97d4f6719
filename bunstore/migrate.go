package bunstore

import (
	"context"
	"database/sql/driver"
	"embed"
	"errors"
	"fmt"
	"io/fs"
	"time"

	"github.com/uptrace/bun/migrate"
)

//go:embed migrations
var migrationFiles embed.FS

// The tables bun's migrator keeps nodelane's own history and lock in,
// apart from a host's bun_migrations and bun_migration_locks.
const (
	migrationsTable     = "nodelane_migrations"
	migrationLocksTable = "nodelane_migration_locks"
)

// lockRetry is how long a SQLite migrator sleeps between attempts to take
// the migration lock while another process holds it.
const lockRetry = 50 * time.Millisecond

func (db *DB) migrator() (*migrate.Migrator, error) {
	dir := "migrations/sqlite"
	if db.postgres() {
		dir = "migrations/postgres"
	}
	sub, err := fs.Sub(migrationFiles, dir)
	if err != nil {
		return nil, err
	}
	ms := migrate.NewMigrations()
	if err := ms.Discover(sub); err != nil {
		return nil, err
	}
	return migrate.NewMigrator(db.bun, ms,
		migrate.WithTableName(migrationsTable),
		migrate.WithLocksTableName(migrationLocksTable),
		migrate.WithMarkAppliedOnSuccess(true),
	), nil
}

// Migrate applies nodelane's pending migrations; with none pending it
// changes nothing. Concurrent callers, in this process or in others sharing
// the database, are serialised: on PostgreSQL by an advisory lock scoped
// to the current schema, on SQLite by bun's lock row, which Migrate retries;
// either waits at most Config.MigrationLockTimeout. On PostgreSQL the lock
// holds a connection of its own, so the pool must allow two.
func (db *DB) Migrate(ctx context.Context) error {
	m, err := db.migrator()
	if err == nil && db.postgres() {
		err = db.migratePostgres(ctx, m)
	} else if err == nil {
		err = db.migrateSQLite(ctx, m)
	}
	if err != nil {
		return fmt.Errorf("bunstore: migrate: %w", err)
	}
	return nil
}

func (db *DB) migratePostgres(ctx context.Context, m *migrate.Migrator) (err error) {
	// A session-level advisory lock lives as long as its connection, so it
	// is taken on a connection of its own, which stays out of the pool
	// until the lock is released.
	conn, err := db.bun.DB.Conn(ctx)
	if err != nil {
		return err
	}
	defer conn.Close()
	const key = "hashtextextended('nodelane_migrations:' || current_schema(), 0)"
	lockCtx, cancel := context.WithTimeout(ctx, db.cfg.MigrationLockTimeout)
	_, err = conn.ExecContext(lockCtx, "SELECT pg_advisory_lock("+key+")")
	cancel()
	if err != nil {
		return fmt.Errorf("advisory lock: %w", err)
	}
	defer func() {
		// Unlock even when ctx is done. If that fails the connection must
		// not go back to the pool still holding the lock: discard it.
		_, uerr := conn.ExecContext(context.WithoutCancel(ctx), "SELECT pg_advisory_unlock("+key+")")
		if uerr != nil {
			_ = conn.Raw(func(any) error { return driver.ErrBadConn })
			err = errors.Join(err, fmt.Errorf("advisory unlock: %w", uerr))
		}
	}()
	if err := m.Init(ctx); err != nil {
		return err
	}
	// Under the advisory lock no other nodelane migrator runs on this
	// schema, so a lock row is a leftover of a process that crashed.
	if _, err := db.bun.NewDelete().TableExpr(migrationLocksTable).Where("TRUE").Exec(ctx); err != nil {
		return err
	}
	if err := m.Lock(ctx); err != nil {
		return err
	}
	return migrateLocked(ctx, m)
}

func (db *DB) migrateSQLite(ctx context.Context, m *migrate.Migrator) error {
	// CREATE TABLE IF NOT EXISTS is safe to race on SQLite: writers are
	// serialised by the database lock, and the busy timeout waits for it.
	if err := m.Init(ctx); err != nil {
		return err
	}
	lockCtx, cancel := context.WithTimeout(ctx, db.cfg.MigrationLockTimeout)
	defer cancel()
	for {
		err := m.Lock(lockCtx)
		if err == nil {
			break
		}
		if lockCtx.Err() == nil && !isUniqueViolation(err) {
			return err
		}
		t := time.NewTimer(lockRetry)
		select {
		case <-lockCtx.Done():
			t.Stop()
			return fmt.Errorf("waiting for another process's migration (if none is running, delete the row in %s): %w",
				migrationLocksTable, context.Cause(lockCtx))
		case <-t.C:
		}
	}
	return migrateLocked(ctx, m)
}

// migrateLocked migrates and then releases bun's lock row, which the
// caller holds.
func migrateLocked(ctx context.Context, m *migrate.Migrator) (err error) {
	defer func() {
		err = errors.Join(err, m.Unlock(context.WithoutCancel(ctx)))
	}()
	_, err = m.Migrate(ctx)
	return err
}

// ErrMigrationsPending is wrapped by the error of CheckMigrations when a
// migration of this build is not applied to the database.
var ErrMigrationsPending = errors.New("bunstore: migrations pending")

// CheckMigrations reports whether every migration this build embeds is
// applied (workerapi.SchemaChecker, for readiness): nil, or an error
// wrapping ErrMigrationsPending that names the first one pending, or the
// error of reading the migrations table. It reads that table only; it
// never migrates.
func (db *DB) CheckMigrations(ctx context.Context) error {
	m, err := db.migrator()
	if err != nil {
		return fmt.Errorf("bunstore: check migrations: %w", err)
	}
	ms, err := m.MigrationsWithStatus(ctx)
	if err != nil {
		return fmt.Errorf("bunstore: check migrations: %w", err)
	}
	if un := ms.Unapplied(); len(un) > 0 {
		return fmt.Errorf("%w: %d, the first %s", ErrMigrationsPending, len(un), un[0].Name)
	}
	return nil
}
