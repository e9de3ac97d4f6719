package bunstore_test

import (
	"context"
	"database/sql"
	"errors"
	"strings"
	"testing"

	"github.com/nodelane/nodelane/bunstore"
	"github.com/nodelane/nodelane/fingerprint"
	"github.com/nodelane/nodelane/internal/testdb"
)

// A transaction the database aborts gives fingerprint.ErrAborted, so that
// the caller can tell it from a store that could not answer.
func TestFingerprintStoreAborted(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := open(t, testdb.Postgres(t))
	s := db.FingerprintStore()
	f := fingerprint.Fingerprint{Kind: fingerprint.KindPepper, ID: "1", Value: strings.Repeat("ab", 32)}

	tx, err := db.Bun().BeginTx(ctx, &sql.TxOptions{Isolation: sql.LevelRepeatableRead})
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback()
	tctx := bunstore.WithTx(ctx, tx)
	if _, err := s.Add(tctx, nil); err != nil { // takes the snapshot
		t.Fatal(err)
	}
	if _, err := s.Add(ctx, []fingerprint.Fingerprint{f}); err != nil {
		t.Fatal(err)
	}
	// The row another transaction committed after the snapshot conflicts
	// with this insert: PostgreSQL aborts a REPEATABLE READ transaction.
	_, err = s.Add(tctx, []fingerprint.Fingerprint{f})
	if !errors.Is(err, fingerprint.ErrAborted) {
		t.Fatalf("Add of a key committed after the snapshot: %v, want %v", err, fingerprint.ErrAborted)
	}
}
