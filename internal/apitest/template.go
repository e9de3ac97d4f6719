package apitest

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/nodelane/nodelane/bunstore"
	"github.com/nodelane/nodelane/internal/testdb"
)

// SQLite returns a fresh SQLite database in the test's temporary
// directory, as testdb.SQLite does, that already holds nodelane's schema:
// a copy of a database that bunstore migrated once in this test binary.
// bunstore.Open on it finds every migration applied. Migrating takes a
// fifth of a second of CPU under the race detector and copying a
// fiftieth, which matters to suites that open hundreds of databases.
// Each copy is a file of its own: tests that use it own their data.
func SQLite(t testing.TB) testdb.DB {
	t.Helper()
	data, err := migrated()
	if err != nil {
		t.Fatalf("apitest: the migrated SQLite database: %v", err)
	}
	db := testdb.SQLite(t)
	// 0600, as bunstore creates a database file.
	if err := os.WriteFile(strings.TrimPrefix(db.DSN, "sqlite:"), data, 0o600); err != nil {
		t.Fatalf("apitest: copying the migrated SQLite database: %v", err)
	}
	return db
}

// template is the file of a SQLite database that bunstore migrated, made
// once by migrated and never changed after.
var template struct {
	once sync.Once
	data []byte
	err  error
}

// migrated returns the file of a SQLite database that bunstore created
// and migrated, with its write-ahead log folded in.
func migrated() ([]byte, error) {
	template.once.Do(func() {
		template.data, template.err = migrate()
	})
	return template.data, template.err
}

func migrate() (_ []byte, err error) {
	dir, err := os.MkdirTemp("", "nodelane-apitest-")
	if err != nil {
		return nil, err
	}
	defer func() { err = errors.Join(err, os.RemoveAll(dir)) }()
	path := filepath.Join(dir, "nodelane.db")
	ctx := context.Background()
	db, err := bunstore.Open(ctx, "sqlite:"+path, nil)
	if err != nil {
		return nil, err
	}
	_, err = db.Bun().ExecContext(ctx, "PRAGMA wal_checkpoint(TRUNCATE)")
	if err = errors.Join(err, db.Close()); err != nil {
		return nil, err
	}
	// Closing the last connection removes an empty log; one left over
	// would hold part of the schema, which a copy of the file lacks.
	if fi, err := os.Stat(path + "-wal"); err == nil && fi.Size() > 0 {
		return nil, fmt.Errorf("%s-wal holds %d bytes after the checkpoint", path, fi.Size())
	}
	return os.ReadFile(path)
}
