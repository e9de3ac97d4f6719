package bunstore_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"slices"
	"sync"
	"testing"

	"github.com/uptrace/bun"

	"github.com/nodelane/nodelane/bunstore"
	"github.com/nodelane/nodelane/internal/apitest"
	"github.com/nodelane/nodelane/internal/waitfor"
	"github.com/nodelane/nodelane/lease"
	"github.com/nodelane/nodelane/workerapi"
	"github.com/nodelane/nodelane/workerapi/wire"
)

// grouped runs fns through db.InSharedTx, each from a goroutine of its
// own and all with one key, as one shared transaction: a blocker holds
// the key until all of fns queue behind it, so that one call leads
// them all. It returns each call's error (a panic's value as an error
// "panic: v"), and the counts of what the database was sent meanwhile,
// the blocker's commit excluded.
func grouped(t *testing.T, db *bunstore.DB, qc *queryCounter, fns []func(ctx context.Context) error, ctxs []context.Context) ([]error, queryCounts) {
	t.Helper()
	release, entered, blocker := make(chan struct{}), make(chan struct{}), make(chan error, 1)
	go func() {
		blocker <- db.InSharedTx(context.Background(), "k", func(context.Context) error {
			close(entered)
			<-release
			return nil
		})
	}()
	<-entered
	errs := make([]error, len(fns))
	var wg sync.WaitGroup
	for i, fn := range fns {
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer func() {
				if v := recover(); v != nil {
					errs[i] = fmt.Errorf("panic: %v", v)
				}
			}()
			errs[i] = db.InSharedTx(ctxs[i], "k", fn)
		}()
	}
	waitfor.Until(t, "the calls to queue", func() bool { return bunstore.SharedQueued(db) == len(fns) })
	before := qc.snapshot()
	close(release)
	if err := <-blocker; err != nil {
		t.Fatalf("blocker: %v", err)
	}
	wg.Wait()
	counts := qc.snapshot().sub(before)
	counts.TxCommits-- // the blocker's (its BEGIN came before)
	return errs, counts
}

// counted returns a DB on db's connections whose queries qc counts.
func counted(t *testing.T, db *bunstore.DB) (*bunstore.DB, *queryCounter) {
	t.Helper()
	qc := &queryCounter{}
	hooked, err := bunstore.New(db.Bun().WithQueryHook(qc), nil)
	if err != nil {
		t.Fatal(err)
	}
	return hooked, qc
}

type groupKey struct{}

// Concurrent InSharedTx calls share one transaction and one commit; each
// keeps its own outcome: a failing call's writes are gone, a panicking
// call's panic reaches its own caller, a call whose context ended before
// its turn does not run, and a call whose context ends while it runs
// finishes its work, the others' transaction unharmed.
func TestInSharedTx(t *testing.T) {
	t.Parallel()
	for _, d := range bunstore.MigratedDialects() {
		t.Run(d.Name, func(t *testing.T) {
			t.Parallel()
			db, qc := counted(t, open(t, d.New(t)))
			s := db.LeaseStore()
			errBoom := errors.New("boom")
			ctxs := make([]context.Context, 9)
			for i := range ctxs {
				ctxs[i] = context.WithValue(context.Background(), groupKey{}, i)
			}
			var cancelEarly, cancelLate context.CancelFunc
			ctxs[4], cancelEarly = context.WithCancel(ctxs[4])
			cancelEarly()
			ctxs[5], cancelLate = context.WithCancel(ctxs[5])
			fns := []func(ctx context.Context) error{
				create(s, "ok_0"),
				func(ctx context.Context) error {
					if err := create(s, "failed_1")(ctx); err != nil {
						return err
					}
					return errBoom
				},
				create(s, "ok_2"),
				func(ctx context.Context) error {
					if err := create(s, "panicked_3")(ctx); err != nil {
						return err
					}
					panic("boom 3")
				},
				create(s, "canceled_4"),
				func(ctx context.Context) error {
					// Its caller goes away while it runs: its statements
					// still run, on a connection the others still use.
					cancelLate()
					if ctx.Err() != nil {
						return fmt.Errorf("the call's context: %w", ctx.Err())
					}
					if got := ctx.Value(groupKey{}); got != 5 {
						return fmt.Errorf("the call's context carries %v, want its own 5", got)
					}
					return create(s, "late_5")(ctx)
				},
				create(s, "ok_6"),
				// A statement that fails (on PostgreSQL, failing the
				// transaction until the savepoint's rollback).
				func(ctx context.Context) error {
					if err := create(s, "bad_7")(ctx); err != nil {
						return err
					}
					_, err := db.Bun().NewRaw("SELECT * FROM no_such_table").Conn(txOf(ctx)).Exec(ctx)
					return err
				},
				// The same, its error ignored: on PostgreSQL, RELEASE
				// SAVEPOINT fails.
				func(ctx context.Context) error {
					db.Bun().NewRaw("SELECT * FROM no_such_table").Conn(txOf(ctx)).Exec(ctx)
					return nil
				},
			}
			pg := d.Name == "postgres"
			errs, counts := grouped(t, db, qc, fns, ctxs)
			want := []error{nil, errBoom, nil, nil, context.Canceled, nil, nil, nil, nil}
			for i, err := range errs {
				switch {
				case i == 3:
					if err == nil || err.Error() != "panic: boom 3" {
						t.Errorf("call 3 = %v, want its panic", err)
					}
				case i == 7 || i == 8 && pg:
					if err == nil {
						t.Errorf("call %d = nil, want its statement's error", i)
					}
				case !errors.Is(err, want[i]):
					t.Errorf("call %d = %v, want %v", i, err, want[i])
				}
			}
			for id, kept := range map[string]bool{"ok_0": true, "failed_1": false, "ok_2": true, "panicked_3": false, "canceled_4": false, "late_5": true, "ok_6": true, "bad_7": false} {
				_, err := s.GetJob(context.Background(), id)
				if got := err == nil; got != kept || err != nil && !errors.Is(err, lease.ErrNotFound) {
					t.Errorf("job %s: %v; want kept %v", id, err, kept)
				}
			}
			if counts.Begins != 1 || counts.TxCommits != 1 || counts.Rollbacks != 0 {
				t.Errorf("%d calls: %d BEGIN, %d COMMIT, %d ROLLBACK; want one transaction", len(fns), counts.Begins, counts.TxCommits, counts.Rollbacks)
			}
		})
	}
}

