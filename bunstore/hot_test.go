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

// leasedJobs enqueues n jobs and leases each to a worker of its own.
func leasedJobs(t *testing.T, ctx context.Context, m *lease.Manager, n int) []lease.Ref {
	t.Helper()
	refs := make([]lease.Ref, n)
	for i := range n {
		if _, err := m.Enqueue(ctx, lease.NewJob{Type: "status_check"}); err != nil {
			t.Fatal(err)
		}
		w, err := m.RegisterWorker(ctx, &lease.Worker{NodeID: fmt.Sprintf("hot-%03d", i), Capabilities: lease.Capabilities{JobTypes: []string{"status_check"}}})
		if err != nil {
			t.Fatal(err)
		}
		gs, err := m.Lease(ctx, lease.LeaseRequest{WorkerID: w.ID, MaxJobs: 1})
		if err != nil || len(gs) != 1 {
			t.Fatalf("lease: %v, %d grants", err, len(gs))
		}
		refs[i] = lease.Ref{JobID: gs[0].Job.ID, WorkerID: w.ID, Token: gs[0].Token}
	}
	return refs
}

// TestGatheredTransitions checks that concurrent Accepts and Completes, gathered into
// shared statements, each get their own answer: a wrong token or a
// second completion in the same gathering costs the others nothing.
func TestGatheredTransitions(t *testing.T) {
	t.Parallel()
	for _, d := range bunstore.MigratedDialects() {
		t.Run(d.Name, func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			m := lease.NewManager(open(t, d.New(t)).LeaseStore(), nil)
			const n = 40
			refs := leasedJobs(t, ctx, m, n)
			wrong := refs[1].Token // a live token of another job

			var wg sync.WaitGroup
			errs := make([]error, n)
			for i, ref := range refs {
				wg.Go(func() {
					if i%5 == 0 {
						// Another job's token: refused, and this job stays leased.
						bad := ref
						bad.Token = wrong
						if _, err := m.Accept(ctx, bad); !errors.Is(err, lease.ErrLeaseLost) {
							errs[i] = fmt.Errorf("accept with another job's token: %v, want ErrLeaseLost", err)
						}
						return
					}
					j, err := m.Accept(ctx, ref)
					if err != nil || j.State != lease.StateRunning {
						errs[i] = fmt.Errorf("accept: %v, %+v", err, j)
					}
				})
			}
			wg.Wait()
			if err := errors.Join(errs...); err != nil {
				t.Fatal(err)
			}

			// Each running job completed twice at once: one first
			// completion, one repeat, whatever gathering they share.
			var (
				mu     sync.Mutex
				firsts = map[string]int{}
			)
			for i, ref := range refs {
				if i%5 == 0 {
					continue
				}
				for range 2 {
					wg.Go(func() {
						j, repeated, err := m.Complete(ctx, ref, lease.Result{OutputURI: "s3://out/" + ref.JobID, Metrics: []byte(`{"i":1}`)})
						if err != nil || j.State != lease.StateSucceeded {
							mu.Lock()
							errs[i] = fmt.Errorf("complete: %v, %+v", err, j)
							mu.Unlock()
							return
						}
						if !repeated {
							mu.Lock()
							firsts[ref.JobID]++
							mu.Unlock()
						}
					})
				}
			}
			wg.Wait()
			if err := errors.Join(errs...); err != nil {
				t.Fatal(err)
			}
			for i, ref := range refs {
				j, err := m.Get(ctx, ref.JobID)
				if err != nil {
					t.Fatal(err)
				}
				if i%5 == 0 {
					if j.State != lease.StateLeased {
						t.Errorf("job %d, refused: state %s, want leased", i, j.State)
					}
					continue
				}
				if firsts[ref.JobID] != 1 || j.State != lease.StateSucceeded || j.Result == nil || j.Result.OutputURI != "s3://out/"+ref.JobID || string(j.Result.Metrics) != `{"i":1}` {
					t.Errorf("job %d: %d first completions, stored %+v", i, firsts[ref.JobID], j)
				}
			}
		})
	}
}

