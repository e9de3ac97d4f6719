package testdb

import (
	"context"
	"database/sql"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/uptrace/bun"
)

// TestWithSearchPath checks that the schema is added to both forms of
// DSN.
func TestWithSearchPath(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name, dsn, want string
	}{
		{"url", "postgres://postgres@127.0.0.1:5432/test", "postgres://postgres@127.0.0.1:5432/test?search_path=nl_t_1"},
		{"url with query", "postgresql://u@h/db?sslmode=disable", "postgresql://u@h/db?search_path=nl_t_1&sslmode=disable"},
		{"keywords", "host=h user=u dbname=db", "host=h user=u dbname=db search_path=nl_t_1"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			got, err := withSearchPath(tc.dsn, "nl_t_1")
			if err != nil || got != tc.want {
				t.Errorf("withSearchPath(%q) = %q, %v; want %q", tc.dsn, got, err, tc.want)
			}
		})
	}
}

// TestFreshAndDropped checks that each database is empty and apart from
// every other, and that a PostgreSQL schema is gone once its test ends.
func TestFreshAndDropped(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	for _, d := range Dialects() {
		t.Run(d.Name, func(t *testing.T) {
			t.Parallel()
			var first DB
			t.Run("use", func(t *testing.T) {
				first = d.New(t)
				second := d.New(t)
				if first.DSN == second.DSN || first.Dialect != d.Name {
					t.Fatalf("two databases share a DSN: %+v %+v", first, second)
				}
				a, b := first.Bun(t), second.Bun(t)
				if _, err := a.ExecContext(ctx, "CREATE TABLE t (x INTEGER)"); err != nil {
					t.Fatal(err)
				}
				// The same name is free in the other database.
				if _, err := b.ExecContext(ctx, "CREATE TABLE t (x INTEGER)"); err != nil {
					t.Fatal(err)
				}
				if d.Name == "postgres" {
					var schema string
					if err := a.QueryRowContext(ctx, "SELECT current_schema()").Scan(&schema); err != nil {
						t.Fatal(err)
					}
					if !strings.HasPrefix(schema, "nl_t_") || !strings.Contains(first.DSN, "search_path="+schema) {
						t.Fatalf("current_schema() = %q with DSN %q", schema, first.DSN)
					}
				}
			})
			if d.Name != "postgres" || first.DSN == "" {
				return
			}
			schema := first.DSN[strings.Index(first.DSN, "search_path=")+len("search_path="):]
			schema, _, _ = strings.Cut(schema, "&")
			admin := Postgres(t).Bun(t)
			var n int
			if err := admin.QueryRowContext(ctx, "SELECT count(*) FROM information_schema.schemata WHERE schema_name = ?", schema).Scan(&n); err != nil {
				t.Fatal(err)
			}
			if n != 0 {
				t.Errorf("schema %s outlived its test", schema)
			}
		})
	}
}

// TestSQLiteTemplate checks that a template's setup runs once, and that
// each database starts as its copy and is apart from every other.
func TestSQLiteTemplate(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	var setups atomic.Int32
	tp := NewSQLiteTemplate(func(dsn string) error {
		setups.Add(1)
		db := DB{Dialect: "sqlite", DSN: dsn}.Bun(t)
		defer db.Close()
		_, err := db.ExecContext(ctx, "CREATE TABLE t (x INTEGER); INSERT INTO t VALUES (7)")
		return err
	})
	var wg sync.WaitGroup
	dbs := make([]DB, 4)
	for i := range dbs {
		wg.Go(func() { dbs[i] = tp.New(t) })
	}
	wg.Wait()
	if n := setups.Load(); n != 1 {
		t.Fatalf("setup ran %d times, want once", n)
	}
	for i, d := range dbs {
		st, err := os.Stat(strings.TrimPrefix(d.DSN, "sqlite:"))
		if err != nil || st.Mode().Perm() != 0o600 {
			t.Fatalf("database %d: %v, mode %v; want mode 0600", i, err, st.Mode().Perm())
		}
		b := d.Bun(t)
		if _, err := b.ExecContext(ctx, "INSERT INTO t VALUES (?)", i); err != nil {
			t.Fatal(err)
		}
		var n, sum int
		if err := b.QueryRowContext(ctx, "SELECT count(*), sum(x) FROM t").Scan(&n, &sum); err != nil {
			t.Fatal(err)
		}
		if n != 2 || sum != 7+i {
			t.Errorf("database %d holds %d rows summing to %d, want the template's row and its own", i, n, sum)
		}
	}
}

