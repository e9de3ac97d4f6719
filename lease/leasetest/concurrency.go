package leasetest

import (
	"errors"
	"fmt"
	"sync"
	"testing"

	"github.com/nodelane/nodelane/lease"
)

var concurrencyTests = []test{
	{"ConcurrentLeasing", testConcurrentLeasing},
	{"ConcurrentGovernor", testConcurrentGovernor},
	{"ConcurrentWritesOneLease", testConcurrentRelease},
}

// 32 goroutines, each its own worker, lease 2,000 jobs (500 under the
// race detector, still about 16 a claimer): every job is leased exactly
// once, and none is lost.
func testConcurrentLeasing(t *testing.T, f *fixture) {
	const claimers = 32
	jobs := 2000
	if raceEnabled {
		jobs = 500
	}
	want := map[string]bool{}
	for range jobs {
		j, err := f.m.Enqueue(f.ctx, lease.NewJob{Type: "status_check"})
		if err != nil {
			t.Fatal(err)
		}
		want[j.ID] = true
	}
	var (
		mu     sync.Mutex
		leased = map[string]int{}
		wg     sync.WaitGroup
		errs   = make(chan error, claimers)
	)
	for c := range claimers {
		w := f.worker(fmt.Sprintf("claimer-%02d", c), nil, []string{"status_check"}, lease.Governor{MaxJobs: 8})
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				gs, err := f.m.Lease(f.ctx, lease.LeaseRequest{WorkerID: w.ID, MaxJobs: 1 + c%4})
				if err != nil {
					errs <- err
					return
				}
				if len(gs) == 0 {
					return
				}
				for _, g := range gs {
					mu.Lock()
					leased[g.Job.ID]++
					mu.Unlock()
					ref := lease.Ref{JobID: g.Job.ID, WorkerID: w.ID, Token: g.Token}
					if _, err := f.m.Accept(f.ctx, ref); err != nil {
						errs <- fmt.Errorf("accept %s: %w", g.Job.ID, err)
						return
					}
					if _, _, err := f.m.Complete(f.ctx, ref, lease.Result{}); err != nil {
						errs <- fmt.Errorf("complete %s: %w", g.Job.ID, err)
						return
					}
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	for id, n := range leased {
		if n != 1 || !want[id] {
			t.Errorf("job %s leased %d times (known %v)", id, n, want[id])
		}
	}
	if len(leased) != jobs {
		t.Errorf("leased %d distinct jobs, want %d", len(leased), jobs)
	}
	done, _, err := f.m.List(f.ctx, lease.JobFilter{State: lease.StateSucceeded, Limit: 1000})
	if err != nil {
		t.Fatal(err)
	}
	total := len(done)
	for len(done) == 1000 {
		if done, _, err = f.m.List(f.ctx, lease.JobFilter{State: lease.StateSucceeded, After: done[len(done)-1].ID, Limit: 1000}); err != nil {
			t.Fatal(err)
		}
		total += len(done)
	}
	if total != jobs {
		t.Errorf("%d jobs succeeded, want %d", total, jobs)
	}
}

// Many goroutines leasing for one worker never exceed its governor.
func testConcurrentGovernor(t *testing.T, f *fixture) {
	w := f.worker("one", nil, []string{"status_check"}, lease.Governor{MaxJobs: 3})
	for range 40 {
		f.enqueue("status_check")
	}
	var wg sync.WaitGroup
	var mu sync.Mutex
	total := 0
	for range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			gs, err := f.m.Lease(f.ctx, lease.LeaseRequest{WorkerID: w.ID, MaxJobs: 2})
			if err != nil {
				t.Error(err)
			}
			mu.Lock()
			total += len(gs)
			mu.Unlock()
		}()
	}
	wg.Wait()
	if total != 3 {
		t.Fatalf("8 concurrent leases for a worker with max_jobs 3 granted %d", total)
	}
	live, _, err := f.m.List(f.ctx, lease.JobFilter{WorkerID: w.ID})
	if err != nil || len(live) != 3 {
		t.Fatalf("the worker holds %d live leases (%v), want 3", len(live), err)
	}
}

// Concurrent writes under one lease: exactly one release wins, and the
// losers see ErrLeaseLost, never a second transition.
func testConcurrentRelease(t *testing.T, f *fixture) {
	w := f.defaultWorker("w")
	for round := range 5 {
		j := f.enqueue("status_check")
		_, ref := f.leaseOne(w)
		f.accept(ref)
		const n = 16
		var wg sync.WaitGroup
		errs := make([]error, n)
		for i := range n {
			wg.Add(1)
			go func() {
				defer wg.Done()
				if i%2 == 0 {
					_, errs[i] = f.m.Release(f.ctx, ref, "race")
				} else {
					_, errs[i] = f.m.Fail(f.ctx, ref, lease.Failure{Code: "race", Retryable: true})
				}
			}()
		}
		wg.Wait()
		wins := 0
		for _, err := range errs {
			switch {
			case err == nil:
				wins++
			case !errors.Is(err, lease.ErrLeaseLost):
				t.Fatalf("round %d: %v", round, err)
			}
		}
		if wins != 1 {
			t.Fatalf("round %d: %d concurrent writes under one lease succeeded, want 1", round, wins)
		}
		got := f.state(j.ID, lease.StateQueued)
		if got.Attempt != 1 && got.Attempt != 2 {
			t.Fatalf("round %d: attempt %d", round, got.Attempt)
		}
		f.cancel(j.ID) // out of the next round's way
	}
}
