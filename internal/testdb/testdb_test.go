package testdb

import (
	"context"
	"strings"
	"testing"
)

func TestWithSearchPath(t *testing.T) {
	tests := []struct {
		name, dsn, want string
	}{
		{"url", "postgres://postgres@127.0.0.1:5432/test", "postgres://postgres@127.0.0.1:5432/test?search_path=nl_t_1"},
		{"url with query", "postgresql://u@h/db?sslmode=disable", "postgresql://u@h/db?search_path=nl_t_1&sslmode=disable"},
		{"keywords", "host=h user=u dbname=db", "host=h user=u dbname=db search_path=nl_t_1"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, err := withSearchPath(tc.dsn, "nl_t_1")
			if err != nil || got != tc.want {
				t.Errorf("withSearchPath(%q) = %q, %v; want %q", tc.dsn, got, err, tc.want)
			}
		})
	}
}

// Each database is empty and apart from every other, and a PostgreSQL
// schema is gone once its test ends.
func TestFreshAndDropped(t *testing.T) {
	ctx := context.Background()
	for _, d := range Dialects() {
		t.Run(d.Name, func(t *testing.T) {
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
