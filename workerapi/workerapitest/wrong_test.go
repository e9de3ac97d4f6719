package workerapitest_test

import (
	"context"
	"encoding/json"
	"errors"
	"os"
	"os/exec"
	"regexp"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"golang.org/x/mod/sumdb/tlog"

	"github.com/nodelane/nodelane/bunstore"
	"github.com/nodelane/nodelane/credential"
	"github.com/nodelane/nodelane/envelope"
	"github.com/nodelane/nodelane/fingerprint"
	"github.com/nodelane/nodelane/internal/apitest"
	"github.com/nodelane/nodelane/internal/testdb"
	"github.com/nodelane/nodelane/lease"
	"github.com/nodelane/nodelane/receipts"
	"github.com/nodelane/nodelane/replay"
	"github.com/nodelane/nodelane/workerapi"
	"github.com/nodelane/nodelane/workerapi/workerapitest"
)

// The control: bunstore's stores on SQLite pass, so that the wrong
// adapters below fail for what is wrong with them. (bunstore's own
// tests run the suite on PostgreSQL too, the control of GoesOnAfterAbort.)
func TestBunstoreSQLite(t *testing.T) {
	t.Parallel()
	workerapitest.Run(t, func(t *testing.T) workerapi.Stores {
		return bunstoreStores(t, openSQLite(t))
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

// migratedPostgres hands out migrated PostgreSQL schemas, each emptied
// and reused when its test ends. TestMain drops them.
var migratedPostgres = testdb.NewPostgresPool(func(dsn string) error {
	db, err := bunstore.Open(context.Background(), dsn, nil)
	if err != nil {
		return err
	}
	return db.Close()
})

// openPostgres opens bunstore on a new PostgreSQL schema, migrated.
func openPostgres(t *testing.T) *bunstore.DB {
	t.Helper()
	db, err := bunstore.Open(t.Context(), migratedPostgres.New(t).DSN, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	return db
}

// bunstoreStores returns the stores of db and a Notifier of its own,
// closed when t ends.
func bunstoreStores(t *testing.T, db *bunstore.DB) workerapi.Stores {
	t.Helper()
	n, err := db.Notifier(t.Context(), nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { n.Close() })
	return workerapi.Stores{
		Tx:           db,
		Notifier:     n,
		Leases:       db.LeaseStore(),
		Credentials:  db.CredentialStore(),
		Nonces:       db.NonceStore(nil),
		Envelope:     db.EnvelopeStore(),
		Receipts:     db.ReceiptStore(),
		Fingerprints: db.FingerprintStore(),
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
	{"Leases", []string{"CreateJobs", "UpdateJob", "ClaimLeases", "AcceptLeased", "CompleteRunning", "AddEvents", "AddArtifact", "PutWorker", "SetApproval", "DeleteEnded",
		"PutAnswer", "DeleteAnswers", "SetDrain", "Heartbeat"}},
	{"Credentials", []string{"CreatePrincipal", "UpdatePrincipal", "CreateCredential", "UpdateCredential", "ChargeQuota"}},
	{"Nonces", []string{"Insert", "Collect"}},
	{"Envelope", []string{"Apply"}},
	{"Receipts", []string{"AddReceipt", "AddReceipts", "Sequence", "AddCheckpoint"}},
	{"Fingerprints", []string{"Add"}},
}

// The suite's cases that are not about one write.
const (
	notifyWithoutTx       = "Notifier/WithoutTx"
	notifyAfterCommit     = "Notifier/AfterCommit"
	notifyNotBeforeCommit = "Notifier/NotBeforeCommit"
	nothingAfterAbort     = "Aborted/NothingCommitsAfter"
)

// leaves returns the subtests of the cases named, for the writes (store
// and method) for which in returns true.
func leaves(in func(store, write string) bool, cases ...string) []string {
	var out []string
	for _, s := range suite {
		for _, w := range s.writes {
			if !in(s.store, w) {
				continue
			}
			for _, c := range cases {
				out = append(out, s.store+"/"+w+"/"+c)
			}
		}
	}
	return out
}

// writeCases are the four cases of every write.
var writeCases = []string{"Rollback", "ReadsOwnWrite", "Commit", "Nested"}

func allStores(_, _ string) bool { return true }

// readBy returns write functions that hold for the writes whose reads
// are reads, and for those whose reads are writes: a NonceStore has no
// read method (an Insert of a nonce it holds is its read), and a
// credential.Store none of quotas (a charge that does not fit is the
// read of ChargeQuota).
func readBy() (reads, writes func(store, write string) bool) {
	writes = func(s, w string) bool { return s == "Nonces" || s == "Credentials" && w == "ChargeQuota" }
	return func(s, w string) bool { return !writes(s, w) }, writes
}

// only returns write functions that hold for the writes of the store
// named, or for its write named if write is not "", and for every other
// write.
func only(store, write string) (this, others func(store, write string) bool) {
	this = func(s, w string) bool { return s == store && (write == "" || w == write) }
	return this, func(s, w string) bool { return !this(s, w) }
}

// wrongAdapter is an adapter with one defect, and the subtests of the
// suite that must fail and pass on it.
type wrongAdapter struct {
	name       string
	open       func(t *testing.T) workerapi.Stores
	fail, pass []string
	// lacks names the optional interfaces its stores do not implement,
	// as the suite's log names them: "lease.DrainStore". The suite must
	// log that it has nothing to check of them, and of no other.
	lacks []string
}

func wrongAdapters() []wrongAdapter {
	inMemory, notInMemory := only("Fingerprints", "")
	reads, writes := readBy()
	charges, notCharges := only("Credentials", "ChargeQuota")
	answers, notAnswers := only("Leases", "PutAnswer")
	return []wrongAdapter{
		{
			// A Transactor that runs fn with no transaction: every store
			// call commits on its own, so nothing rolls back. The
			// Notifier's and the abort's cases pass: what is committed at
			// once may be announced at once, and nothing deadlocks.
			name: "PassThrough",
			open: func(t *testing.T) workerapi.Stores {
				st := bunstoreStores(t, openSQLite(t))
				st.Tx = passThrough{}
				return st
			},
			fail: leaves(allStores, "Rollback", "Nested"),
			pass: append(leaves(allStores, "ReadsOwnWrite", "Commit"), notifyWithoutTx, notifyAfterCommit, notifyNotBeforeCommit, nothingAfterAbort),
		},
		{
			// The cores' MemoryStores, which know no transaction, under a
			// pass-through Transactor, with an in-process Notifier: fine
			// for one process's tests, not for a Server.
			name: "MemoryStores",
			open: func(*testing.T) workerapi.Stores {
				return workerapi.Stores{
					Tx:           passThrough{},
					Notifier:     workerapi.NewLocalNotifier(),
					Leases:       lease.NewMemoryStore(),
					Credentials:  credential.NewMemoryStore(),
					Nonces:       replay.NewMemoryStore(nil),
					Envelope:     envelope.NewMemoryStore(),
					Receipts:     receipts.NewMemoryStore(),
					Fingerprints: fingerprint.NewMemoryStore(),
				}
			},
			fail: leaves(allStores, "Rollback", "Nested"),
			pass: append(leaves(allStores, "ReadsOwnWrite", "Commit"), notifyWithoutTx, notifyAfterCommit, notifyNotBeforeCommit, nothingAfterAbort),
		},
		{
			// A Transactor that, called with a context that carries a
			// transaction, begins another one rather than join it. On
			// SQLite the inner write then waits for the outer
			// transaction's write slot and fails.
			name: "NestedBeginsOwnTx",
			open: func(t *testing.T) workerapi.Stores {
				db := openStuck(t)
				st := bunstoreStores(t, db)
				st.Tx = ownTx{db}
				return st
			},
			fail: leaves(allStores, "Nested"),
			pass: append(leaves(allStores, "Rollback", "ReadsOwnWrite", "Commit"), notifyWithoutTx, notifyAfterCommit, notifyNotBeforeCommit, nothingAfterAbort),
		},
		{
			// Stores whose every call runs without the transaction its
			// context carries: on SQLite a write inside InTx then waits
			// for the transaction's write slot and fails, and so do the
			// Notifier's cases that write inside InTx, and the abort's.
			name: "DropsTx",
			open: func(t *testing.T) workerapi.Stores {
				return drop(bunstoreStores(t, openStuck(t)), dropper{writes: true, reads: true})
			},
			fail: append(leaves(allStores, writeCases...), notifyAfterCommit, notifyNotBeforeCommit, nothingAfterAbort),
			pass: []string{notifyWithoutTx},
		},
		{
			// Stores whose reads run without the transaction its context
			// carries, so they miss its uncommitted writes. The writes
			// whose reads are writes (readBy) pass. (bunstore's
			// fingerprint read, Add of none, runs a transaction of its
			// own, which waits for the write slot: hence the short wait
			// of openStuck.)
			name: "ReadsOutsideTx",
			open: func(t *testing.T) workerapi.Stores {
				return drop(bunstoreStores(t, openStuck(t)), dropper{reads: true})
			},
			fail: leaves(reads, "ReadsOwnWrite", "Nested"),
			pass: append(append(leaves(reads, "Rollback", "Commit"), leaves(writes, writeCases...)...),
				notifyWithoutTx, notifyAfterCommit, notifyNotBeforeCommit, nothingAfterAbort),
		},
		{
			// A fingerprint store in memory beside bunstore's: it joins
			// no transaction, so its Add stays after a rollback.
			name: "FingerprintsInMemory",
			open: func(t *testing.T) workerapi.Stores {
				st := bunstoreStores(t, openSQLite(t))
				st.Tx, st.Fingerprints = onlyInTx{st.Tx}, fingerprint.NewMemoryStore()
				return st
			},
			fail: leaves(inMemory, "Rollback", "Nested"),
			pass: append(append(leaves(inMemory, "ReadsOwnWrite", "Commit"), leaves(notInMemory, writeCases...)...),
				notifyWithoutTx, notifyAfterCommit, notifyNotBeforeCommit, nothingAfterAbort),
		},
		{
			// An in-process fan-out beside bunstore's stores: Notify wakes
			// every subscriber at once, whatever the context, so a
			// long-poll wakes before the job it is told of is committed.
			name: "NotifiesBeforeCommit",
			open: func(t *testing.T) workerapi.Stores {
				st := bunstoreStores(t, openSQLite(t))
				st.Tx, st.Notifier = onlyInTx{st.Tx}, workerapi.NewLocalNotifier()
				return st
			},
			fail: []string{notifyNotBeforeCommit},
			pass: append(leaves(allStores, writeCases...), notifyWithoutTx, notifyAfterCommit, nothingAfterAbort),
		},
		{
			// A credential store whose ChargeQuota runs without the
			// transaction its context carries: on SQLite the charge
			// inside InTx then waits for the transaction's write slot and
			// fails. (Its Shared runs would fail as its plain ones do:
			// onlyInTx skips them.)
			name: "ChargesOutsideTx",
			open: func(t *testing.T) workerapi.Stores {
				st := bunstoreStores(t, openStuck(t))
				st.Tx, st.Credentials = onlyInTx{st.Tx}, chargesOutside{st.Credentials}
				return st
			},
			fail: leaves(charges, writeCases...),
			pass: append(leaves(notCharges, writeCases...), notifyWithoutTx, notifyAfterCommit, notifyNotBeforeCommit, nothingAfterAbort),
		},
		{
			// A lease store on PostgreSQL whose PutAnswer runs without the
			// transaction its context carries: the answer commits at once,
			// so it stays after a rollback, which the reads see. It is
			// no lease.DrainStore nor lease.HeartbeatStore, so the suite
			// has nothing of SetDrain and Heartbeat to check.
			name: "AnswersOutsideTx",
			open: func(t *testing.T) workerapi.Stores {
				st := bunstoreStores(t, openPostgres(t))
				st.Tx, st.Leases = onlyInTx{st.Tx}, answersOutside{st.Leases}
				return st
			},
			fail: leaves(answers, "Rollback", "Nested"),
			pass: append(append(leaves(answers, "ReadsOwnWrite", "Commit"), leaves(notAnswers, writeCases...)...),
				notifyWithoutTx, notifyAfterCommit, notifyNotBeforeCommit, nothingAfterAbort),
			lacks: []string{"lease.DrainStore", "lease.HeartbeatStore"},
		},
		{
			// bunstore on PostgreSQL made to behave as an InnoDB session
			// does after a deadlock: once a store call returned an
			// ErrAborted, the transaction's later calls run without it
			// (autocommit), and InTx returns nil when the function did,
			// although the commit failed.
			name: "GoesOnAfterAbort",
			open: func(t *testing.T) workerapi.Stores {
				db := openPostgres(t)
				st := drop(bunstoreStores(t, db), dropper{afterAbort: true})
				st.Tx = goesOn{db}
				return st
			},
			fail: []string{nothingAfterAbort},
			pass: append(leaves(allStores, writeCases...), notifyWithoutTx, notifyAfterCommit, notifyNotBeforeCommit),
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
			// The suite had nothing to check of the optional interfaces
			// the stores lack, and of those only.
			if got, want := nothingToCheck(text), slices.Sorted(slices.Values(a.lacks)); !slices.Equal(got, want) {
				t.Errorf("the suite had nothing to check of %q, want %q", got, want)
				bad = true
			}
			// Every case ran, and the lists above cover them all.
			if got, want := reportedLeaves(text), slices.Sorted(slices.Values(append(slices.Clone(a.fail), a.pass...))); !slices.Equal(got, want) {
				t.Errorf("the suite reported the cases %q, want %q: the lists here are stale", got, want)
				bad = true
			}
			if bad {
				t.Logf("output of the suite on %s:\n%s", a.name, out)
			}
		})
	}
}

// result matches the result line of a subtest of the suite.
var result = regexp.MustCompile(`--- (?:PASS|FAIL): TestWrongAdapters/(\S+) \(`)

// reportedLeaves returns, sorted, the cases that out, the verbose output
// of the suite, reports: the subtests that have none of their own but
// Shared.
func reportedLeaves(out string) []string {
	var names []string
	for _, m := range result.FindAllStringSubmatch(out, -1) {
		if !strings.HasSuffix(m[1], "/Shared") {
			names = append(names, m[1])
		}
	}
	var cases []string
	for _, n := range names {
		if !slices.ContainsFunc(names, func(m string) bool { return strings.HasPrefix(m, n+"/") }) {
			cases = append(cases, n)
		}
	}
	slices.Sort(cases)
	return slices.Compact(cases)
}

// lacking matches the suite's log of an optional interface the store
// does not implement.
var lacking = regexp.MustCompile(`the store is no (\S+): nothing to check`)

// nothingToCheck returns, sorted, the optional interfaces that out, the
// verbose output of the suite, says the stores lack.
func nothingToCheck(out string) []string {
	var names []string
	for _, m := range lacking.FindAllStringSubmatch(out, -1) {
		names = append(names, m[1])
	}
	slices.Sort(names)
	return slices.Compact(names)
}

// passThrough runs fn with no transaction at all.
type passThrough struct{}

func (passThrough) InTx(ctx context.Context, fn func(ctx context.Context) error) error {
	return fn(ctx)
}

// onlyInTx hides a Transactor's InSharedTx, so that the suite skips the
// Shared runs: for a wrong adapter whose defect is not the transaction's,
// they would repeat every case at twice the cost.
type onlyInTx struct{ workerapi.Transactor }

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
type dropper struct {
	writes, reads bool
	// afterAbort drops the transaction from every call made after a call
	// of the same goesOn transaction returned a core's ErrAborted.
	afterAbort bool
}

func (d dropper) w(ctx context.Context) context.Context {
	if d.writes || d.aborted(ctx) {
		return detached{ctx}
	}
	return ctx
}

func (d dropper) r(ctx context.Context) context.Context {
	if d.reads || d.aborted(ctx) {
		return detached{ctx}
	}
	return ctx
}

// aborted reports whether a call of the goesOn transaction ctx carries
// returned an ErrAborted, when d drops the transaction after one.
func (d dropper) aborted(ctx context.Context) bool {
	f, ok := ctx.Value(abortedKey{}).(*atomic.Bool)
	return d.afterAbort && ok && f.Load()
}

// done notes *err, the error of a call made with ctx: if it is a core's
// ErrAborted, the later calls of the transaction ctx carries run without
// it, when d drops it after an abort.
func (d dropper) done(ctx context.Context, err *error) {
	if f, ok := ctx.Value(abortedKey{}).(*atomic.Bool); ok && d.afterAbort && isAborted(*err) {
		f.Store(true)
	}
}

// isAborted reports whether err is a core's ErrAborted.
func isAborted(err error) bool {
	for _, target := range []error{lease.ErrAborted, credential.ErrAborted, replay.ErrAborted, envelope.ErrAborted, receipts.ErrAborted} {
		if errors.Is(err, target) {
			return true
		}
	}
	return false
}

// abortedKey is the context key of a goesOn transaction's flag, set once
// one of its calls returned an ErrAborted.
type abortedKey struct{}

// goesOn is a Transactor that carries on after the database aborted its
// transaction, as code on an InnoDB session that ignores a deadlock does:
// with dropper.afterAbort, its later store calls run outside the
// transaction (they autocommit), and InTx returns nil whenever fn did,
// although the commit of the aborted transaction failed.
type goesOn struct{ db *bunstore.DB }

func (g goesOn) InTx(ctx context.Context, fn func(ctx context.Context) error) error {
	if ctx.Value(abortedKey{}) != nil {
		return g.db.InTx(ctx, fn) // joins the outer transaction
	}
	var fnErr error
	err := g.db.InTx(ctx, func(ctx context.Context) error {
		fnErr = fn(context.WithValue(ctx, abortedKey{}, new(atomic.Bool)))
		return fnErr
	})
	if fnErr == nil {
		return nil
	}
	return err
}

// chargesOutside is a credential store whose ChargeQuota runs without the
// transaction its context carries.
type chargesOutside struct{ credential.Store }

func (s chargesOutside) ChargeQuota(ctx context.Context, c credential.QuotaCharge) (credential.Quota, bool, error) {
	return s.Store.ChargeQuota(detached{ctx}, c)
}

// answersOutside is a lease store whose PutAnswer runs without the
// transaction its context carries. It is a lease.Store only: none of the
// optional interfaces of the store it wraps.
type answersOutside struct{ lease.Store }

func (s answersOutside) PutAnswer(ctx context.Context, a *lease.Answer) error {
	return s.Store.PutAnswer(detached{ctx}, a)
}

// drop wraps every store of st, bunstore's, with d. The wrappers
// implement the optional interfaces that bunstore's stores implement
// (lease.DrainStore, lease.HeartbeatStore, receipts.BatchAdder).
func drop(st workerapi.Stores, d dropper) workerapi.Stores {
	st.Leases = leases{st.Leases, d}
	st.Credentials = credentials{st.Credentials, d}
	st.Nonces = nonces{st.Nonces, d}
	st.Envelope = envelopes{st.Envelope, d}
	st.Receipts = receiptStore{st.Receipts, d}
	st.Fingerprints = fingerprints{st.Fingerprints, d}
	return st
}

var (
	_ lease.DrainStore     = leases{}
	_ lease.HeartbeatStore = leases{}
	_ receipts.BatchAdder  = receiptStore{}
)

type leases struct {
	lease.Store
	d dropper
}

func (s leases) CreateJobs(ctx context.Context, js []*lease.Job) (err error) {
	defer s.d.done(ctx, &err)
	return s.Store.CreateJobs(s.d.w(ctx), js)
}

func (s leases) GetJob(ctx context.Context, id string) (_ *lease.Job, err error) {
	defer s.d.done(ctx, &err)
	return s.Store.GetJob(s.d.r(ctx), id)
}

func (s leases) ListJobs(ctx context.Context, f lease.JobFilter) (_ []*lease.Job, err error) {
	defer s.d.done(ctx, &err)
	return s.Store.ListJobs(s.d.r(ctx), f)
}

func (s leases) UpdateJob(ctx context.Context, j *lease.Job, rev int64) (err error) {
	defer s.d.done(ctx, &err)
	return s.Store.UpdateJob(s.d.w(ctx), j, rev)
}

func (s leases) ClaimLeases(ctx context.Context, workerID string, plan func(*lease.Worker) (lease.ClaimQuery, lease.LeaseClaim, bool, error)) (_ []*lease.Job, err error) {
	defer s.d.done(ctx, &err)
	return s.Store.ClaimLeases(s.d.w(ctx), workerID, plan)
}

func (s leases) AcceptLeased(ctx context.Context, ws []lease.AcceptWrite) (_ []*lease.Job, err error) {
	defer s.d.done(ctx, &err)
	return s.Store.AcceptLeased(s.d.w(ctx), ws)
}

func (s leases) CompleteRunning(ctx context.Context, ws []lease.CompleteWrite) (_ []*lease.Job, err error) {
	defer s.d.done(ctx, &err)
	return s.Store.CompleteRunning(s.d.w(ctx), ws)
}

func (s leases) ExpiredJobs(ctx context.Context, now time.Time, limit int) (_ []*lease.Job, err error) {
	defer s.d.done(ctx, &err)
	return s.Store.ExpiredJobs(s.d.r(ctx), now, limit)
}

func (s leases) DeleteEnded(ctx context.Context, before time.Time, limit int) (_ int, err error) {
	defer s.d.done(ctx, &err)
	return s.Store.DeleteEnded(s.d.w(ctx), before, limit)
}

func (s leases) AddEvents(ctx context.Context, evs []*lease.Event) (_ int, err error) {
	defer s.d.done(ctx, &err)
	return s.Store.AddEvents(s.d.w(ctx), evs)
}

func (s leases) ListEvents(ctx context.Context, jobID string, after int64, limit int) (_ []*lease.Event, err error) {
	defer s.d.done(ctx, &err)
	return s.Store.ListEvents(s.d.r(ctx), jobID, after, limit)
}

func (s leases) AddArtifact(ctx context.Context, a *lease.Artifact) (err error) {
	defer s.d.done(ctx, &err)
	return s.Store.AddArtifact(s.d.w(ctx), a)
}

func (s leases) ListArtifacts(ctx context.Context, f lease.ArtifactFilter) (_ []*lease.Artifact, err error) {
	defer s.d.done(ctx, &err)
	return s.Store.ListArtifacts(s.d.r(ctx), f)
}

func (s leases) PutWorker(ctx context.Context, w *lease.Worker) (err error) {
	defer s.d.done(ctx, &err)
	return s.Store.PutWorker(s.d.w(ctx), w)
}

func (s leases) SetApproval(ctx context.Context, id string, prevAt *time.Time, a lease.Approval) (err error) {
	defer s.d.done(ctx, &err)
	return s.Store.SetApproval(s.d.w(ctx), id, prevAt, a)
}

func (s leases) GetWorker(ctx context.Context, id string) (_ *lease.Worker, err error) {
	defer s.d.done(ctx, &err)
	return s.Store.GetWorker(s.d.r(ctx), id)
}

func (s leases) WorkerByNode(ctx context.Context, nodeID string) (_ *lease.Worker, err error) {
	defer s.d.done(ctx, &err)
	return s.Store.WorkerByNode(s.d.r(ctx), nodeID)
}

func (s leases) ListWorkers(ctx context.Context, f lease.WorkerFilter) (_ []*lease.Worker, err error) {
	defer s.d.done(ctx, &err)
	return s.Store.ListWorkers(s.d.r(ctx), f)
}

func (s leases) PutAnswer(ctx context.Context, a *lease.Answer) (err error) {
	defer s.d.done(ctx, &err)
	return s.Store.PutAnswer(s.d.w(ctx), a)
}

func (s leases) GetAnswer(ctx context.Context, key []byte, now time.Time) (_ *lease.Answer, err error) {
	defer s.d.done(ctx, &err)
	return s.Store.GetAnswer(s.d.r(ctx), key, now)
}

func (s leases) DeleteAnswers(ctx context.Context, now time.Time, limit int) (_ int, err error) {
	defer s.d.done(ctx, &err)
	return s.Store.DeleteAnswers(s.d.w(ctx), now, limit)
}

func (s leases) SetDrain(ctx context.Context, id string, d *lease.DrainRequest) (err error) {
	defer s.d.done(ctx, &err)
	return s.Store.(lease.DrainStore).SetDrain(s.d.w(ctx), id, d)
}

func (s leases) Heartbeat(ctx context.Context, id, status string, metrics json.RawMessage, at time.Time) (_ *lease.Worker, err error) {
	defer s.d.done(ctx, &err)
	return s.Store.(lease.HeartbeatStore).Heartbeat(s.d.w(ctx), id, status, metrics, at)
}

type credentials struct {
	credential.Store
	d dropper
}

func (s credentials) CreatePrincipal(ctx context.Context, p *credential.Principal) (err error) {
	defer s.d.done(ctx, &err)
	return s.Store.CreatePrincipal(s.d.w(ctx), p)
}

func (s credentials) GetPrincipal(ctx context.Context, id string) (_ *credential.Principal, err error) {
	defer s.d.done(ctx, &err)
	return s.Store.GetPrincipal(s.d.r(ctx), id)
}

func (s credentials) UpdatePrincipal(ctx context.Context, p *credential.Principal, rev int64) (err error) {
	defer s.d.done(ctx, &err)
	return s.Store.UpdatePrincipal(s.d.w(ctx), p, rev)
}

func (s credentials) CreateCredential(ctx context.Context, c *credential.Credential) (err error) {
	defer s.d.done(ctx, &err)
	return s.Store.CreateCredential(s.d.w(ctx), c)
}

func (s credentials) GetCredential(ctx context.Context, id string) (_ *credential.Credential, err error) {
	defer s.d.done(ctx, &err)
	return s.Store.GetCredential(s.d.r(ctx), id)
}

func (s credentials) UpdateCredential(ctx context.Context, c *credential.Credential, rev int64) (err error) {
	defer s.d.done(ctx, &err)
	return s.Store.UpdateCredential(s.d.w(ctx), c, rev)
}

func (s credentials) ListCredentials(ctx context.Context, f credential.CredentialFilter) (_ []*credential.Credential, err error) {
	defer s.d.done(ctx, &err)
	return s.Store.ListCredentials(s.d.r(ctx), f)
}

func (s credentials) ChargeQuota(ctx context.Context, c credential.QuotaCharge) (_ credential.Quota, _ bool, err error) {
	defer s.d.done(ctx, &err)
	return s.Store.ChargeQuota(s.d.w(ctx), c)
}

type nonces struct {
	replay.Store
	d dropper
}

func (s nonces) Insert(ctx context.Context, nodeID, nonce string, expires, now time.Time) (err error) {
	defer s.d.done(ctx, &err)
	return s.Store.Insert(s.d.w(ctx), nodeID, nonce, expires, now)
}

func (s nonces) Collect(ctx context.Context, now time.Time) (_ int, err error) {
	defer s.d.done(ctx, &err)
	return s.Store.Collect(s.d.w(ctx), now)
}

type envelopes struct {
	envelope.Store
	d dropper
}

func (s envelopes) State(ctx context.Context) (_ envelope.State, err error) {
	defer s.d.done(ctx, &err)
	return s.Store.State(s.d.r(ctx))
}

func (s envelopes) Apply(ctx context.Context, prev int64, next envelope.State, rec envelope.Record) (err error) {
	defer s.d.done(ctx, &err)
	return s.Store.Apply(s.d.w(ctx), prev, next, rec)
}

func (s envelopes) History(ctx context.Context, after int64, limit int) (_ []envelope.Record, err error) {
	defer s.d.done(ctx, &err)
	return s.Store.History(s.d.r(ctx), after, limit)
}

type receiptStore struct {
	receipts.Store
	d dropper
}

func (s receiptStore) AddReceipt(ctx context.Context, r *receipts.Stored) (err error) {
	defer s.d.done(ctx, &err)
	return s.Store.AddReceipt(s.d.w(ctx), r)
}

func (s receiptStore) AddReceipts(ctx context.Context, ss []*receipts.Stored) (err error) {
	defer s.d.done(ctx, &err)
	return s.Store.(receipts.BatchAdder).AddReceipts(s.d.w(ctx), ss)
}

func (s receiptStore) GetReceipt(ctx context.Context, id string) (_ *receipts.Stored, err error) {
	defer s.d.done(ctx, &err)
	return s.Store.GetReceipt(s.d.r(ctx), id)
}

func (s receiptStore) ListReceipts(ctx context.Context, from int64, limit int) (_ []*receipts.Stored, err error) {
	defer s.d.done(ctx, &err)
	return s.Store.ListReceipts(s.d.r(ctx), from, limit)
}

func (s receiptStore) Sequence(ctx context.Context, limit int, integrate receipts.IntegrateFunc) (err error) {
	defer s.d.done(ctx, &err)
	return s.Store.Sequence(s.d.w(ctx), limit, integrate)
}

func (s receiptStore) Tree(ctx context.Context) (_ receipts.Tree, err error) {
	defer s.d.done(ctx, &err)
	return s.Store.Tree(s.d.r(ctx))
}

func (s receiptStore) ReadHashes(ctx context.Context, indexes []int64) (_ []tlog.Hash, err error) {
	defer s.d.done(ctx, &err)
	return s.Store.ReadHashes(s.d.r(ctx), indexes)
}

func (s receiptStore) AddCheckpoint(ctx context.Context, c *receipts.Checkpoint) (err error) {
	defer s.d.done(ctx, &err)
	return s.Store.AddCheckpoint(s.d.w(ctx), c)
}

func (s receiptStore) LatestCheckpoint(ctx context.Context) (_ *receipts.Checkpoint, err error) {
	defer s.d.done(ctx, &err)
	return s.Store.LatestCheckpoint(s.d.r(ctx))
}

type fingerprints struct {
	fingerprint.Store
	d dropper
}

// Add with no fingerprints is the store's read.
func (s fingerprints) Add(ctx context.Context, fps []fingerprint.Fingerprint) (_ []fingerprint.Fingerprint, err error) {
	defer s.d.done(ctx, &err)
	if len(fps) == 0 {
		return s.Store.Add(s.d.r(ctx), fps)
	}
	return s.Store.Add(s.d.w(ctx), fps)
}
