package bunstore_test

import (
	"context"
	"testing"
	"time"

	"github.com/nodelane/nodelane/bunstore"
)

// DatabaseTime reads the database server's clock, which here runs on
// this host: it falls between two readings of the local clock, give or
// take the database's resolution.
func TestDatabaseTime(t *testing.T) {
	t.Parallel()
	for _, d := range bunstore.MigratedDialects() {
		t.Run(d.Name, func(t *testing.T) {
			t.Parallel()
			db := open(t, d.New(t))
			before := time.Now()
			got, err := db.DatabaseTime(context.Background())
			after := time.Now()
			if err != nil {
				t.Fatal(err)
			}
			const resolution = time.Millisecond // SQLite's
			if got.Before(before.Add(-resolution)) || got.After(after.Add(resolution)) {
				t.Errorf("DatabaseTime = %v, not within [%v, %v]", got, before, after)
			}
			if got.Location() != time.UTC {
				t.Errorf("DatabaseTime is in %v, want UTC", got.Location())
			}
		})
	}
}