// TestGuardedWrites checks that one call of AcceptLeased and CompleteRunning with
// several writes applies exactly those whose guard holds, the first of
// two for one job, and answers in the order of the writes.
func TestGuardedWrites(t *testing.T) {
	t.Parallel()
	for _, d := range bunstore.MigratedDialects() {
		t.Run(d.Name, func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			now := time.Date(2026, 12, 1, 9, 0, 0, 0, time.UTC)
			clock := func() time.Time { return now }
			st := open(t, d.New(t)).LeaseStore()
			m := lease.NewManager(st, &lease.Config{Now: clock})
			refs := leasedJobs(t, ctx, m, 3)
			g := func(ref lease.Ref, at time.Time) lease.Guard {
				j, err := m.Get(ctx, ref.JobID)
				if err != nil {
					t.Fatal(err)
				}
				return lease.Guard{JobID: ref.JobID, WorkerID: ref.WorkerID, TokenHash: j.Lease.TokenHash, Now: at}
			}
			stale := g(refs[2], now.Add(time.Hour)) // past its accept deadline
			ws := []lease.AcceptWrite{
				{Guard: g(refs[0], now), TTL: time.Minute, MaxRuntime: 30 * time.Second},
				{Guard: g(refs[0], now), TTL: time.Minute, MaxRuntime: time.Hour}, // the same job again
				{Guard: g(refs[1], now), TTL: time.Minute, MaxRuntime: time.Hour},
				{Guard: stale, TTL: time.Minute, MaxRuntime: time.Hour},
				{Guard: lease.Guard{JobID: "job_nope", WorkerID: refs[0].WorkerID, TokenHash: stale.TokenHash, Now: now}, TTL: time.Minute},
			}
			js, err := st.AcceptLeased(ctx, ws)
			if err != nil {
				t.Fatal(err)
			}
			if len(js) != len(ws) || js[0] == nil || js[1] != nil || js[2] == nil || js[3] != nil || js[4] != nil {
				t.Fatalf("AcceptLeased answered %v", js)
			}
			// The lesser of the TTL and the max runtime.
			if got := js[0].Lease.ExpiresAt; !got.Equal(now.Add(30 * time.Second)) {
				t.Errorf("expiry %v, want now + the max runtime", got)
			}
			if got := js[2].Lease.ExpiresAt; js[2].State != lease.StateRunning || !got.Equal(now.Add(time.Minute)) || !js[2].AcceptedAt.Equal(now) {
				t.Errorf("accepted %+v", js[2])
			}
			cs, err := st.CompleteRunning(ctx, []lease.CompleteWrite{
				{Guard: g(refs[0], now.Add(31*time.Second)), MaxRuntime: time.Hour}, // past its expiry
				{Guard: g(refs[1], now.Add(time.Second)), MaxRuntime: time.Hour, Result: lease.Result{FinalMessage: "done"}},
				{Guard: g(refs[2], now), MaxRuntime: time.Hour}, // not running
			})
			if err != nil {
				t.Fatal(err)
			}
			if cs[0] != nil || cs[1] == nil || cs[2] != nil || cs[1].State != lease.StateSucceeded || cs[1].Result.FinalMessage != "done" {
				t.Fatalf("CompleteRunning answered %v", cs)
			}
			for i, want := range []lease.State{lease.StateRunning, lease.StateSucceeded, lease.StateLeased} {
				if j, err := m.Get(ctx, refs[i].JobID); err != nil || j.State != want {
					t.Errorf("job %d: %v %v, want %s", i, j, err, want)
				}
			}
		})
	}
}

// On PostgreSQL the hot statements are prepared once per connection and
// reused (pgx's statement cache), and bun's statements, whose arguments
// are in their text, are never prepared (the simple protocol): with one
// connection, its prepared statements are the hot ones, each once,
// however many calls ran.
func TestPreparedStatements(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	tdb := testdb.Postgres(t)
	open(t, tdb) // migrates, which takes two connections
	db, err := bunstore.Open(ctx, tdb.DSN, &bunstore.Config{MaxOpenConns: 1, SkipMigrations: true})
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	m := lease.NewManager(db.LeaseStore(), nil)
	for _, ref := range leasedJobs(t, ctx, m, 5) {
		if _, err := m.Accept(ctx, ref); err != nil {
			t.Fatal(err)
		}
		if _, _, err := m.Complete(ctx, ref, lease.Result{}); err != nil {
			t.Fatal(err)
		}
	}
	var stmts []string
	if err := db.Bun().NewRaw("SELECT statement FROM pg_prepared_statements").Scan(ctx, &stmts); err != nil {
		t.Fatal(err)
	}
	var lock, workers, claim, accept, complete int
	for _, s := range stmts {
		switch {
		case strings.Contains(s, "pg_advisory_xact_lock"):
			lock++
		case strings.Contains(s, "FROM nodelane_workers AS w"):
			workers++
		case strings.Contains(s, "FOR UPDATE SKIP LOCKED"):
			claim++
		case strings.Contains(s, "accepted_at ="):
			accept++
		case strings.Contains(s, "finished_at ="):
			complete++
		default:
			t.Errorf("a statement that is not a hot one was prepared: %.120s", s)
		}
	}
	if lock != 1 || workers != 1 || claim != 1 || accept != 1 || complete != 1 {
		t.Errorf("prepared the claim's lock %d, its workers %d, the claim %d, accept %d, complete %d times; want each once, for 5 calls of each (%d statements)",
			lock, workers, claim, accept, complete, len(stmts))
	}
}

// The claim turns bitmap scans off for its own transaction only (SET
// LOCAL): the connection it ran on has them again afterwards.
func TestClaimPlannerSettingStaysInItsTransaction(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	tdb := testdb.Postgres(t)
	open(t, tdb) // migrates
	db, err := bunstore.Open(ctx, tdb.DSN, &bunstore.Config{MaxOpenConns: 1, SkipMigrations: true})
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	m := lease.NewManager(db.LeaseStore(), nil)
	leasedJobs(t, ctx, m, 2)
	for _, name := range []string{"enable_sort", "jit", "enable_bitmapscan", "enable_hashjoin", "enable_mergejoin"} {
		var setting string
		if err := db.Bun().NewRaw("SHOW "+name).Scan(ctx, &setting); err != nil {
			t.Fatal(err)
		}
		if setting != "on" {
			t.Errorf("after a claim, the connection has %s = %s", name, setting)
		}
	}
}