// A commit that fails is the error of every call in the transaction,
// those whose own work succeeded included, and the DB goes on working.
func TestInSharedTxCommitFails(t *testing.T) {
	t.Parallel()
	for _, d := range bunstore.MigratedDialects() {
		t.Run(d.Name, func(t *testing.T) {
			t.Parallel()
			db := open(t, d.New(t))
			s := db.LeaseStore()
			ctx := context.Background()
			ok := func(ctx context.Context) error {
				return s.CreateJobs(ctx, []*lease.Job{newJob(fmt.Sprint("committed_", ctx.Value(groupKey{})))})
			}
			// A deferred foreign key fails the commit, not the statement.
			orphan := func(ctx context.Context) error {
				tx, _ := bunstore.TxFrom(ctx)
				for _, q := range []string{
					"CREATE TEMP TABLE group_parent (id INTEGER PRIMARY KEY)",
					"CREATE TEMP TABLE group_child (parent INTEGER REFERENCES group_parent (id) DEFERRABLE INITIALLY DEFERRED)",
					"INSERT INTO group_child VALUES (1)",
				} {
					if _, err := tx.ExecContext(ctx, q); err != nil {
						return err
					}
				}
				return nil
			}
			ctxs := []context.Context{context.WithValue(ctx, groupKey{}, 0), ctx, context.WithValue(ctx, groupKey{}, 2)}
			errs, _ := grouped(t, db, &queryCounter{}, []func(ctx context.Context) error{ok, orphan, ok}, ctxs)
			for i, err := range errs {
				if err == nil || err.Error() != errs[0].Error() {
					t.Errorf("call %d = %v, want the commit's error", i, err)
				}
			}
			for _, id := range []string{"committed_0", "committed_2"} {
				if _, err := s.GetJob(ctx, id); !errors.Is(err, lease.ErrNotFound) {
					t.Errorf("job %s after the failed commit: %v, want ErrNotFound", id, err)
				}
			}
			for i := range 3 {
				if err := db.InSharedTx(ctx, "k", create(s, fmt.Sprintf("after_%d", i))); err != nil {
					t.Fatalf("a transaction after the failed commit: %v", err)
				}
			}
		})
	}
}

func txOf(ctx context.Context) bun.Tx {
	tx, _ := bunstore.TxFrom(ctx)
	return tx
}

func create(s lease.Store, id string) func(ctx context.Context) error {
	return func(ctx context.Context) error { return s.CreateJobs(ctx, []*lease.Job{newJob(id)}) }
}

// errInjected is the failure failingEvents injects.
var errInjected = errors.New("injected failure after the write")

// failingEvents is a lease.Store whose AddEvents fails, after its write,
// for the events of one job.
type failingEvents struct {
	lease.Store
	job string
}

func (s failingEvents) AddEvents(ctx context.Context, evs []*lease.Event) (int, error) {
	n, err := s.Store.AddEvents(ctx, evs)
	if err == nil && len(evs) > 0 && evs[0].JobID == s.job {
		return 0, errInjected
	}
	return n, err
}

