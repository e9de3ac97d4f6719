package bunstore_test

import (
	"context"
	"flag"
	"fmt"
	"sync"
	"testing"

	"github.com/nodelane/nodelane/bunstore"
	"github.com/nodelane/nodelane/internal/testdb"
	"github.com/nodelane/nodelane/lease"
)

// BenchmarkLeaseAcceptComplete measures how fast claimers drain a queue
// through lease.Manager: each claimer is a worker of its own that leases
// up to max_jobs jobs at a time, accepts and completes each (the jobs of
// one lease at once, as a worker with max_jobs slots runs them), until
// the queue is empty. With accept=lease the lease accepts them
// (LeaseRequest.Accept: Lease then Complete, River's shape); with
// accept=call each job is accepted by a call of its own (Lease, Accept,
// Complete). One op is one job; jobs/s is the throughput.
//
// It also reports, for the timed part only (the drain, not the enqueue),
// stmts/job, the SQL statements sent through bun per job, and
// commits/job, the commits per job: COMMITs plus statements run outside
// a transaction (see queryCounter for exactly what is counted). With -v
// it logs the breakdown (in a transaction or not, BEGIN, ROLLBACK, ...).
//
// After the drain it checks that every job was completed exactly once:
// no job came back to two Complete calls or as a repeat, and every job
// stored ended succeeded on its first attempt.
func BenchmarkLeaseAcceptComplete(b *testing.B) {
	for _, d := range bunstore.MigratedDialects() {
		b.Run(d.Name, func(b *testing.B) {
			for _, claimers := range []int{1, 8, 32} {
				for _, maxJobs := range []int{1, 10} {
					for _, accept := range []string{"lease", "call"} {
						b.Run(fmt.Sprintf("claimers=%d/max_jobs=%d/accept=%s", claimers, maxJobs, accept), func(b *testing.B) {
							benchmarkDrain(b, d.New(b), claimers, maxJobs, accept == "lease")
						})
					}
				}
			}
		})
	}
}

func benchmarkDrain(b *testing.B, tdb testdb.DB, claimers, maxJobs int, accept bool) {
	ctx := context.Background()
	qc := &queryCounter{}
	// A DB over the same pool whose bun.DB carries the counting hook.
	db, err := bunstore.New(open(b, tdb).Bun().WithQueryHook(qc), nil)
	if err != nil {
		b.Fatal(err)
	}
	bunstore.SetObserver(db, qc.observe)
	m := lease.NewManager(db.LeaseStore(), nil)
	// One transaction for the whole backlog keeps set-up short.
	err = db.InTx(ctx, func(ctx context.Context) error {
		for range b.N {
			if _, err := m.Enqueue(ctx, lease.NewJob{Type: "status_check"}); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		b.Fatal(err)
	}
	workers := make([]*lease.Worker, claimers)
	for i := range workers {
		w, err := m.RegisterWorker(ctx, &lease.Worker{
			NodeID:       fmt.Sprintf("bench-%02d", i),
			Capabilities: lease.Capabilities{JobTypes: []string{"status_check"}},
			Governor:     lease.Governor{MaxJobs: maxJobs},
		})
		if err != nil {
			b.Fatal(err)
		}
		workers[i] = w
	}

	var (
		wg   sync.WaitGroup
		errs = make(chan error, claimers)
		done = make([][]string, claimers)
	)
	b.ResetTimer()
	before := qc.snapshot()
	for i, w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			ids, err := drain(ctx, m, w, maxJobs, accept, b.N/claimers+maxJobs)
			done[i] = ids
			if err != nil {
				errs <- err
			}
		}()
	}
	wg.Wait()
	counts := qc.snapshot().sub(before)
	b.StopTimer()
	close(errs)
	for err := range errs {
		b.Error(err)
	}
	checkCompletedOnce(b, ctx, m, done)

	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "jobs/s")
	b.ReportMetric(float64(counts.Stmts)/float64(b.N), "stmts/job")
	b.ReportMetric(float64(counts.Commits)/float64(b.N), "commits/job")
	if testing.Verbose() {
		st := db.Bun().DB.Stats()
		b.Logf("pool: open %d, maxIdleClosed %d, maxLifetimeClosed %d, waits %d (%s)", st.OpenConnections, st.MaxIdleClosed, st.MaxLifetimeClosed, st.WaitCount, st.WaitDuration)
		b.Logf("N=%d %s", b.N, counts.perJob(b.N))
	}
}

