package leasetest

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/nodelane/nodelane/lease"
)

var claimTests = []test{
	{"Ordering", testOrdering},
	{"MaxJobs", testMaxJobs},
	{"Scheduled", testScheduled},
	{"Matching", testMatching},
	{"Governor", testGovernor},
	{"AllowHook", testAllowHook},
	{"RetriedClaim", testRetriedClaim},
}

func testOrdering(t *testing.T, f *fixture) {
	w := f.worker("w", nil, []string{"status_check"}, lease.Governor{MaxJobs: 10})
	a := f.enqueue("status_check")
	b := f.enqueue("status_check", func(nj *lease.NewJob) { nj.Priority = 5 })
	c := f.enqueue("status_check")
	d := f.enqueue("status_check", func(nj *lease.NewJob) { nj.Priority = 5 })
	e := f.enqueue("status_check", func(nj *lease.NewJob) { nj.Priority = -1 })
	var got []string
	for range 5 {
		j, _ := f.leaseOne(w)
		got = append(got, j.ID)
	}
	want := []string{b.ID, d.ID, a.ID, c.ID, e.ID}
	if d := cmp.Diff(want, got); d != "" {
		t.Fatalf("lease order (-want +got):\n%s", d)
	}
	if gs := f.lease(w, 1); len(gs) != 0 {
		t.Fatalf("leased %d jobs from an empty queue", len(gs))
	}
}

func testMaxJobs(t *testing.T, f *fixture) {
	w := f.worker("w", nil, []string{"status_check"}, lease.Governor{MaxJobs: 10})
	var ids []string
	for i := range 5 {
		ids = append(ids, f.enqueue("status_check", func(nj *lease.NewJob) { nj.Priority = 10 - i }).ID)
	}
	gs := f.lease(w, 3)
	if len(gs) != 3 {
		t.Fatalf("max_jobs 3 granted %d", len(gs))
	}
	seen := map[string]bool{}
	for i, g := range gs {
		if g.Job.ID != ids[i] {
			t.Errorf("grant %d = %s, want %s", i, g.Job.ID, ids[i])
		}
		if seen[g.Token] || seen[g.Job.Lease.ID] {
			t.Errorf("grant %d repeats a token or lease id", i)
		}
		seen[g.Token], seen[g.Job.Lease.ID] = true, true
		f.same(g.Job)
	}
	if gs := f.lease(w, 10); len(gs) != 2 {
		t.Fatalf("second lease granted %d, want the 2 left", len(gs))
	}
	if _, err := f.m.Lease(f.ctx, lease.LeaseRequest{WorkerID: w.ID, MaxJobs: -1}); !errors.Is(err, lease.ErrInvalidArgument) {
		t.Fatalf("max_jobs -1: %v", err)
	}
}

func testScheduled(t *testing.T, f *fixture) {
	w := f.defaultWorker("w")
	j := f.enqueue("status_check", func(nj *lease.NewJob) { nj.ScheduledAt = epoch.Add(time.Hour) })
	if gs := f.lease(w, 1); len(gs) != 0 {
		t.Fatal("leased a job scheduled in the future")
	}
	f.clock.Advance(time.Hour)
	if lj, _ := f.leaseOne(w); lj.ID != j.ID {
		t.Fatalf("leased %s, want %s", lj.ID, j.ID)
	}
}

