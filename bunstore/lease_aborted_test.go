package bunstore_test

import (
	"context"
	"database/sql"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/uptrace/bun"
	"github.com/uptrace/bun/dialect/sqlitedialect"

	"github.com/nodelane/nodelane/bunstore"
	"github.com/nodelane/nodelane/internal/testdb"
	"github.com/nodelane/nodelane/internal/waitfor"
	"github.com/nodelane/nodelane/lease"
)

func queuedJob(id string) *lease.Job {
	now := time.Now().UTC().Truncate(time.Microsecond)
	return &lease.Job{ID: id, Type: "status_check", State: lease.StateQueued, Attempt: 1, MaxAttempts: 3, CreatedAt: now, ScheduledAt: now, Rev: 1}
}

// bumped returns j at the next revision with another priority.
func bumped(j *lease.Job, priority int) *lease.Job {
	c := *j
	c.Priority = priority
	c.Rev = j.Rev + 1
	return &c
}

// A transaction the database aborts gives lease.ErrAborted: inside the
// context's transaction, which only its owner can run again; and outside
// one, after the store ran its own transaction again and it still failed.
func TestLeaseStoreAborted(t *testing.T) {
	t.Parallel()
	ctx := context.Background()

	t.Run("postgres serialization failure", func(t *testing.T) {
		t.Parallel()
		db := open(t, testdb.Postgres(t))
		s := db.LeaseStore()
		j := queuedJob("job-1")
		if err := s.CreateJobs(ctx, []*lease.Job{j}); err != nil {
			t.Fatal(err)
		}
		tx, err := db.Bun().BeginTx(ctx, &sql.TxOptions{Isolation: sql.LevelRepeatableRead})
		if err != nil {
			t.Fatal(err)
		}
		defer tx.Rollback()
		tctx := bunstore.WithTx(ctx, tx)
		if _, err := s.GetJob(tctx, j.ID); err != nil { // takes the snapshot
			t.Fatal(err)
		}
		if err := s.UpdateJob(ctx, bumped(j, 1), j.Rev); err != nil {
			t.Fatal(err)
		}
		err = s.UpdateJob(tctx, bumped(j, 2), j.Rev)
		if !errors.Is(err, lease.ErrAborted) {
			t.Fatalf("UpdateJob of a row changed after the snapshot: %v, want %v", err, lease.ErrAborted)
		}
		if errors.Is(err, lease.ErrConflict) {
			t.Fatalf("an aborted transaction is not a lost compare-and-set: %v", err)
		}
	})

	t.Run("postgres deadlock", func(t *testing.T) {
		t.Parallel()
		db := open(t, testdb.Postgres(t))
		s := db.LeaseStore()
		a, b := queuedJob("job-a"), queuedJob("job-b")
		for _, j := range []*lease.Job{a, b} {
			if err := s.CreateJobs(ctx, []*lease.Job{j}); err != nil {
				t.Fatal(err)
			}
		}
		// The host's transaction holds b's log line 1; AddEvents, in a
		// transaction of its own, takes a's, then waits for b's; the host
		// then waits for a's. PostgreSQL aborts one of the two.
		tx, err := db.Bun().BeginTx(ctx, nil)
		if err != nil {
			t.Fatal(err)
		}
		defer tx.Rollback()
		tctx := bunstore.WithTx(ctx, tx)
		line := func(id string) *lease.Event {
			return &lease.Event{JobID: id, Kind: lease.EventLog, Seq: 1, Message: id, CreatedAt: time.Now().UTC().Truncate(time.Microsecond)}
		}
		if _, err := s.AddEvents(tctx, []*lease.Event{line(b.ID)}); err != nil {
			t.Fatal(err)
		}
		var xid string
		if err := tx.QueryRowContext(ctx, "SELECT (txid_current() % 4294967296)::text").Scan(&xid); err != nil {
			t.Fatal(err)
		}
		type result struct {
			n   int
			err error
		}
		own := make(chan result, 1)
		go func() {
			n, err := s.AddEvents(ctx, []*lease.Event{line(a.ID), line(b.ID)})
			own <- result{n, err}
		}()
		waitfor.Until(t, "AddEvents to wait for the host's transaction", func() bool {
			var waiting int
			err := db.Bun().QueryRowContext(ctx,
				"SELECT count(*) FROM pg_locks WHERE locktype = 'transactionid' AND transactionid::text = ? AND NOT granted", xid).Scan(&waiting)
			if err != nil {
				t.Fatal(err)
			}
			return waiting > 0
		})
		_, hostErr := s.AddEvents(tctx, []*lease.Event{line(a.ID)})
		switch {
		case hostErr == nil:
			// AddEvents was the victim; it ran again, and now waits for
			// the host to end.
			t.Log("PostgreSQL aborted the store's own transaction")
			if err := tx.Commit(); err != nil {
				t.Fatal(err)
			}
		case errors.Is(hostErr, lease.ErrAborted):
			t.Log("PostgreSQL aborted the host's transaction")
			if !strings.Contains(hostErr.Error(), "40P01") {
				t.Errorf("host's error %v does not name the deadlock", hostErr)
			}
			if err := tx.Rollback(); err != nil {
				t.Fatal(err)
			}
		default:
			t.Fatalf("host's AddEvents in a deadlock: %v, want nil or %v", hostErr, lease.ErrAborted)
		}
		r := <-own
		if r.err != nil {
			t.Fatalf("AddEvents in a transaction of its own, in a deadlock: %v; want it run again", r.err)
		}
		for _, id := range []string{a.ID, b.ID} {
			if evs, err := s.ListEvents(ctx, id, 0, 10); err != nil || len(evs) != 1 {
				t.Fatalf("events of %s = %v, %v; want its one log line", id, evs, err)
			}
		}
	})

	t.Run("sqlite busy snapshot", func(t *testing.T) {
		t.Parallel()
		d := bunstore.Migrated.New(t)
		db := open(t, d)
		s := db.LeaseStore()
		j := queuedJob("job-1")
		if err := s.CreateJobs(ctx, []*lease.Job{j}); err != nil {
			t.Fatal(err)
		}
		// A host's handle with DEFERRED transactions, which Open avoids.
		sqldb, err := sql.Open("sqlite", "file:"+strings.TrimPrefix(d.DSN, "sqlite:")+"?_pragma=busy_timeout(5000)")
		if err != nil {
			t.Fatal(err)
		}
		bdb := bun.NewDB(sqldb, sqlitedialect.New())
		defer bdb.Close()
		host, err := bunstore.New(bdb, nil)
		if err != nil {
			t.Fatal(err)
		}
		hs := host.LeaseStore()
		tx, err := bdb.BeginTx(ctx, nil)
		if err != nil {
			t.Fatal(err)
		}
		defer tx.Rollback()
		tctx := bunstore.WithTx(ctx, tx)
		if _, err := hs.GetJob(tctx, j.ID); err != nil { // takes the snapshot
			t.Fatal(err)
		}
		if err := s.UpdateJob(ctx, bumped(j, 1), j.Rev); err != nil {
			t.Fatal(err)
		}
		err = hs.UpdateJob(tctx, bumped(j, 2), j.Rev)
		if !errors.Is(err, lease.ErrAborted) {
			t.Fatalf("UpdateJob from a stale snapshot: %v, want %v", err, lease.ErrAborted)
		}
	})
}
