// Package testdb gives tests fresh, empty databases: a SQLite file in the
// test's temporary directory, or a PostgreSQL schema of its own that is
// dropped when the test ends. For tests that each need a database already
// set up (migrated), SQLiteTemplate copies one file set up once, and
// PostgresPool reuses schemas set up once, emptied between tests.
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
	"errors"
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
	conn, base := connect(t)
	defer conn.Close(context.Background())
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()

	name, err := randomSchema()
	if err != nil {
		t.Fatal(err)
	}
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

// PostgresPool hands out PostgreSQL schemas that its setup function
// prepared, and takes each back when its test ends: for tests that each
// need a migrated schema, where migrating every one would cost most of
// their time (a migration is hundreds of milliseconds of DDL; taking a
// schema back, a few statements). Taking a schema back empties its
// tables, puts back the rows setup wrote and sets its sequences as setup
// left them, all copied from a schema of the pool that setup prepared
// and that no test gets; the schema then goes to a later test. A test has
// its schema to itself while it runs, and finds it as setup left it, so
// long as the tests change rows only: a schema whose tables differ from
// the pristine one's when it comes back, or that cannot be emptied, is
// dropped instead. A test must close its handles on the schema before it
// ends, as with Postgres. Close drops every schema of the pool. A
// PostgresPool is safe for concurrent use.
type PostgresPool struct {
	setup func(dsn string) error

	once     sync.Once
	base     string // the server's DSN
	pristine string // the schema no test gets
	err      error

	mu   sync.Mutex
	free []string // schemas taken back
	all  []string // every schema made, pristine included
}

// NewPostgresPool returns a PostgresPool whose schemas setup prepares. It
// gets a DSN of the form Postgres's DB has, to a new, empty schema, and
// must close every handle on it before it returns.
func NewPostgresPool(setup func(dsn string) error) *PostgresPool {
	return &PostgresPool{setup: setup}
}

// New returns a schema of the pool, prepared by setup and holding what
// setup left, which is the test's until it ends. If the server cannot be
// reached the test is skipped, except under CI=true, where it fails.
func (p *PostgresPool) New(t testing.TB) DB {
	t.Helper()
	conn, base := connect(t)
	conn.Close(context.Background())
	p.once.Do(func() {
		p.base = base
		p.pristine, p.err = p.make()
	})
	if p.err != nil {
		t.Fatalf("testdb: pool: %v", p.err)
	}
	p.mu.Lock()
	var name string
	if n := len(p.free); n > 0 {
		name, p.free = p.free[n-1], p.free[:n-1]
	}
	p.mu.Unlock()
	if name == "" {
		var err error
		if name, err = p.make(); err != nil {
			t.Fatalf("testdb: pool: %v", err)
		}
	}
	t.Cleanup(func() {
		if err := p.reset(name); err != nil {
			t.Logf("testdb: schema %s dropped, not reused: %v", name, err)
			if err := p.drop(name); err != nil {
				t.Errorf("testdb: %v", err)
			}
			return
		}
		p.mu.Lock()
		p.free = append(p.free, name)
		p.mu.Unlock()
	})
	dsn, err := withSearchPath(p.base, name)
	if err != nil {
		t.Fatalf("testdb: %v", err)
	}
	return DB{Dialect: "postgres", DSN: dsn}
}