func testMatching(t *testing.T, f *fixture) {
	big := f.worker("big", []lease.GPU{{SKU: "h100", VRAMMB: 81920}, {SKU: "h100", VRAMMB: 81920}, {SKU: "rtx-4090", VRAMMB: 24576}}, []string{"lora_train", "status_check"}, lease.Governor{MaxJobs: 100})
	small := f.worker("small", []lease.GPU{{SKU: "rtx-3060", VRAMMB: 12288}}, []string{"lora_train", "status_check"}, lease.Governor{MaxJobs: 100})
	cpu := f.worker("cpu", nil, []string{"status_check", "lora_train"}, lease.Governor{MaxJobs: 100})
	type job struct {
		name string
		typ  string
		req  lease.Requirements
		want []string // workers that may take it
	}
	jobs := []job{
		{"cpu-only", "status_check", lease.Requirements{}, []string{"big", "small", "cpu"}},
		{"any 16GB gpu", "lora_train", lease.Requirements{MinVRAMMB: 16000}, []string{"big"}},
		{"any 1 gpu", "lora_train", lease.Requirements{GPUCount: 1}, []string{"big", "small"}},
		{"two h100", "lora_train", lease.Requirements{GPUSKU: "h100", GPUCount: 2, MinVRAMMB: 80000}, []string{"big"}},
		{"three h100", "lora_train", lease.Requirements{GPUSKU: "h100", GPUCount: 3}, nil},
		{"three any", "lora_train", lease.Requirements{GPUCount: 3}, []string{"big"}},
		{"three any 30GB", "lora_train", lease.Requirements{GPUCount: 3, MinVRAMMB: 30000}, nil},
		{"rtx-3060", "lora_train", lease.Requirements{GPUSKU: "rtx-3060"}, []string{"small"}},
		{"rtx-3060 13GB", "lora_train", lease.Requirements{GPUSKU: "rtx-3060", MinVRAMMB: 13000}, nil},
		{"unknown sku", "lora_train", lease.Requirements{GPUSKU: "a100"}, nil},
		{"unknown type", "raw_training", lease.Requirements{}, nil},
	}
	workers := map[string]*lease.Worker{"big": big, "small": small, "cpu": cpu}
	for _, jc := range jobs {
		t.Run(jc.name, func(t *testing.T) {
			f := f.sub(t)
			j := f.enqueue(jc.typ, func(nj *lease.NewJob) { nj.Requirements = jc.req })
			t.Cleanup(func() {
				// Out of the way of the next case, which leases again.
				if _, err := f.m.Cancel(f.ctx, j.ID); err != nil {
					t.Errorf("Cancel(%s): %v", j.ID, err)
				}
			})
			for name, w := range workers {
				gs := f.lease(w, 1)
				took := len(gs) == 1
				want := false
				for _, n := range jc.want {
					want = want || n == name
				}
				if took != want {
					t.Errorf("worker %s took=%v, want %v", name, took, want)
				}
				for _, g := range gs {
					if g.Job.ID != j.ID {
						t.Fatalf("worker %s leased %s, a job of an earlier case", name, g.Job.ID)
					}
					if _, err := f.m.Release(f.ctx, lease.Ref{JobID: g.Job.ID, WorkerID: w.ID, Token: g.Token}, "test"); err != nil {
						t.Fatal(err)
					}
				}
			}
		})
	}
	// The request narrows what the worker offers.
	j := f.enqueue("lora_train", func(nj *lease.NewJob) { nj.Requirements.GPUSKU = "rtx-4090" })
	gs, err := f.m.Lease(f.ctx, lease.LeaseRequest{WorkerID: big.ID, GPUSKUs: []string{"h100"}})
	if err != nil || len(gs) != 0 {
		t.Fatalf("offering only h100 leased %d (%v)", len(gs), err)
	}
	gs, err = f.m.Lease(f.ctx, lease.LeaseRequest{WorkerID: big.ID, JobTypes: []string{"status_check"}})
	if err != nil || len(gs) != 0 {
		t.Fatalf("offering only status_check leased %d (%v)", len(gs), err)
	}
	gs, err = f.m.Lease(f.ctx, lease.LeaseRequest{WorkerID: big.ID, GPUSKUs: []string{"rtx-4090"}, JobTypes: []string{"lora_train"}})
	if err != nil || len(gs) != 1 || gs[0].Job.ID != j.ID {
		t.Fatalf("offering rtx-4090 leased %v (%v)", gs, err)
	}
	// The SKU recorded on the lease: the job's, else the worker's first GPU's.
	if gs[0].Job.Lease.SKU != "rtx-4090" {
		t.Fatalf("lease SKU = %q", gs[0].Job.Lease.SKU)
	}
	f.enqueue("status_check")
	gs, err = f.m.Lease(f.ctx, lease.LeaseRequest{WorkerID: big.ID, PolicyVersion: 7, Price: func(sku string) int64 { return map[string]int64{"h100": 2_500_000}[sku] }})
	if err != nil || len(gs) != 1 || gs[0].Job.Lease.SKU != "h100" || gs[0].Job.Lease.PriceMicroUSD != 2_500_000 || gs[0].Job.Lease.PolicyVersion != 7 {
		t.Fatalf("lease of a job without SKU = %+v (%v)", gs, err)
	}
	f.same(gs[0].Job)
	// An unregistered worker leases nothing.
	_, err = f.m.Lease(f.ctx, lease.LeaseRequest{WorkerID: "wrk_nobody"})
	wantErr(t, "unknown worker", err, lease.ErrNotFound)
}

