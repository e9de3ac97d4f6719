package bunstore_test

import (
	"context"
	"testing"

	"github.com/nodelane/nodelane/bunstore"
	"github.com/nodelane/nodelane/internal/testdb"
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
