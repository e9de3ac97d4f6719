package bunstore_test

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/nodelane/nodelane/bunstore"
	"github.com/nodelane/nodelane/internal/testdb"
)

// CheckMigrations is nil on a migrated database, names the migration a
// database lacks, and fails when the database does not answer; it
// migrates nothing.
func TestCheckMigrations(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	for _, d := range testdb.Dialects() {
		t.Run(d.Name, func(t *testing.T) {
			t.Parallel()
			db := open(t, d.New(t))
			if err := db.CheckMigrations(ctx); err != nil {
				t.Fatalf("CheckMigrations on a migrated database: %v", err)
			}
			var last string
			if err := db.Bun().NewRaw("SELECT name FROM nodelane_migrations ORDER BY id DESC LIMIT 1").Scan(ctx, &last); err != nil {
				t.Fatal(err)
			}
			if _, err := db.Bun().NewRaw("DELETE FROM nodelane_migrations WHERE name = ?", last).Exec(ctx); err != nil {
				t.Fatal(err)
			}
			for range 2 { // it does not migrate what it finds pending
				if err := db.CheckMigrations(ctx); !errors.Is(err, bunstore.ErrMigrationsPending) || !strings.Contains(err.Error(), last) {
					t.Fatalf("CheckMigrations with %s unapplied: %v", last, err)
				}
			}
			db.Close()
			if err := db.CheckMigrations(ctx); err == nil || errors.Is(err, bunstore.ErrMigrationsPending) {
				t.Fatalf("CheckMigrations on a closed database: %v", err)
			}
		})
	}
}