func testGovernor(t *testing.T, f *fixture) {
	w := f.worker("w", []lease.GPU{{SKU: "rtx-4090", VRAMMB: 24576}}, []string{"status_check", "lora_train"}, lease.Governor{MaxJobs: 2, MaxVRAMMB: 16000})
	for range 4 {
		f.enqueue("status_check")
	}
	gs := f.lease(w, 5)
	if len(gs) != 2 {
		t.Fatalf("governor max_jobs 2 granted %d", len(gs))
	}
	if more := f.lease(w, 5); len(more) != 0 {
		t.Fatalf("worker at its governor limit was granted %d more", len(more))
	}
	ref := lease.Ref{JobID: gs[0].Job.ID, WorkerID: w.ID, Token: gs[0].Token}
	f.accept(ref)
	f.complete(ref, lease.Result{})
	if more := f.lease(w, 5); len(more) != 1 {
		t.Fatalf("after one completion granted %d, want 1", len(more))
	}
	// max_vram_mb caps one job's VRAM requirement.
	other := f.worker("other", []lease.GPU{{SKU: "rtx-4090", VRAMMB: 24576}}, []string{"lora_train"}, lease.Governor{MaxJobs: 5, MaxVRAMMB: 16000})
	f.enqueue("lora_train", func(nj *lease.NewJob) { nj.Requirements.MinVRAMMB = 20000 })
	if gs := f.lease(other, 1); len(gs) != 0 {
		t.Fatal("a job over the governor's max_vram_mb was leased")
	}
	f.enqueue("lora_train", func(nj *lease.NewJob) { nj.Requirements.MinVRAMMB = 16000 })
	if gs := f.lease(other, 1); len(gs) != 1 || gs[0].Job.Requirements.MinVRAMMB != 16000 {
		t.Fatalf("a job within max_vram_mb: %v", gs)
	}
}

func testAllowHook(t *testing.T, f *fixture) {
	w := f.defaultWorker("w")
	blocked := f.enqueue("lora_train", func(nj *lease.NewJob) { nj.Priority = 9 })
	safe := f.enqueue("status_check")
	allow := func(typ string) bool { return typ != "lora_train" }
	gs, err := f.m.Lease(f.ctx, lease.LeaseRequest{WorkerID: w.ID, MaxJobs: 5, Allow: allow})
	if err != nil || len(gs) != 1 || gs[0].Job.ID != safe.ID {
		t.Fatalf("lease with lora_train refused = %v, %v", gs, err)
	}
	f.state(blocked.ID, lease.StateQueued)
	gs, err = f.m.Lease(f.ctx, lease.LeaseRequest{WorkerID: w.ID, MaxJobs: 5, Allow: func(string) bool { return true }})
	if err != nil || len(gs) != 1 || gs[0].Job.ID != blocked.ID {
		t.Fatalf("lease with everything allowed = %v, %v", gs, err)
	}
}

// retryingStore wraps the store under test so that each ClaimLeases
// fails once after plan was called, then claims again for real, as a
// store does that retries after the database aborted its transaction (a
// deadlock on InnoDB, a serialization failure): plan is called again, and
// only the leases of the attempt that commits may be written.
type retryingStore struct {
	lease.Store
	t *testing.T

	mu sync.Mutex
	// between, when set, runs once between a failed attempt and its retry.
	between func()
	// granted counts the plans of failed attempts.
	granted int
}

var errAttempt = errors.New("leasetest: the claim attempt failed after plan")

func (s *retryingStore) ClaimLeases(ctx context.Context, workerID string, plan func(*lease.Worker) (lease.ClaimQuery, lease.LeaseClaim, bool, error)) ([]*lease.Job, error) {
	called := 0
	js, err := s.Store.ClaimLeases(ctx, workerID, func(w *lease.Worker) (lease.ClaimQuery, lease.LeaseClaim, bool, error) {
		q, c, ok, _ := plan(w)
		called++
		return q, c, ok, errAttempt
	})
	if !errors.Is(err, errAttempt) || len(js) > 0 {
		s.t.Errorf("ClaimLeases answered %d jobs, %v to a plan that failed; want nothing claimed and the plan's error", len(js), err)
	}
	s.mu.Lock()
	s.granted += called
	between := s.between
	s.between = nil
	s.mu.Unlock()
	if between != nil {
		between()
	}
	return s.Store.ClaimLeases(ctx, workerID, plan)
}

func (s *retryingStore) failedGrants() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.granted
}