// TestSQLiteTemplateOpenHandle checks that a setup that leaves a handle
// open, so that its file may lack what the handle wrote, fails the test
// that asked for a copy.
func TestSQLiteTemplateOpenHandle(t *testing.T) {
	t.Parallel()
	var open *sql.DB
	t.Cleanup(func() {
		if open != nil {
			open.Close()
		}
	})
	tp := NewSQLiteTemplate(func(dsn string) error {
		db := DB{Dialect: "sqlite", DSN: dsn}.Bun(t)
		open = db.DB
		_, err := db.ExecContext(context.Background(), "CREATE TABLE t (x INTEGER)")
		return err
	})
	if _, err := tp.build(); err == nil || !strings.Contains(err.Error(), "still open") {
		t.Fatalf("build = %v, want an error naming the open handle", err)
	}
}

// TestPostgresPool checks that a pool's schema comes back to a later test
// as setup left it (its rows, its sequences), that one whose tables a test
// changed is dropped rather than reused, and that Close drops them all.
func TestPostgresPool(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	var setups atomic.Int32
	p := NewPostgresPool(func(dsn string) error {
		setups.Add(1)
		db := DB{Dialect: "postgres", DSN: dsn}.Bun(t)
		defer db.Close()
		_, err := db.ExecContext(ctx, "CREATE TABLE parent (id BIGINT GENERATED BY DEFAULT AS IDENTITY PRIMARY KEY, v TEXT); "+
			"CREATE TABLE child (parent_id BIGINT REFERENCES parent (id)); INSERT INTO parent (v) VALUES ('setup')")
		return err
	})
	schemaOf := func(d DB) string {
		s := d.DSN[strings.Index(d.DSN, "search_path=")+len("search_path="):]
		s, _, _ = strings.Cut(s, "&")
		return s
	}
	// rows returns the values in parent, and the id the next row gets.
	rows := func(t *testing.T, d DB) ([]string, int64) {
		t.Helper()
		db := d.Bun(t)
		defer db.Close()
		var vs []string
		if err := db.NewRaw("SELECT v FROM parent ORDER BY id").Scan(ctx, &vs); err != nil {
			t.Fatal(err)
		}
		var next int64
		if err := db.QueryRowContext(ctx, "INSERT INTO parent (v) VALUES ('probe') RETURNING id").Scan(&next); err != nil {
			t.Fatal(err)
		}
		if _, err := db.ExecContext(ctx, "INSERT INTO child VALUES (?)", next); err != nil {
			t.Fatal(err)
		}
		return vs, next
	}
	var first string
	for i := range 3 {
		t.Run("use", func(t *testing.T) {
			d := p.New(t)
			if i == 0 {
				first = schemaOf(d)
			} else if s := schemaOf(d); s != first {
				t.Errorf("use %d got schema %s, want %s back", i, s, first)
			}
			vs, next := rows(t, d)
			if len(vs) != 1 || vs[0] != "setup" || next != 2 {
				t.Errorf("use %d found rows %q and next id %d, want setup's row and id 2", i, vs, next)
			}
		})
	}
	t.Run("change the tables", func(t *testing.T) {
		d := p.New(t)
		db := d.Bun(t)
		defer db.Close()
		if _, err := db.ExecContext(ctx, "CREATE TABLE extra (x INTEGER)"); err != nil {
			t.Fatal(err)
		}
	})
	t.Run("after a change", func(t *testing.T) {
		d := p.New(t)
		if s := schemaOf(d); s == first {
			t.Errorf("schema %s, whose tables a test changed, was handed out again", s)
		}
		if vs, next := rows(t, d); len(vs) != 1 || next != 2 {
			t.Errorf("a new schema has rows %q and next id %d, want setup's row and id 2", vs, next)
		}
	})
	if n := setups.Load(); n != 3 {
		t.Errorf("setup ran %d times, want 3 (the pristine schema, the first, and the one that replaced it)", n)
	}
	if err := p.Close(); err != nil {
		t.Fatal(err)
	}
	admin := Postgres(t).Bun(t)
	var n int
	if err := admin.QueryRowContext(ctx, "SELECT count(*) FROM information_schema.schemata WHERE schema_name IN (?)",
		bun.List([]string{first, p.pristine})).Scan(&n); err != nil {
		t.Fatal(err)
	}
	if n != 0 {
		t.Errorf("%d schemas of the pool outlived Close", n)
	}
}
