// Package testdb gives tests fresh, empty databases: a SQLite file in the
// test's temporary directory, or a PostgreSQL schema of its own that is
// dropped when the test ends.
//
// PostgreSQL is found through NODELANE_TEST_POSTGRES, else at
// postgres://postgres@127.0.0.1:5432/test?sslmode=disable. If it cannot be
// reached the test is skipped, except under CI=true, where it fails.
//
// The helpers return DSNs in the form bunstore.Open takes, so that a test
// can open several handles on one database, as replicas would.
package testdb

import (
	"context"
	"crypto/rand"
	"database/sql"
	"encoding/hex"
	"fmt"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/stdlib"
	"github.com/uptrace/bun"
	"github.com/uptrace/bun/dialect/pgdialect"
	"github.com/uptrace/bun/dialect/sqlitedialect"
	_ "modernc.org/sqlite" // the "sqlite" database/sql driver
)

// PostgresEnv names the environment variable that overrides DefaultPostgres.
const PostgresEnv = "NODELANE_TEST_POSTGRES"

// DefaultPostgres is the PostgreSQL server tests use when PostgresEnv is unset.
const DefaultPostgres = "postgres://postgres@127.0.0.1:5432/test?sslmode=disable"

// DB is a fresh, empty database that lives as long as the test that made it.
type DB struct {
	// Dialect is "sqlite" or "postgres".
	Dialect string
	// DSN opens the database with bunstore.Open: "sqlite:PATH", or a
	// PostgreSQL URL whose search_path is the test's own schema.
	DSN string
}

// Dialect makes fresh databases of one kind.
type Dialect struct {
	Name string
	New  func(testing.TB) DB
}

// Dialects lists every Dialect, SQLite first, for tests that run the same
// cases on each:
//
//	for _, d := range testdb.Dialects() {
//		t.Run(d.Name, func(t *testing.T) { db := d.New(t); ... })
//	}
func Dialects() []Dialect {
	return []Dialect{{"sqlite", SQLite}, {"postgres", Postgres}}
}

// SQLite returns a new SQLite database file in t.TempDir().
func SQLite(t testing.TB) DB {
	t.Helper()
	return DB{Dialect: "sqlite", DSN: "sqlite:" + filepath.Join(t.TempDir(), "nodelane.db")}
}

// SQLiteTemplate makes SQLite databases that start as byte copies of one
// that its setup function prepared, once per process: for tests that each
// need a migrated database, where migrating every one would cost most of
// their time (under the race detector a migration takes ten times a
// copy). Each database is still a file of its own in its test's
// t.TempDir(). A SQLiteTemplate is safe for concurrent use.
type SQLiteTemplate struct {
	setup func(dsn string) error
	once  sync.Once
	image []byte
	err   error
}

// NewSQLiteTemplate returns a SQLiteTemplate whose databases are copies of
// the one setup leaves behind. setup gets a DSN of the form SQLite's DB
// has, to a new, empty database, and must close every handle on it
// before it returns, so that the file holds all of it (no -wal beside
// it). It runs once, when the first database is made.
func NewSQLiteTemplate(setup func(dsn string) error) *SQLiteTemplate {
	return &SQLiteTemplate{setup: setup}
}

// New returns a new SQLite database in t.TempDir(), a copy of the
// template's, with mode 0600 as bunstore creates its files.
func (tp *SQLiteTemplate) New(t testing.TB) DB {
	t.Helper()
	tp.once.Do(func() { tp.image, tp.err = tp.build() })
	if tp.err != nil {
		t.Fatalf("testdb: template: %v", tp.err)
	}
	db := SQLite(t)
	if err := os.WriteFile(strings.TrimPrefix(db.DSN, "sqlite:"), tp.image, 0o600); err != nil {
		t.Fatalf("testdb: %v", err)
	}
	return db
}

