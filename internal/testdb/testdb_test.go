package testdb

import (
	"context"
	"database/sql"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
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
