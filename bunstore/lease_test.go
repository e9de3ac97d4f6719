package bunstore_test

import (
	"context"
	"testing"

	"github.com/nodelane/nodelane/bunstore"
	"github.com/nodelane/nodelane/internal/testdb"
	"github.com/nodelane/nodelane/lease"
	"github.com/nodelane/nodelane/lease/leasetest"
)

// open opens and migrates the database d, closed when the test ends.
func open(t testing.TB, d testdb.DB) *bunstore.DB {
	t.Helper()
	db, err := bunstore.Open(context.Background(), d.DSN, nil)
	if err != nil {
		t.Fatalf("Open(%s): %v", d.Dialect, err)
	}
	t.Cleanup(func() {
		if err := db.Close(); err != nil {
			t.Errorf("Close: %v", err)
		}
	})
	return db
}

func TestLeaseStore(t *testing.T) {
	t.Parallel()
	for _, d := range bunstore.MigratedDialects() {
		t.Run(d.Name, func(t *testing.T) {
			t.Parallel()
			leasetest.Run(t, func(t *testing.T) lease.Store {
				return open(t, d.New(t)).LeaseStore()
			})
		})
	}
}
