package apitest

import (
	"context"
	"errors"
	"testing"

	"github.com/nodelane/nodelane/bunstore"
	"github.com/nodelane/nodelane/internal/testdb"
)

// SQLite returns a fresh SQLite database in the test's temporary
// directory, as testdb.SQLite does, that already holds nodelane's schema:
// a copy of a database that bunstore migrated once in this test binary
// (testdb.SQLiteTemplate). bunstore.Open on it finds every migration
// applied. Migrating takes a fifth of a second of CPU under the race
// detector and copying a fiftieth, which matters to suites that open
// hundreds of databases. Each copy is a file of its own: tests that use
// it own their data.
func SQLite(t testing.TB) testdb.DB {
	t.Helper()
	return migratedSQLite.New(t)
}

// migratedSQLite makes SQLite's copies.
var migratedSQLite = testdb.NewSQLiteTemplate(func(dsn string) error {
	ctx := context.Background()
	db, err := bunstore.Open(ctx, dsn, nil)
	if err != nil {
		return err
	}
	// Fold the write-ahead log into the file, which is what is copied.
	_, err = db.Bun().ExecContext(ctx, "PRAGMA wal_checkpoint(TRUNCATE)")
	return errors.Join(err, db.Close())
})
