package workerapitest_test

import (
	"context"
	"errors"
	"os"
	"os/exec"
	"regexp"
	"strings"
	"testing"
	"time"

	"golang.org/x/mod/sumdb/tlog"

	"github.com/nodelane/nodelane/bunstore"
	"github.com/nodelane/nodelane/credential"
	"github.com/nodelane/nodelane/envelope"
	"github.com/nodelane/nodelane/internal/apitest"
	"github.com/nodelane/nodelane/lease"
	"github.com/nodelane/nodelane/receipts"
	"github.com/nodelane/nodelane/replay"
	"github.com/nodelane/nodelane/workerapi"
	"github.com/nodelane/nodelane/workerapi/workerapitest"
)

// The control: bunstore's stores on SQLite pass, so that the wrong
// adapters below fail for what is wrong with them. (bunstore's own
// tests run the suite on PostgreSQL too.)
func TestBunstoreSQLite(t *testing.T) {
	t.Parallel()
	workerapitest.Run(t, func(t *testing.T) workerapi.Stores {
		return bunstoreStores(openSQLite(t))
	})
}

// openSQLite opens bunstore on a new SQLite database (a copy of one
// migrated once: the suite opens hundreds).
func openSQLite(t *testing.T) *bunstore.DB {
	t.Helper()
	db, err := bunstore.Open(t.Context(), apitest.SQLite(t).DSN, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	return db
}

func bunstoreStores(db *bunstore.DB) workerapi.Stores {
	return workerapi.Stores{
		Tx:          db,
		Leases:      db.LeaseStore(),
		Credentials: db.CredentialStore(),
		Nonces:      db.NonceStore(nil),
		Envelope:    db.EnvelopeStore(),
		Receipts:    db.ReceiptStore(),
	}
}

// wrongEnv names the wrong adapter that a child process of
// TestWrongAdapters runs the suite on.
const wrongEnv = "NODELANE_WORKERAPITEST_WRONG"

// openStuck opens bunstore on a new SQLite database, where a write called
// inside InTx without the transaction's context, which waits for the
// write slot its own transaction holds, fails after 100 ms rather than
// the default 10 s. Only that wait is shortened: the handle is opened as
// testdb opens one, with SQLite's own busy timeout left long.
func openStuck(t *testing.T) *bunstore.DB {
	t.Helper()
	db, err := bunstore.New(apitest.SQLite(t).Bun(t), &bunstore.Config{BusyTimeout: 100 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	if err := db.Migrate(t.Context()); err != nil {
		t.Fatal(err)
	}
	return db
}

// suite mirrors the suite's subtests: each store, its write methods.
var suite = []struct {
	store  string
	writes []string
}{
	{"Leases", []string{"CreateJobs", "UpdateJob", "ClaimLeases", "AcceptLeased", "CompleteRunning", "AddEvents", "AddArtifact", "PutWorker", "SetApproval", "DeleteEnded"}},
	{"Credentials", []string{"CreatePrincipal", "UpdatePrincipal", "CreateCredential", "UpdateCredential"}},
	{"Nonces", []string{"Insert", "Collect"}},
	{"Envelope", []string{"Apply"}},
	{"Receipts", []string{"AddReceipt", "Sequence", "AddCheckpoint"}},
}

// leaves returns the subtests of the cases named, for the stores for
// which store returns true.
func leaves(store func(string) bool, cases ...string) []string {
	var out []string
	for _, s := range suite {
		if !store(s.store) {
			continue
		}
		for _, w := range s.writes {
			for _, c := range cases {
				out = append(out, s.store+"/"+w+"/"+c)
			}
		}
	}
	return out
}

func allStores(string) bool    { return true }
func notNonces(s string) bool  { return s != "Nonces" }
func onlyNonces(s string) bool { return s == "Nonces" }

// wrongAdapter is an adapter with one defect, and the subtests of the
// suite that must fail and pass on it.
type wrongAdapter struct {
	name       string
	open       func(t *testing.T) workerapi.Stores
	fail, pass []string
}

func wrongAdapters() []wrongAdapter {
	return []wrongAdapter{
		{
			// A Transactor that runs fn with no transaction: every store
			// call commits on its own, so nothing rolls back.
			name: "PassThrough",
			open: func(t *testing.T) workerapi.Stores {
				st := bunstoreStores(openSQLite(t))
				st.Tx = passThrough{}
				return st
			},
			fail: leaves(allStores, "Rollback", "Nested"),
			pass: leaves(allStores, "ReadsOwnWrite", "Commit"),
		},
		{
			// The cores' MemoryStores, which know no transaction, under a
			// pass-through Transactor: fine for one process's tests, not
			// for a Server.
			name: "MemoryStores",
			open: func(*testing.T) workerapi.Stores {
				return workerapi.Stores{
					Tx:          passThrough{},
					Leases:      lease.NewMemoryStore(),
					Credentials: credential.NewMemoryStore(),
					Nonces:      replay.NewMemoryStore(nil),
					Envelope:    envelope.NewMemoryStore(),
					Receipts:    receipts.NewMemoryStore(),
				}
			},
			fail: leaves(allStores, "Rollback", "Nested"),
			pass: leaves(allStores, "ReadsOwnWrite", "Commit"),
		},
		{
			// A Transactor that, called with a context that carries a
			// transaction, begins another one rather than join it. On
			// SQLite the inner write then waits for the outer
			// transaction's write slot and fails.
			name: "NestedBeginsOwnTx",
			open: func(t *testing.T) workerapi.Stores {
				db := openStuck(t)
				st := bunstoreStores(db)
				st.Tx = ownTx{db}
				return st
			},
			fail: leaves(allStores, "Nested"),
			pass: leaves(allStores, "Rollback", "ReadsOwnWrite", "Commit"),
		},
		{
			// Stores whose every call runs without the transaction its
			// context carries: on SQLite a write inside InTx then waits
			// for the transaction's write slot and fails.
			name: "DropsTx",
			open: func(t *testing.T) workerapi.Stores {
				return drop(bunstoreStores(openStuck(t)), dropper{writes: true, reads: true})
			},
			fail: leaves(allStores, "Rollback", "ReadsOwnWrite", "Commit", "Nested"),
		},
		{
			// Stores whose reads run without the transaction its context
			// carries, so they miss its uncommitted writes. A NonceStore
			// has no read method (an Insert of a nonce it holds is its
			// read), so its cases pass.
			name: "ReadsOutsideTx",
			open: func(t *testing.T) workerapi.Stores {
				return drop(bunstoreStores(openSQLite(t)), dropper{reads: true})
			},
			fail: leaves(notNonces, "ReadsOwnWrite", "Nested"),
			pass: append(leaves(notNonces, "Rollback", "Commit"), leaves(onlyNonces, "Rollback", "ReadsOwnWrite", "Commit", "Nested")...),
		},
	}
}

// TestWrongAdapters shows that the suite fails adapters whose stores do
// not join the transaction, and names what fails. It runs the suite on
// each wrong adapter in a child process (this test binary, with wrongEnv
// naming the adapter), which must exit with a test failure.
func TestWrongAdapters(t *testing.T) {
	t.Parallel()
	adapters := wrongAdapters()
	if name := os.Getenv(wrongEnv); name != "" {
		for _, a := range adapters {
			if a.name == name {
				workerapitest.Run(t, a.open)
				return
			}
		}
		t.Fatalf("%s=%s names no wrong adapter", wrongEnv, name)
	}
	for _, a := range adapters {
		t.Run(a.name, func(t *testing.T) {
			t.Parallel()
			cmd := exec.CommandContext(t.Context(), os.Args[0], "-test.run=^TestWrongAdapters$", "-test.v", "-test.count=1", "-test.timeout=5m")
			cmd.Env = append(os.Environ(), wrongEnv+"="+a.name)
			out, err := cmd.CombinedOutput()
			var exit *exec.ExitError
			if !errors.As(err, &exit) || exit.ExitCode() != 1 {
				t.Fatalf("the suite on %s: %v, want a test failure (exit status 1); output:\n%s", a.name, err, out)
			}
			text := string(out)
			bad := false
			for _, want := range a.fail {
				if !strings.Contains(text, "--- FAIL: TestWrongAdapters/"+want+" (") {
					t.Errorf("%s did not fail", want)
					bad = true
				}
			}
			for _, want := range a.pass {
				if !strings.Contains(text, "--- PASS: TestWrongAdapters/"+want+" (") {
					t.Errorf("%s did not pass", want)
					bad = true
				}
			}
			// Every case ran, and the lists above cover them all.
			if n := len(leafResult.FindAllString(text, -1)); n != len(a.fail)+len(a.pass) {
				t.Errorf("the suite reported %d cases, want %d: the list of the suite's writes here is stale", n, len(a.fail)+len(a.pass))
				bad = true
			}
			if bad {
				t.Logf("output of the suite on %s:\n%s", a.name, out)
			}
		})
	}
}

// leafResult matches the result line of one case of the suite.
var leafResult = regexp.MustCompile(`--- (PASS|FAIL): TestWrongAdapters/[^/ ]+/[^/ ]+/[^/ ]+ \(`)

// passThrough runs fn with no transaction at all.
type passThrough struct{}

func (passThrough) InTx(ctx context.Context, fn func(ctx context.Context) error) error {
	return fn(ctx)
}

// detached is ctx without its values, bunstore's transaction among them;
// it keeps ctx's deadline and cancellation.
type detached struct{ context.Context }

func (detached) Value(any) any { return nil }

// ownTx begins a transaction of its own even when ctx carries one.
type ownTx struct{ db *bunstore.DB }

func (o ownTx) InTx(ctx context.Context, fn func(ctx context.Context) error) error {
	return o.db.InTx(detached{ctx}, fn)
}

// dropper chooses the context a wrapped store call runs with: without the
// caller's transaction for the kinds of call it drops.
type dropper struct{ writes, reads bool }

func (d dropper) w(ctx context.Context) context.Context {
	if d.writes {
		return detached{ctx}
	}
	return ctx
}

func (d dropper) r(ctx context.Context) context.Context {
	if d.reads {
		return detached{ctx}
	}
	return ctx
}

// drop wraps every store of st with d.
func drop(st workerapi.Stores, d dropper) workerapi.Stores {
	st.Leases = leases{st.Leases, d}
	st.Credentials = credentials{st.Credentials, d}
	st.Nonces = nonces{st.Nonces, d}
	st.Envelope = envelopes{st.Envelope, d}
	st.Receipts = receiptStore{st.Receipts, d}
	return st
}

type leases struct {
	lease.Store
	d dropper
}

func (s leases) CreateJobs(ctx context.Context, js []*lease.Job) error {
	return s.Store.CreateJobs(s.d.w(ctx), js)
}

func (s leases) GetJob(ctx context.Context, id string) (*lease.Job, error) {
	return s.Store.GetJob(s.d.r(ctx), id)
}

func (s leases) ListJobs(ctx context.Context, f lease.JobFilter) ([]*lease.Job, error) {
	return s.Store.ListJobs(s.d.r(ctx), f)
}

func (s leases) UpdateJob(ctx context.Context, j *lease.Job, rev int64) error {
	return s.Store.UpdateJob(s.d.w(ctx), j, rev)
}

func (s leases) ClaimLeases(ctx context.Context, workerID string, plan func(*lease.Worker) (lease.ClaimQuery, lease.LeaseClaim, bool, error)) ([]*lease.Job, error) {
	return s.Store.ClaimLeases(s.d.w(ctx), workerID, plan)
}

func (s leases) AcceptLeased(ctx context.Context, ws []lease.AcceptWrite) ([]*lease.Job, error) {
	return s.Store.AcceptLeased(s.d.w(ctx), ws)
}

func (s leases) CompleteRunning(ctx context.Context, ws []lease.CompleteWrite) ([]*lease.Job, error) {
	return s.Store.CompleteRunning(s.d.w(ctx), ws)
}

func (s leases) ExpiredJobs(ctx context.Context, now time.Time, limit int) ([]*lease.Job, error) {
	return s.Store.ExpiredJobs(s.d.r(ctx), now, limit)
}

func (s leases) DeleteEnded(ctx context.Context, before time.Time, limit int) (int, error) {
	return s.Store.DeleteEnded(s.d.w(ctx), before, limit)
}

func (s leases) AddEvents(ctx context.Context, evs []*lease.Event) (int, error) {
	return s.Store.AddEvents(s.d.w(ctx), evs)
}

func (s leases) ListEvents(ctx context.Context, jobID string, after int64, limit int) ([]*lease.Event, error) {
	return s.Store.ListEvents(s.d.r(ctx), jobID, after, limit)
}

func (s leases) AddArtifact(ctx context.Context, a *lease.Artifact) error {
	return s.Store.AddArtifact(s.d.w(ctx), a)
}

func (s leases) ListArtifacts(ctx context.Context, f lease.ArtifactFilter) ([]*lease.Artifact, error) {
	return s.Store.ListArtifacts(s.d.r(ctx), f)
}

func (s leases) PutWorker(ctx context.Context, w *lease.Worker) error {
	return s.Store.PutWorker(s.d.w(ctx), w)
}

func (s leases) SetApproval(ctx context.Context, id string, prevAt *time.Time, a lease.Approval) error {
	return s.Store.SetApproval(s.d.w(ctx), id, prevAt, a)
}

func (s leases) GetWorker(ctx context.Context, id string) (*lease.Worker, error) {
	return s.Store.GetWorker(s.d.r(ctx), id)
}

func (s leases) WorkerByNode(ctx context.Context, nodeID string) (*lease.Worker, error) {
	return s.Store.WorkerByNode(s.d.r(ctx), nodeID)
}

func (s leases) ListWorkers(ctx context.Context, f lease.WorkerFilter) ([]*lease.Worker, error) {
	return s.Store.ListWorkers(s.d.r(ctx), f)
}

type credentials struct {
	credential.Store
	d dropper
}

func (s credentials) CreatePrincipal(ctx context.Context, p *credential.Principal) error {
	return s.Store.CreatePrincipal(s.d.w(ctx), p)
}

func (s credentials) GetPrincipal(ctx context.Context, id string) (*credential.Principal, error) {
	return s.Store.GetPrincipal(s.d.r(ctx), id)
}

func (s credentials) UpdatePrincipal(ctx context.Context, p *credential.Principal, rev int64) error {
	return s.Store.UpdatePrincipal(s.d.w(ctx), p, rev)
}

func (s credentials) CreateCredential(ctx context.Context, c *credential.Credential) error {
	return s.Store.CreateCredential(s.d.w(ctx), c)
}

func (s credentials) GetCredential(ctx context.Context, id string) (*credential.Credential, error) {
	return s.Store.GetCredential(s.d.r(ctx), id)
}

func (s credentials) UpdateCredential(ctx context.Context, c *credential.Credential, rev int64) error {
	return s.Store.UpdateCredential(s.d.w(ctx), c, rev)
}

func (s credentials) ListCredentials(ctx context.Context, f credential.CredentialFilter) ([]*credential.Credential, error) {
	return s.Store.ListCredentials(s.d.r(ctx), f)
}

func (s credentials) ChargeQuota(ctx context.Context, c credential.QuotaCharge) (credential.Quota, bool, error) {
	return s.Store.ChargeQuota(s.d.w(ctx), c)
}

type nonces struct {
	replay.Store
	d dropper
}

func (s nonces) Insert(ctx context.Context, nodeID, nonce string, expires, now time.Time) error {
	return s.Store.Insert(s.d.w(ctx), nodeID, nonce, expires, now)
}

func (s nonces) Collect(ctx context.Context, now time.Time) (int, error) {
	return s.Store.Collect(s.d.w(ctx), now)
}

type envelopes struct {
	envelope.Store
	d dropper
}

func (s envelopes) State(ctx context.Context) (envelope.State, error) {
	return s.Store.State(s.d.r(ctx))
}

func (s envelopes) Apply(ctx context.Context, prev int64, next envelope.State, rec envelope.Record) error {
	return s.Store.Apply(s.d.w(ctx), prev, next, rec)
}

func (s envelopes) History(ctx context.Context, after int64, limit int) ([]envelope.Record, error) {
	return s.Store.History(s.d.r(ctx), after, limit)
}

type receiptStore struct {
	receipts.Store
	d dropper
}

func (s receiptStore) AddReceipt(ctx context.Context, r *receipts.Stored) error {
	return s.Store.AddReceipt(s.d.w(ctx), r)
}

func (s receiptStore) GetReceipt(ctx context.Context, id string) (*receipts.Stored, error) {
	return s.Store.GetReceipt(s.d.r(ctx), id)
}

func (s receiptStore) ListReceipts(ctx context.Context, from int64, limit int) ([]*receipts.Stored, error) {
	return s.Store.ListReceipts(s.d.r(ctx), from, limit)
}

func (s receiptStore) Sequence(ctx context.Context, limit int, integrate receipts.IntegrateFunc) error {
	return s.Store.Sequence(s.d.w(ctx), limit, integrate)
}

func (s receiptStore) Tree(ctx context.Context) (receipts.Tree, error) {
	return s.Store.Tree(s.d.r(ctx))
}

func (s receiptStore) ReadHashes(ctx context.Context, indexes []int64) ([]tlog.Hash, error) {
	return s.Store.ReadHashes(s.d.r(ctx), indexes)
}

func (s receiptStore) AddCheckpoint(ctx context.Context, c *receipts.Checkpoint) error {
	return s.Store.AddCheckpoint(s.d.w(ctx), c)
}

func (s receiptStore) LatestCheckpoint(ctx context.Context) (*receipts.Checkpoint, error) {
	return s.Store.LatestCheckpoint(s.d.r(ctx))
}
