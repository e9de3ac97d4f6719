package bunstore_test

import (
	"context"
	"database/sql"
	"errors"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/nodelane/nodelane/internal/testdb"
	"github.com/nodelane/nodelane/lease"
)

// TestClaimSkipsLockedRows checks that, on PostgreSQL, a claim passes over a candidate
// row that another replica's claim holds locked and takes the next one at
// once, rather than waiting for the lock (FOR UPDATE SKIP LOCKED, DESIGN
// §8).
//
// Nothing here is timed. Worker B's handle has a lock_timeout, and its
// claim runs under a deadline, so a claim that waits for worker A's lock
// fails with an error rather than merely taking longer.
func TestClaimSkipsLockedRows(t *testing.T) {
	t.Parallel()
	tdb := testdb.Postgres(t)
	ctx := context.Background()
	db := open(t, testdb.DB{Dialect: tdb.Dialect, DSN: withRuntimeParam(t, tdb.DSN, "lock_timeout", "2s")})
	m := lease.NewManager(db.LeaseStore(), nil)
	w, err := m.RegisterWorker(ctx, &lease.Worker{
		NodeID:       "node-b",
		Capabilities: lease.Capabilities{JobTypes: []string{"status_check"}},
		Governor:     lease.Governor{MaxJobs: 4},
	})
	if err != nil {
		t.Fatal(err)
	}
	first, err := m.Enqueue(ctx, lease.NewJob{Type: "status_check", Priority: 10})
	if err != nil {
		t.Fatal(err)
	}
	second, err := m.Enqueue(ctx, lease.NewJob{Type: "status_check"})
	if err != nil {
		t.Fatal(err)
	}

	// Worker A's claim, caught between its SELECT ... FOR UPDATE and its
	// commit: a transaction on a connection of its own holds the first
	// candidate (the higher priority) locked.
	a, err := tdb.Bun(t).BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := a.Rollback(); err != nil && !errors.Is(err, sql.ErrTxDone) {
			t.Errorf("rollback A: %v", err)
		}
	})
	var locked string
	if err := a.NewRaw("SELECT id FROM nodelane_jobs WHERE id = ? FOR UPDATE", first.ID).Scan(ctx, &locked); err != nil || locked != first.ID {
		t.Fatalf("A locking %s: got %q, %v", first.ID, locked, err)
	}

	bctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	gs, err := m.Lease(bctx, lease.LeaseRequest{WorkerID: w.ID, MaxJobs: 1})
	if err != nil {
		t.Fatalf("B's claim while A holds %s locked: %v (the claim waited for the lock instead of skipping the row)", first.ID, err)
	}
	if len(gs) != 1 || gs[0].Job.ID != second.ID {
		t.Fatalf("B's claim while A holds %s locked granted %d jobs %v, want %s", first.ID, len(gs), grantIDs(gs), second.ID)
	}

	// A's row was skipped, not taken; once A lets go, it is B's to claim.
	if err := a.Rollback(); err != nil {
		t.Fatal(err)
	}
	if j, err := m.Get(ctx, first.ID); err != nil || j.State != lease.StateQueued {
		t.Fatalf("the locked job after B's claim: %+v, %v; want it queued", j, err)
	}
	gs, err = m.Lease(bctx, lease.LeaseRequest{WorkerID: w.ID, MaxJobs: 1})
	if err != nil || len(gs) != 1 || gs[0].Job.ID != first.ID {
		t.Fatalf("B's claim after A let go granted %v, %v; want %s", grantIDs(gs), err, first.ID)
	}
}

func grantIDs(gs []lease.Grant) []string {
	ids := make([]string, len(gs))
	for i, g := range gs {
		ids[i] = g.Job.ID
	}
	return ids
}

// withRuntimeParam adds a run-time parameter to a PostgreSQL DSN, which
// pgx sends when it connects.
func withRuntimeParam(t *testing.T, dsn, name, value string) string {
	t.Helper()
	if !strings.HasPrefix(dsn, "postgres://") && !strings.HasPrefix(dsn, "postgresql://") {
		return dsn + " " + name + "=" + value
	}
	u, err := url.Parse(dsn)
	if err != nil {
		t.Fatal("the test DSN is not a URL") // err would echo it, password and all
	}
	q := u.Query()
	q.Set(name, value)
	u.RawQuery = q.Encode()
	return u.String()
}
