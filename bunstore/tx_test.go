package bunstore_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nodelane/nodelane/bunstore"
	"github.com/nodelane/nodelane/internal/testdb"
	"github.com/nodelane/nodelane/lease"
)

var errRollback = errors.New("roll back")

func newJob(id string) *lease.Job {
	now := time.Now().UTC().Truncate(time.Microsecond)
	return &lease.Job{ID: id, Type: "status_check", State: lease.StateQueued, Attempt: 1, MaxAttempts: 3, CreatedAt: now, ScheduledAt: now, Rev: 1}
}

func TestInTx(t *testing.T) {
	t.Parallel()
	for _, d := range bunstore.MigratedDialects() {
		t.Run(d.Name, func(t *testing.T) {
			t.Parallel()
			db := open(t, d.New(t))
			s := db.LeaseStore()
			ctx := context.Background()
			exists := func(id string) bool {
				t.Helper()
				_, err := s.GetJob(ctx, id)
				if err != nil && !errors.Is(err, lease.ErrNotFound) {
					t.Fatal(err)
				}
				return err == nil
			}
			tests := []struct {
				name string
				// run creates the jobs ids in some transaction shape.
				run     func(ctx context.Context, ids []string) error
				wantErr error
				kept    bool
			}{
				{
					name: "commit",
					run: func(ctx context.Context, ids []string) error {
						return db.InTx(ctx, func(ctx context.Context) error {
							for _, id := range ids {
								if err := s.CreateJobs(ctx, []*lease.Job{newJob(id)}); err != nil {
									return err
								}
								// The transaction reads its own writes.
								if _, err := s.GetJob(ctx, id); err != nil {
									return err
								}
							}
							return nil
						})
					},
					kept: true,
				},
				{
					name: "rollback",
					run: func(ctx context.Context, ids []string) error {
						return db.InTx(ctx, func(ctx context.Context) error {
							for _, id := range ids {
								if err := s.CreateJobs(ctx, []*lease.Job{newJob(id)}); err != nil {
									return err
								}
							}
							return errRollback
						})
					},
					wantErr: errRollback,
				},
				{
					name: "nested joins the outer",
					run: func(ctx context.Context, ids []string) error {
						return db.InTx(ctx, func(ctx context.Context) error {
							if err := s.CreateJobs(ctx, []*lease.Job{newJob(ids[0])}); err != nil {
								return err
							}
							// The inner InTx returns nil, but commits nothing:
							// the outer one rolls both jobs back.
							if err := db.InTx(ctx, func(ctx context.Context) error {
								return s.CreateJobs(ctx, []*lease.Job{newJob(ids[1])})
							}); err != nil {
								return err
							}
							return errRollback
						})
					},
					wantErr: errRollback,
				},
				{
					name: "host transaction with WithTx",
					run: func(ctx context.Context, ids []string) error {
						tx, err := db.Bun().BeginTx(ctx, nil)
						if err != nil {
							return err
						}
						ctx = bunstore.WithTx(ctx, tx)
						for _, id := range ids {
							if err := s.CreateJobs(ctx, []*lease.Job{newJob(id)}); err != nil {
								tx.Rollback()
								return err
							}
						}
						// PutWorker, AddEvents and ClaimLeases join it rather than begin their own.
						if err := s.PutWorker(ctx, &lease.Worker{ID: "w", NodeID: "n"}); err != nil {
							tx.Rollback()
							return err
						}
						if _, err := s.AddEvents(ctx, []*lease.Event{{JobID: ids[0], Kind: lease.EventLog, Seq: 1}}); err != nil {
							tx.Rollback()
							return err
						}
						now := time.Now()
						if js, err := s.ClaimLeases(ctx, "w", func(*lease.Worker) (lease.ClaimQuery, lease.LeaseClaim, bool, error) {
							return lease.ClaimQuery{WorkerID: "w", Types: []string{"status_check"}, Fits: []lease.Fit{{}}, MaxActive: 1, Limit: 1, Now: now},
								lease.LeaseClaim{Leases: []lease.Lease{{ID: "l", WorkerID: "w", TokenHash: []byte{1}, ExpiresAt: now.Add(time.Hour), AcceptBy: now.Add(time.Hour)}}}, true, nil
						}); err != nil || len(js) != 1 {
							tx.Rollback()
							return fmt.Errorf("claim in the host's transaction: %d jobs, %v", len(js), err)
						}
						if err := tx.Rollback(); err != nil {
							return err
						}
						return errRollback
					},
					wantErr: errRollback,
				},
			}
			for i, tc := range tests {
				t.Run(tc.name, func(t *testing.T) {
					ids := []string{fmt.Sprintf("job_%d_a", i), fmt.Sprintf("job_%d_b", i)}
					err := tc.run(ctx, ids)
					if !errors.Is(err, tc.wantErr) {
						t.Fatalf("err = %v, want %v", err, tc.wantErr)
					}
					for _, id := range ids {
						if got := exists(id); got != tc.kept {
							t.Errorf("job %s exists = %v, want %v", id, got, tc.kept)
						}
					}
					if evs, err := s.ListEvents(ctx, ids[0], 0, 10); err != nil || len(evs) != 0 {
						t.Errorf("events of %s = %v, %v; want none", ids[0], evs, err)
					}
				})
			}
		})
	}
}