// A node's concurrent signed requests, over HTTP, share one transaction
// of DB.InSharedTx: a request whose handler fails after writing has its
// write undone and its nonce consumed (its replay is refused), while
// the others in its transaction commit.
func TestSignedRequestsShareTx(t *testing.T) {
	t.Parallel()
	for _, d := range []string{"sqlite", "postgres"} {
		t.Run(d, func(t *testing.T) {
			t.Parallel()
			// The Server runs on a DB whose queries qc counts.
			var db *bunstore.DB
			qc := &queryCounter{}
			fail := &failingEvents{}
			env := apitest.New(t, d, apitest.WithStores(func(st workerapi.Stores) workerapi.Stores {
				var err error
				if db, err = bunstore.New(st.Tx.(*bunstore.DB).Bun().WithQueryHook(qc), nil); err != nil {
					t.Fatal(err)
				}
				fail.Store = db.LeaseStore()
				st.Tx, st.Leases, st.Credentials, st.Nonces = db, fail, db.CredentialStore(), db.NonceStore(nil)
				st.Envelope, st.Receipts, st.Fingerprints = db.EnvelopeStore(), db.ReceiptStore(), db.FingerprintStore()
				return st
			}))
			ctx := context.Background()
			n := env.NewNode(t, "gpu-group")
			n.Register(t, wire.RegisterRequest{
				Name: "group", Capabilities: wire.Capabilities{JobTypes: []string{"status_check"}},
				GovernorLimits: wire.GovernorLimits{MaxJobs: 3}, HeartbeatIntervalSeconds: 30,
			})
			for range 3 {
				env.Enqueue(t, lease.NewJob{Type: "status_check"})
			}
			out := apitest.Post[wire.LeaseResponse](t, n, wire.PathLease, wire.LeaseRequest{SupportedJobTypes: []string{"status_check"}, MaxJobs: 3, Accept: true}, http.StatusOK)
			if len(out.Leases) != 3 {
				t.Fatalf("leased %d jobs, want 3", len(out.Leases))
			}
			fail.job = out.Leases[1].Job.ID
			reqs := make([]*http.Request, 3)
			bodies := make([][]byte, 3)
			for i, g := range out.Leases {
				bodies[i] = apitest.Body(t, wire.LogsRequest{LeaseToken: g.LeaseToken, Entries: []wire.LogEntry{{Seq: 1, Message: "shared"}}})
				reqs[i] = n.Request(t, http.MethodPost, "/workers/jobs/"+g.Job.ID+"/logs", bodies[i])
			}

			// The node's key is held until the three requests queue for it.
			release, entered, blocker := make(chan struct{}), make(chan struct{}), make(chan error, 1)
			go func() {
				blocker <- db.InSharedTx(ctx, n.WorkerID, func(context.Context) error {
					close(entered)
					<-release
					return nil
				})
			}()
			<-entered
			codes := make([]int, 3)
			var wg sync.WaitGroup
			for i, r := range reqs {
				wg.Add(1)
				go func() {
					defer wg.Done()
					resp, b := n.Raw(t, r)
					codes[i] = resp.StatusCode
					t.Logf("logs of job %d: %d %s", i, resp.StatusCode, b)
				}()
			}
			waitfor.Until(t, "the requests to queue", func() bool { return bunstore.SharedQueued(db) == 3 })
			before := qc.snapshot()
			close(release)
			if err := <-blocker; err != nil {
				t.Fatal(err)
			}
			wg.Wait()
			counts := qc.snapshot().sub(before)

			if want := []int{http.StatusOK, http.StatusServiceUnavailable, http.StatusOK}; !slices.Equal(codes, want) {
				t.Errorf("statuses %v, want %v", codes, want)
			}
			for i, g := range out.Leases {
				evs, err := db.LeaseStore().ListEvents(ctx, g.Job.ID, 0, 10)
				if err != nil {
					t.Fatal(err)
				}
				if got, want := len(evs), map[bool]int{true: 0, false: 1}[i == 1]; got != want {
					t.Errorf("job %d has %d log events, want %d", i, got, want)
				}
			}
			// One transaction for the three (the blocker's commit came
			// first; the failed request's nonce was consumed outside any).
			if counts.Begins != 1 || counts.TxCommits != 2 {
				t.Errorf("%d BEGIN, %d COMMIT, want 1 and 2 (the blocker's and the three requests')", counts.Begins, counts.TxCommits)
			}
			// The failed request's bytes never run again.
			replayed := reqs[1].Clone(ctx)
			replayed.Body = io.NopCloser(bytes.NewReader(bodies[1]))
			if resp, b := n.Raw(t, replayed); resp.StatusCode != http.StatusUnauthorized || !bytes.Contains(b, []byte(`"replayed_nonce"`)) {
				t.Errorf("replay of the failed request: %d %s, want 401 replayed_nonce", resp.StatusCode, b)
			}
		})
	}
}
