package lease_test

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nodelane/nodelane/internal/testclock"
	"github.com/nodelane/nodelane/lease"
)

// While Config.HoldSweeps says so, Lease leaves a due expiry alone (the
// job stays leased to the worker that let it lapse); once it no longer
// does, Lease sweeps it back to the queue and grants it.
func TestHoldSweeps(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	clock := testclock.New(time.Date(2026, 11, 30, 9, 0, 0, 0, time.UTC))
	var hold atomic.Bool
	m := lease.NewManager(lease.NewMemoryStore(), &lease.Config{Now: clock.Now, HoldSweeps: hold.Load})
	caps := lease.Capabilities{JobTypes: []string{"status_check"}}
	a, err := m.RegisterWorker(ctx, &lease.Worker{NodeID: "a", Capabilities: caps})
	if err != nil {
		t.Fatal(err)
	}
	b, err := m.RegisterWorker(ctx, &lease.Worker{NodeID: "b", Capabilities: caps})
	if err != nil {
		t.Fatal(err)
	}
	job, err := m.Enqueue(ctx, lease.NewJob{Type: "status_check"})
	if err != nil {
		t.Fatal(err)
	}
	if gs, err := m.Lease(ctx, lease.LeaseRequest{WorkerID: a.ID}); err != nil || len(gs) != 1 {
		t.Fatalf("Lease by a = %v, %v", gs, err)
	}
	// a never accepts: the lease is due once the accept timeout passes.
	clock.Advance(time.Hour)
	hold.Store(true)
	if gs, err := m.Lease(ctx, lease.LeaseRequest{WorkerID: b.ID}); err != nil || len(gs) != 0 {
		t.Fatalf("Lease by b while sweeps are held = %v, %v; want nothing", gs, err)
	}
	if j, err := m.Get(ctx, job.ID); err != nil || j.State != lease.StateLeased {
		t.Fatalf("job while sweeps are held: %+v, %v; want it still leased", j, err)
	}
	hold.Store(false)
	gs, err := m.Lease(ctx, lease.LeaseRequest{WorkerID: b.ID})
	if err != nil || len(gs) != 1 || gs[0].Job.ID != job.ID {
		t.Fatalf("Lease by b once sweeps resume = %v, %v; want the job", gs, err)
	}
}