// Two handles on one database, as two replicas would have, lease every
// job exactly once between them, and one worker's governor holds across
// both.
func TestReplicas(t *testing.T) {
	t.Parallel()
	for _, d := range bunstore.MigratedDialects() {
		t.Run(d.Name, func(t *testing.T) {
			t.Parallel()
			tdb := d.New(t)
			ctx := context.Background()
			replicas := []*lease.Manager{
				lease.NewManager(open(t, tdb).LeaseStore(), nil),
				lease.NewManager(open(t, tdb).LeaseStore(), nil),
			}
			const jobs, claimers = 200, 8
			for range jobs {
				if _, err := replicas[0].Enqueue(ctx, lease.NewJob{Type: "status_check"}); err != nil {
					t.Fatal(err)
				}
			}
			// One worker with max_jobs 2, leasing through both replicas.
			w, err := replicas[1].RegisterWorker(ctx, &lease.Worker{NodeID: "shared", Capabilities: lease.Capabilities{JobTypes: []string{"status_check"}}, Governor: lease.Governor{MaxJobs: 2}})
			if err != nil {
				t.Fatal(err)
			}
			var wg sync.WaitGroup
			var mu sync.Mutex
			granted := 0
			for c := range claimers {
				wg.Add(1)
				go func() {
					defer wg.Done()
					gs, err := replicas[c%2].Lease(ctx, lease.LeaseRequest{WorkerID: w.ID, MaxJobs: 2})
					if err != nil {
						t.Error(err)
					}
					mu.Lock()
					granted += len(gs)
					mu.Unlock()
				}()
			}
			wg.Wait()
			if granted != 2 {
				t.Fatalf("a worker with max_jobs 2 was granted %d jobs through two replicas", granted)
			}

			seen := make(map[string]int)
			for c := range claimers {
				w, err := replicas[c%2].RegisterWorker(ctx, &lease.Worker{NodeID: fmt.Sprintf("node-%d", c), Capabilities: lease.Capabilities{JobTypes: []string{"status_check"}}, Governor: lease.Governor{MaxJobs: 4}})
				if err != nil {
					t.Fatal(err)
				}
				wg.Add(1)
				go func() {
					defer wg.Done()
					m := replicas[c%2]
					for {
						gs, err := m.Lease(ctx, lease.LeaseRequest{WorkerID: w.ID, MaxJobs: 4})
						if err != nil || len(gs) == 0 {
							if err != nil {
								t.Error(err)
							}
							return
						}
						for _, g := range gs {
							mu.Lock()
							seen[g.Job.ID]++
							mu.Unlock()
							ref := lease.Ref{JobID: g.Job.ID, WorkerID: w.ID, Token: g.Token}
							if _, err := m.Accept(ctx, ref); err != nil {
								t.Error(err)
								return
							}
							if _, _, err := m.Complete(ctx, ref, lease.Result{}); err != nil {
								t.Error(err)
								return
							}
						}
					}
				}()
			}
			wg.Wait()
			if len(seen) != jobs-2 {
				t.Errorf("%d jobs leased, want %d", len(seen), jobs-2)
			}
			for id, n := range seen {
				if n != 1 {
					t.Errorf("job %s leased %d times", id, n)
				}
			}
		})
	}
}

// On SQLite a write that, inside InTx, is called without the
// transaction's context can never run: it fails after the busy timeout
// rather than hanging.
func TestSQLiteWriteOutsideItsTxFails(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db, err := bunstore.Open(ctx, testdb.SQLite(t).DSN, &bunstore.Config{BusyTimeout: 200 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	s := db.LeaseStore()
	start := time.Now()
	err = db.InTx(ctx, func(context.Context) error {
		return s.CreateJobs(ctx, []*lease.Job{newJob("job_outside")}) // ctx, not the tx's
	})
	if err == nil || !strings.Contains(err.Error(), "busy timeout") {
		t.Fatalf("err = %v, want a busy timeout", err)
	}
	if d := time.Since(start); d > 5*time.Second {
		t.Fatalf("took %v", d)
	}
}
