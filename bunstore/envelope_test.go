package bunstore_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/nodelane/nodelane/bunstore"
	"github.com/nodelane/nodelane/envelope"
	"github.com/nodelane/nodelane/envelope/envelopetest"
)

// Two handles on one database stand for two replicas.
func TestEnvelopeStoreReplicas(t *testing.T) {
	t.Parallel()
	for _, d := range bunstore.MigratedDialects() {
		t.Run(d.Name, func(t *testing.T) {
			t.Parallel()
			envelopetest.RunShared(t, func(t *testing.T) (envelope.Store, envelope.Store) {
				db := d.New(t)
				return open(t, db).EnvelopeStore(), open(t, db).EnvelopeStore()
			})
		})
	}
}

// A change made in a transaction that rolls back leaves neither the state
// nor the history changed; one that commits keeps both, and the Gate's
// reads in the transaction see it.
func TestEnvelopeInTx(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	now := time.Date(2026, 11, 30, 9, 0, 0, 0, time.UTC)
	for _, d := range bunstore.MigratedDialects() {
		t.Run(d.Name, func(t *testing.T) {
			t.Parallel()
			db := open(t, d.New(t))
			g, err := envelope.NewGate(db.EnvelopeStore(), &envelope.Config{Now: func() time.Time { return now }})
			if err != nil {
				t.Fatal(err)
			}
			version := func(ctx context.Context) int64 {
				t.Helper()
				s, err := g.Snapshot(ctx)
				if err != nil {
					t.Fatal(err)
				}
				return s.Version()
			}
			errRollback := errors.New("roll back")
			err = db.InTx(ctx, func(ctx context.Context) error {
				if _, err := g.Activate(ctx, "alice", "run", nil); err != nil {
					return err
				}
				if v := version(ctx); v != 2 {
					t.Errorf("in the transaction: version %d, want 2", v)
				}
				return errRollback
			})
			if !errors.Is(err, errRollback) {
				t.Fatalf("InTx = %v", err)
			}
			if v := version(ctx); v != 1 {
				t.Fatalf("after rollback: version %d, want 1", v)
			}
			if rs, err := g.History(ctx, 0, 0); err != nil || len(rs) != 0 {
				t.Fatalf("after rollback: history %v, %v", rs, err)
			}

			err = db.InTx(ctx, func(ctx context.Context) error {
				if _, err := g.Activate(ctx, "alice", "run", nil); err != nil {
					return err
				}
				_, err := g.Deactivate(ctx, "bob", "stop")
				return err
			})
			if err != nil {
				t.Fatalf("InTx: %v", err)
			}
			rs, err := g.History(ctx, 0, 0)
			if err != nil || len(rs) != 2 || rs[1].Version != 3 || version(ctx) != 3 {
				t.Fatalf("after commit: history %v, %v", rs, err)
			}
		})
	}
}
