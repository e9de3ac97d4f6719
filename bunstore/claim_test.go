package bunstore

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/nodelane/nodelane/internal/testdb"
	"github.com/nodelane/nodelane/lease"
)

// TestClaimBatch runs one gathered claim whose calls differ in every way
// a batch has to keep apart: two kinds of job, a worker twice, a worker
// whose room runs out, a worker at its cap, a worker that does not exist
// and a plan that fails. Each call must get what it would have got alone,
// and no other call's error.
func TestClaimBatch(t *testing.T) {
	t.Parallel()
	for _, d := range MigratedDialects() {
		t.Run(d.Name, func(t *testing.T) {
			t.Parallel()
			testClaimBatch(t, d.New(t))
		})
	}
}

func testClaimBatch(t *testing.T, tdb testdb.DB) {
	ctx := context.Background()
	db, err := Open(ctx, tdb.DSN, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	m := lease.NewManager(db.LeaseStore(), nil)

	register := func(node, typ string, maxJobs int) *lease.Worker {
		t.Helper()
		w, err := m.RegisterWorker(ctx, &lease.Worker{NodeID: node,
			Capabilities: lease.Capabilities{JobTypes: []string{typ}}, Governor: lease.Governor{MaxJobs: maxJobs}})
		if err != nil {
			t.Fatal(err)
		}
		return w
	}
	a := register("a", "render", 4)
	b := register("b", "render", 2)
	c := register("c", "train", 5)
	full := register("full", "render", 1)
	enqueue := func(typ string, n int) []string {
		t.Helper()
		var ids []string
		for range n {
			j, err := m.Enqueue(ctx, lease.NewJob{Type: typ})
			if err != nil {
				t.Fatal(err)
			}
			ids = append(ids, j.ID)
		}
		return ids
	}
	// full holds the first render job: it is at its cap of 1.
	first := enqueue("render", 1)
	if gs, err := m.Lease(ctx, lease.LeaseRequest{WorkerID: full.ID, MaxJobs: 1}); err != nil || len(gs) != 1 {
		t.Fatalf("Lease for full: %d grants, %v", len(gs), err)
	}
	render := enqueue("render", 10)
	train := enqueue("train", 3)

	now := time.Now()
	leaseSeq := 0
	plan := func(typ string, limit, maxActive int) claimPlan {
		return func(w *lease.Worker) (lease.ClaimQuery, lease.LeaseClaim, bool, error) {
			q := lease.ClaimQuery{WorkerID: w.ID, Types: []string{typ}, Fits: []lease.Fit{{}}, MaxActive: maxActive, Limit: limit, Now: now}
			var c lease.LeaseClaim
			for range limit {
				leaseSeq++
				c.Leases = append(c.Leases, lease.Lease{ID: fmt.Sprintf("lease_%02d", leaseSeq), WorkerID: w.ID, TokenHash: []byte{byte(leaseSeq)},
					ExpiresAt: now.Add(time.Hour), AcceptBy: now.Add(time.Minute)})
			}
			return q, c, true, nil
		}
	}
	errPlan := errors.New("plan refused")
	calls := []claimCall{
		{a.ID, plan("render", 3, 4)},
		{b.ID, plan("render", 5, 2)}, // its cap, 2, bounds it
		{"wrk_missing", plan("render", 1, 1)},
		{c.ID, plan("train", 5, 5)},  // 3 train jobs exist
		{a.ID, plan("render", 3, 4)}, // room for 1 after its first call
		{full.ID, plan("render", 1, 1)},
		{b.ID, func(*lease.Worker) (lease.ClaimQuery, lease.LeaseClaim, bool, error) {
			return lease.ClaimQuery{}, lease.LeaseClaim{}, false, errPlan
		}},
	}
	rs, err := db.claimTx(ctx, calls)
	if err != nil {
		t.Fatal(err)
	}

	got := make([][]string, len(rs))
	for i, r := range rs {
		for _, j := range r.jobs {
			got[i] = append(got[i], j.ID)
			if j.State != lease.StateLeased || j.Lease.WorkerID != calls[i].workerID {
				t.Errorf("call %d: job %s is %s for %s, want leased for %s", i, j.ID, j.State, j.Lease.WorkerID, calls[i].workerID)
			}
		}
	}
	// Calls of one kind take the queue in claim order, in the order they
	// came: a 3, b 2, then a's second call 1.
	want := [][]string{render[0:3], render[3:5], nil, train, render[5:6], nil, nil}
	for i := range want {
		if !slices.Equal(got[i], want[i]) {
			t.Errorf("call %d (%s) claimed %v, want %v", i, calls[i].workerID, got[i], want[i])
		}
	}
	for i, r := range rs {
		var wantErr error
		switch i {
		case 2:
			wantErr = lease.ErrNotFound
		case 6:
			wantErr = errPlan
		}
		if !errors.Is(r.err, wantErr) || (wantErr == nil) != (r.err == nil) {
			t.Errorf("call %d: error %v, want %v", i, r.err, wantErr)
		}
	}
	// The leases of a call are given in its order: the k-th job the k-th
	// lease it prepared.
	for i, r := range rs {
		for k := 1; k < len(r.jobs); k++ {
			if r.jobs[k-1].Lease.ID >= r.jobs[k].Lease.ID {
				t.Errorf("call %d: leases %s then %s, want the call's order", i, r.jobs[k-1].Lease.ID, r.jobs[k].Lease.ID)
			}
		}
	}
	// What is stored agrees: nothing else was leased.
	live, _, err := m.List(ctx, lease.JobFilter{State: lease.StateLeased, Limit: 100})
	if err != nil {
		t.Fatal(err)
	}
	var stored []string
	for _, j := range live {
		stored = append(stored, j.ID)
	}
	wantStored := slices.Concat(first, render[0:6], train)
	slices.Sort(stored)
	slices.Sort(wantStored)
	if !slices.Equal(stored, wantStored) {
		t.Errorf("leased jobs stored: %v, want %v", stored, wantStored)
	}
}