// checkCompletedOnce fails b unless the jobs the claimers completed (done,
// one list per claimer) are b.N distinct jobs, and the store holds exactly
// b.N jobs, every one succeeded on its first attempt.
func checkCompletedOnce(b *testing.B, ctx context.Context, m *lease.Manager, done [][]string) {
	b.Helper()
	seen := make(map[string]bool, b.N)
	for _, ids := range done {
		for _, id := range ids {
			if seen[id] {
				b.Errorf("job %s completed twice", id)
			}
			seen[id] = true
		}
	}
	if len(seen) != b.N {
		b.Errorf("completed %d distinct jobs, want %d", len(seen), b.N)
	}
	stored := 0
	for after := ""; ; {
		jobs, next, err := m.List(ctx, lease.JobFilter{After: after, Limit: 1000})
		if err != nil {
			b.Fatal(err)
		}
		for _, j := range jobs {
			stored++
			if j.State != lease.StateSucceeded || j.Attempt != 1 || !seen[j.ID] {
				b.Errorf("job %s ended %s on attempt %d (completed by a claimer: %t), want succeeded on attempt 1",
					j.ID, j.State, j.Attempt, seen[j.ID])
			}
		}
		if next == "" {
			break
		}
		after = next
	}
	if stored != b.N {
		b.Errorf("store holds %d jobs, want %d", stored, b.N)
	}
	if b.Failed() {
		b.FailNow()
	}
}

// serialDrain makes each claimer of the burn-down run the jobs of a lease
// one after another (go test -bench … -args -serial).
var serialDrain = flag.Bool("serial", false, "burn-down: run the jobs of a lease one after another")

// drain leases, accepts and completes jobs for w until none is left, and
// returns the ids of the jobs it completed. capHint sizes the list. Like
// a worker with max_jobs slots, it runs the jobs of one lease at once
// (accept, then complete, each job on a goroutine of its own; with
// -serial, one after another) and leases again when all of them are done.
// With accept, the lease accepts the jobs and none is accepted again.
func drain(ctx context.Context, m *lease.Manager, w *lease.Worker, maxJobs int, accept bool, capHint int) ([]string, error) {
	ids := make([]string, 0, capHint)
	for {
		gs, err := m.Lease(ctx, lease.LeaseRequest{WorkerID: w.ID, MaxJobs: maxJobs, Accept: accept})
		if err != nil {
			return ids, err
		}
		if len(gs) == 0 {
			return ids, nil
		}
		errs := make([]error, len(gs))
		var wg sync.WaitGroup
		for i, g := range gs {
			run := wg.Go
			if *serialDrain {
				run = func(f func()) { f() }
			}
			run(func() {
				ref := lease.Ref{JobID: g.Job.ID, WorkerID: w.ID, Token: g.Token}
				if accept && g.Job.State != lease.StateRunning {
					errs[i] = fmt.Errorf("lease with accept granted %s %s, want running", g.Job.ID, g.Job.State)
					return
				}
				if !accept {
					if _, err := m.Accept(ctx, ref); err != nil {
						errs[i] = err
						return
					}
				}
				j, repeated, err := m.Complete(ctx, ref, lease.Result{})
				if err == nil && (repeated || j == nil || j.State != lease.StateSucceeded) {
					err = fmt.Errorf("complete %s: repeated=%t, job %+v, want a first completion", g.Job.ID, repeated, j)
				}
				errs[i] = err
			})
		}
		wg.Wait()
		for i, g := range gs {
			if errs[i] != nil {
				return ids, errs[i]
			}
			ids = append(ids, g.Job.ID)
		}
	}
}