// Close drops every schema of the pool. The pool can be used again
// afterwards only by tests that began before.
func (p *PostgresPool) Close() error {
	p.mu.Lock()
	all := p.all
	p.all, p.free = nil, nil
	p.mu.Unlock()
	var errs []error
	for _, name := range all {
		if err := p.drop(name); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// make creates a schema and runs setup in it.
func (p *PostgresPool) make() (string, error) {
	name, err := randomSchema()
	if err != nil {
		return "", err
	}
	if err := p.exec("CREATE SCHEMA " + pgx.Identifier{name}.Sanitize()); err != nil {
		return "", fmt.Errorf("create schema: %w", err)
	}
	p.mu.Lock()
	p.all = append(p.all, name)
	p.mu.Unlock()
	dsn, err := withSearchPath(p.base, name)
	if err != nil {
		return "", err
	}
	if err := p.setup(dsn); err != nil {
		return "", fmt.Errorf("setup: %w", err)
	}
	return name, nil
}

// resetSQL empties every table of schema $1 and copies the rows of the
// same table of schema $2, the pristine one, into it, then sets every
// sequence of $1 as its namesake in $2 stands; in one transaction. It
// fails if the two schemas' tables differ. It empties the tables with
// DELETE: a test's tables hold a few rows, and TRUNCATE makes new files
// for every table and index (a tenth of a second for nodelane's, against
// a hundredth). When a foreign key refuses a DELETE in the order taken,
// it TRUNCATEs every table at once instead, which needs no order.
const resetSQL = `DO $reset$
DECLARE
	s text := %s;
	p text := %s;
	r record;
BEGIN
	PERFORM set_config('lock_timeout', '10s', true);
	IF (SELECT array_agg(tablename ORDER BY tablename) FROM pg_tables WHERE schemaname = s) IS DISTINCT FROM
		(SELECT array_agg(tablename ORDER BY tablename) FROM pg_tables WHERE schemaname = p) THEN
		RAISE EXCEPTION 'the tables of schema %% differ from those setup made', s;
	END IF;
	BEGIN
		FOR r IN SELECT tablename FROM pg_tables WHERE schemaname = s LOOP
			EXECUTE format('DELETE FROM %%I.%%I', s, r.tablename);
		END LOOP;
	EXCEPTION WHEN foreign_key_violation THEN
		EXECUTE (SELECT 'TRUNCATE ' || string_agg(format('%%I.%%I', s, tablename), ', ') FROM pg_tables WHERE schemaname = s);
	END;
	FOR r IN SELECT tablename FROM pg_tables WHERE schemaname = p LOOP
		EXECUTE format('INSERT INTO %%I.%%I SELECT * FROM %%I.%%I', s, r.tablename, p, r.tablename);
	END LOOP;
	FOR r IN SELECT sequencename, start_value, last_value FROM pg_sequences WHERE schemaname = p LOOP
		PERFORM setval(format('%%I.%%I', s, r.sequencename), COALESCE(r.last_value, r.start_value), r.last_value IS NOT NULL);
	END LOOP;
END
$reset$`

// reset takes schema name back to what setup left.
func (p *PostgresPool) reset(name string) error {
	return p.exec(fmt.Sprintf(resetSQL, quoteLiteral(name), quoteLiteral(p.pristine)))
}

func (p *PostgresPool) drop(name string) error {
	if err := p.exec("DROP SCHEMA IF EXISTS " + pgx.Identifier{name}.Sanitize() + " CASCADE"); err != nil {
		return fmt.Errorf("drop schema %s: %w", name, err)
	}
	return nil
}

// exec runs one statement on a connection of its own.
func (p *PostgresPool) exec(sql string) error {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, p.base)
	if err != nil {
		return err
	}
	defer conn.Close(context.Background())
	_, err = conn.Exec(ctx, sql)
	return err
}

// quoteLiteral quotes a schema name made by randomSchema as a SQL string.
func quoteLiteral(s string) string { return "'" + strings.ReplaceAll(s, "'", "''") + "'" }

// connect connects to the test PostgreSQL server and returns the
// connection and the server's DSN; if the server does not answer, it
// skips t, or fails it under CI=true.
func connect(t testing.TB) (*pgx.Conn, string) {
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
	return conn, base
}

// randomSchema returns a new schema name.
func randomSchema() (string, error) {
	var b [8]byte
	if _, err := rand.Read(b[:]); err != nil {
		return "", err
	}
	return "nl_t_" + hex.EncodeToString(b[:]), nil
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
