package bunstore_test

import (
	"context"
	"fmt"
	"sync"
	"testing"

	"github.com/nodelane/nodelane/internal/testdb"
	"github.com/nodelane/nodelane/lease"
)

// BenchmarkLeaseAcceptComplete measures how fast claimers drain a queue
// through lease.Manager: each claimer is a worker of its own that leases
// up to max_jobs jobs at a time, accepts and completes each, until the
// queue is empty. One op is one job; jobs/s is the throughput.
func BenchmarkLeaseAcceptComplete(b *testing.B) {
	for _, d := range testdb.Dialects() {
		b.Run(d.Name, func(b *testing.B) {
			for _, claimers := range []int{1, 8, 32} {
				for _, maxJobs := range []int{1, 10} {
					b.Run(fmt.Sprintf("claimers=%d/max_jobs=%d", claimers, maxJobs), func(b *testing.B) {
						benchmarkDrain(b, d.New(b), claimers, maxJobs)
					})
				}
			}
		})
	}
}

func benchmarkDrain(b *testing.B, tdb testdb.DB, claimers, maxJobs int) {
	ctx := context.Background()
	db := open(b, tdb)
	m := lease.NewManager(db.LeaseStore(), nil)
	// One transaction for the whole backlog keeps set-up short.
	err := db.InTx(ctx, func(ctx context.Context) error {
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
		mu   sync.Mutex
		done int
		errs = make(chan error, claimers)
	)
	b.ResetTimer()
	for _, w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			n, err := drain(ctx, m, w, maxJobs)
			mu.Lock()
			done += n
			mu.Unlock()
			if err != nil {
				errs <- err
			}
		}()
	}
	wg.Wait()
	b.StopTimer()
	close(errs)
	for err := range errs {
		b.Error(err)
	}
	if done != b.N {
		b.Fatalf("completed %d jobs, want %d", done, b.N)
	}
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "jobs/s")
}

// drain leases, accepts and completes jobs for w until none is left, and
// returns how many it completed.
func drain(ctx context.Context, m *lease.Manager, w *lease.Worker, maxJobs int) (int, error) {
	n := 0
	for {
		gs, err := m.Lease(ctx, lease.LeaseRequest{WorkerID: w.ID, MaxJobs: maxJobs})
		if err != nil {
			return n, err
		}
		if len(gs) == 0 {
			return n, nil
		}
		for _, g := range gs {
			ref := lease.Ref{JobID: g.Job.ID, WorkerID: w.ID, Token: g.Token}
			if _, err := m.Accept(ctx, ref); err != nil {
				return n, err
			}
			if _, _, err := m.Complete(ctx, ref, lease.Result{}); err != nil {
				return n, err
			}
			n++
		}
	}
}
