package bunstore

import (
	"context"
	"fmt"
	"os"
	"testing"
	"time"

	"github.com/uptrace/bun"

	"github.com/nodelane/nodelane/internal/testdb"
)

// SetObserver sets the function that sees every statement bunstore runs
// past bun (the bound hot statements), which bun's query hooks miss.
func SetObserver(db *DB, f func(ctx context.Context, query string)) { db.observer = f }

// SetCacheClock sets the clock the DB's read cache ages its entries by.
func SetCacheClock(db *DB, now func() time.Time) { db.cache.now = now }

// WriteWaiters returns how many writes wait for db's SQLite write slot,
// held up by a write or a transaction that holds it.
func WriteWaiters(db *DB) int { return int(db.slotWaiters.Load()) }

// TxFrom returns the transaction ctx carries, if any.
func TxFrom(ctx context.Context) (bun.Tx, bool) { return txFrom(ctx) }

// migrateDSN opens the database dsn, which migrates it, and closes it.
func migrateDSN(dsn string) error {
	db, err := Open(context.Background(), dsn, nil)
	if err != nil {
		return err
	}
	return db.Close()
}

// Migrated makes SQLite databases that start migrated: copies of one that
// Open migrated once per test binary, so that a test's store costs a
// file copy rather than a migration. Open on a copy checks the
// migrations and finds them done.
var Migrated = testdb.NewSQLiteTemplate(migrateDSN)

// MigratedPostgres hands out migrated PostgreSQL schemas, each emptied
// and reused when its test ends, so that a test's store costs a few
// statements rather than a migration. TestMain drops them.
var MigratedPostgres = testdb.NewPostgresPool(migrateDSN)

// MigratedDialects is testdb.Dialects with migrated databases from
// Migrated and MigratedPostgres, for the tests of the stores. Tests of the
// migrations themselves, or that change the schema, use empty databases
// (testdb.Dialects).
func MigratedDialects() []testdb.Dialect {
	return []testdb.Dialect{{Name: "sqlite", New: Migrated.New}, {Name: "postgres", New: MigratedPostgres.New}}
}

// TestMain drops MigratedPostgres's schemas once every test ended.
func TestMain(m *testing.M) {
	code := m.Run()
	if err := MigratedPostgres.Close(); err != nil {
		fmt.Fprintln(os.Stderr, "bunstore: dropping the test schemas:", err)
		code = max(code, 1)
	}
	os.Exit(code)
}

// SharedQueued returns how many InSharedTx calls queue for a shared
// transaction.
func SharedQueued(db *DB) int {
	db.shared.mu.Lock()
	defer db.shared.mu.Unlock()
	return len(db.shared.queue)
}