// build runs setup on a database in a directory of its own, removed
// afterwards, and returns the database file's bytes.
func (tp *SQLiteTemplate) build() ([]byte, error) {
	dir, err := os.MkdirTemp("", "nodelane-template-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(dir)
	path := filepath.Join(dir, "nodelane.db")
	if err := tp.setup("sqlite:" + path); err != nil {
		return nil, err
	}
	if _, err := os.Stat(path + "-wal"); err == nil {
		return nil, fmt.Errorf("setup left %s-wal: a handle is still open", filepath.Base(path))
	}
	return os.ReadFile(path)
}

// Postgres creates a schema of its own on the test PostgreSQL server and
// returns a DSN that works in it. The schema is dropped, with everything
// in it, when the test ends; close handles on it before then (cleanups
// registered later run earlier).
func Postgres(t testing.TB) DB {
	t.Helper()
	base := os.Getenv(PostgresEnv)
	if base == "" {
		base = DefaultPostgres
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, base)
	if err != nil {
		// err may name the host and user, never the password.
		msg := fmt.Sprintf("testdb: PostgreSQL unreachable (set %s): %v", PostgresEnv, err)
		if os.Getenv("CI") == "true" {
			t.Fatal(msg)
		}
		t.Skip(msg)
	}
	defer conn.Close(context.Background())

	var b [8]byte
	if _, err := rand.Read(b[:]); err != nil {
		t.Fatal(err)
	}
	name := "nl_t_" + hex.EncodeToString(b[:])
	ident := pgx.Identifier{name}.Sanitize()
	if _, err := conn.Exec(ctx, "CREATE SCHEMA "+ident); err != nil {
		t.Fatalf("testdb: create schema: %v", err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		c, err := pgx.Connect(ctx, base)
		if err != nil {
			t.Errorf("testdb: drop schema %s: %v", name, err)
			return
		}
		defer c.Close(context.Background())
		if _, err := c.Exec(ctx, "DROP SCHEMA "+ident+" CASCADE"); err != nil {
			t.Errorf("testdb: drop schema %s: %v", name, err)
		}
	})
	dsn, err := withSearchPath(base, name)
	if err != nil {
		t.Fatalf("testdb: %v", err)
	}
	return DB{Dialect: "postgres", DSN: dsn}
}

// withSearchPath adds search_path to a DSN; pgx sends parameters it does
// not know as run-time parameters when it connects.
func withSearchPath(dsn, schema string) (string, error) {
	if strings.HasPrefix(dsn, "postgres://") || strings.HasPrefix(dsn, "postgresql://") {
		u, err := url.Parse(dsn)
		if err != nil {
			return "", fmt.Errorf("%s is not a URL", PostgresEnv)
		}
		q := u.Query()
		q.Set("search_path", schema)
		u.RawQuery = q.Encode()
		return u.String(), nil
	}
	return dsn + " search_path=" + schema, nil
}

// Bun opens a plain *bun.DB on d, closed when the test ends, for setting
// up or inspecting the database without nodelane's code in between.
func (d DB) Bun(t testing.TB) *bun.DB {
	t.Helper()
	var db *bun.DB
	switch d.Dialect {
	case "sqlite":
		path := strings.TrimPrefix(d.DSN, "sqlite:")
		sqldb, err := sql.Open("sqlite", "file:"+path+"?_pragma=busy_timeout(10000)&_pragma=journal_mode(WAL)&_txlock=immediate")
		if err != nil {
			t.Fatalf("testdb: open %s: %v", path, err)
		}
		db = bun.NewDB(sqldb, sqlitedialect.New())
	case "postgres":
		cfg, err := pgx.ParseConfig(d.DSN)
		if err != nil {
			t.Fatalf("testdb: %v", err)
		}
		db = bun.NewDB(stdlib.OpenDB(*cfg), pgdialect.New())
	default:
		t.Fatalf("testdb: unknown dialect %q", d.Dialect)
	}
	t.Cleanup(func() { db.Close() })
	return db
}