// A store that retries a claim calls plan again, for the same jobs or
// others; the lease still completes with one fresh lease per job, and
// nothing of the failed attempt is kept.
func testRetriedClaim(t *testing.T, f *fixture) {
	rs := &retryingStore{t: t}
	newStore := f.newStore
	f = newFixture(t, func(t *testing.T) lease.Store {
		rs.Store = newStore(t)
		return rs
	})
	w := f.worker("w", nil, []string{"status_check"}, lease.Governor{MaxJobs: 10})
	// check leases n jobs and checks that they are want, each under a
	// lease of its own, as stored, and that the rest are untouched.
	check := func(n int, want []*lease.Job, untouched ...*lease.Job) []lease.Ref {
		t.Helper()
		before := rs.failedGrants()
		gs := f.lease(w, n)
		if rs.failedGrants() == before {
			t.Fatalf("lease of %d: the failed attempt called no grant", n)
		}
		var got, wantIDs []string
		for _, g := range gs {
			got = append(got, g.Job.ID)
		}
		for _, j := range want {
			wantIDs = append(wantIDs, j.ID)
		}
		if d := cmp.Diff(wantIDs, got); d != "" {
			t.Fatalf("lease of %d after a failed attempt (-want +got):\n%s", n, d)
		}
		var refs []lease.Ref
		seen := map[string]bool{}
		for _, g := range gs {
			l := g.Job.Lease
			if l.Epoch != 1 || l.JobID != g.Job.ID || l.WorkerID != w.ID || g.Job.Rev != 2 {
				t.Fatalf("job %s: epoch %d, lease of %s for %s, rev %d; want epoch 1 and rev 2 of one lease",
					g.Job.ID, l.Epoch, l.JobID, l.WorkerID, g.Job.Rev)
			}
			if seen[g.Token] || seen[l.ID] {
				t.Fatalf("job %s repeats a token or lease id of another grant", g.Job.ID)
			}
			seen[g.Token], seen[l.ID] = true, true
			f.same(g.Job)
			refs = append(refs, lease.Ref{JobID: g.Job.ID, WorkerID: w.ID, Token: g.Token})
		}
		for _, j := range untouched {
			f.same(j)
		}
		return refs
	}
	finish := func(refs []lease.Ref) {
		t.Helper()
		for _, ref := range refs {
			f.accept(ref)
			f.complete(ref, lease.Result{})
		}
	}

	// One job, the case that crashed the Manager.
	a := f.enqueue("status_check")
	finish(check(1, []*lease.Job{a}))

	// The retry takes the same jobs.
	b := f.enqueue("status_check", func(nj *lease.NewJob) { nj.Priority = 2 })
	c := f.enqueue("status_check", func(nj *lease.NewJob) { nj.Priority = 1 })
	d := f.enqueue("status_check")
	finish(check(2, []*lease.Job{b, c}, d))

	// The retry takes others: a job enqueued meanwhile goes first.
	e := f.enqueue("status_check")
	var x *lease.Job
	rs.mu.Lock()
	rs.between = func() { x = f.enqueue("status_check", func(nj *lease.NewJob) { nj.Priority = 9 }) }
	rs.mu.Unlock()
	gs := f.lease(w, 2)
	if len(gs) != 2 || x == nil || gs[0].Job.ID != x.ID || gs[1].Job.ID != d.ID {
		t.Fatalf("lease after a failed attempt granted %v, want the job enqueued meanwhile, then %s", gs, d.ID)
	}
	if gs[0].Token == gs[1].Token || gs[0].Job.Lease.ID == gs[1].Job.Lease.ID {
		t.Fatal("two grants share a token or lease id")
	}
	for _, g := range gs {
		f.same(g.Job)
	}
	f.same(e)
	// Each token is its own job's, and no other's.
	refs := []lease.Ref{
		{JobID: gs[0].Job.ID, WorkerID: w.ID, Token: gs[0].Token},
		{JobID: gs[1].Job.ID, WorkerID: w.ID, Token: gs[1].Token},
	}
	for i, ref := range refs {
		crossed := refs[1-i]
		crossed.Token = ref.Token
		_, err := f.m.Accept(f.ctx, crossed)
		wantErr(t, "accept with the other grant's token", err, lease.ErrLeaseLost)
	}
	finish(refs)
	finish(check(5, []*lease.Job{e}))
	if left := f.list(lease.JobFilter{State: lease.StateQueued}); len(left) != 0 {
		t.Fatalf("%d jobs left queued", len(left))
	}
}
