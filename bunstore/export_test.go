package bunstore

import (
	"context"
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

// Migrated makes SQLite databases that start migrated: copies of one that
// Open migrated once per test binary, so that a test's store costs a
// file copy rather than a migration. Open on a copy checks the
// migrations and finds them done. Tests of the migrations themselves use
// empty databases (testdb.Dialects).
var Migrated = testdb.NewSQLiteTemplate(func(dsn string) error {
	db, err := Open(context.Background(), dsn, nil)
	if err != nil {
		return err
	}
	return db.Close()
})

// MigratedDialects is testdb.Dialects with SQLite databases from Migrated.
func MigratedDialects() []testdb.Dialect {
	return []testdb.Dialect{{Name: "sqlite", New: Migrated.New}, {Name: "postgres", New: testdb.Postgres}}
}
