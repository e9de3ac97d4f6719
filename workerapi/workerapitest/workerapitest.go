// Package workerapitest is the conformance suite for the transactions a
// workerapi.Server runs its requests in. A Server commits a request's
// state change, its nonce and its receipts together through
// workerapi.Stores.Tx, so every store of workerapi.Stores must join the
// transaction that Tx carries in a context; its Notifier must wake
// long-polls only once that transaction has committed; and a transaction
// the database aborted must commit nothing. The cores' own suites
// (leasetest, credentialtest, ...) never run a transaction; this one does.
// An adapter's test calls Run with a function that returns its Stores over
// a new, empty database of their own. The cases run in parallel, so the
// function may be called from several goroutines at once, and the stores
// of one call must share nothing with those of another:
//
//	func TestTransactions(t *testing.T) {
//		workerapitest.Run(t, func(t *testing.T) workerapi.Stores {
//			db := openEmptyDatabase(t)
//			return workerapi.Stores{
//				Tx:           db,
//				Notifier:     newNotifier(t, db), // closed when t ends
//				Leases:       db.LeaseStore(),
//				Credentials:  db.CredentialStore(),
//				Nonces:       db.NonceStore(nil),
//				Envelope:     db.EnvelopeStore(),
//				Receipts:     db.ReceiptStore(),
//				Fingerprints: db.FingerprintStore(),
//			}
//		})
//	}
//
// # Every store joins the transaction
//
// For every write method of every store (lease.Store's CreateJobs,
// UpdateJob, ClaimLeases, AcceptLeased, CompleteRunning, AddEvents,
// AddArtifact, PutWorker, SetApproval, DeleteEnded, PutAnswer and
// DeleteAnswers; credential.Store's CreatePrincipal, UpdatePrincipal,
// CreateCredential, UpdateCredential and ChargeQuota; replay.Store's
// Insert and Collect; envelope.Store's Apply; receipts.Store's
// AddReceipt, Sequence and AddCheckpoint; fingerprint.Store's Add), and
// for those of the optional interfaces a store implements
// (lease.DrainStore's SetDrain, lease.HeartbeatStore's Heartbeat and
// receipts.BatchAdder's AddReceipts), the suite checks, each on a fresh
// database, that:
//
//   - Rollback: a write inside Tx.InTx whose function then returns an
//     error leaves nothing, as every read method of the store sees after
//     InTx returned; and InTx returns that error;
//   - ReadsOwnWrite: inside the transaction, every read method of the
//     store sees the transaction's own write;
//   - Commit: a write inside Tx.InTx whose function returns nil is seen
//     by every read method after InTx returned;
//   - Nested: an InTx called with a context that carries a transaction
//     joins it: the inner call sees the outer write, and when the inner
//     function succeeds and the outer one fails, neither write is left.
//
// Sequence, Collect and DeleteAnswers are held to this too, although a
// Server calls them outside any transaction: their Store interfaces say
// that every method joins the transaction its context carries.
//
// A failing subtest names the store, the write and the case, as in
// TestTransactions/Leases/ClaimLeases/Rollback, and its message names the
// read that saw (or missed) the write. A NonceStore has no read method:
// an Insert of the same nonce (replay.ErrReplayedNonce while it is held)
// and a second Collect at the same time (nothing left to delete) are its
// reads. A fingerprint.Store's Add with no fingerprints is its read. A
// credential.Store has no read of quotas: a ChargeQuota of one more unit
// of the quota of one unit that the write charged, which fits only if the
// write's unit is not counted, is the read of ChargeQuota.
//
// A store that does not implement an optional interface has nothing to
// check of its write: each of that write's cases logs so ("the store is
// no lease.DrainStore: nothing to check") and passes.
//
// # The Notifier wakes after the commit
//
// Notify with a context that carries a transaction wakes no subscriber
// before that transaction commits, and wakes every subscriber once it has
// committed; after a rollback it may wake them or not. (A long-poll woken
// before the commit looks, finds nothing new and waits again, and the new
// job waits for its next look.) Three cases check it, each on stores of
// its own:
//
//   - Notifier/WithoutTx: Notify with a context that carries no
//     transaction wakes a subscriber.
//   - Notifier/AfterCommit: an InTx whose function creates a job
//     (lease.Store.CreateJobs), calls Notify and returns nil wakes a
//     subscriber, once InTx has returned.
//   - Notifier/NotBeforeCommit: in the same transaction, right after
//     Notify returned, a subscription holds no wake-up, unless the job is
//     already visible outside the transaction (Leases.GetJob with a
//     context that carries none); and a subscriber goroutine, once woken,
//     sees the job so. A wake-up while the job is not yet visible outside
//     the transaction came before the commit; one after a write that
//     committed on its own (it joined no transaction, which the writes'
//     cases refuse) did not. The goroutine catches a Notifier that wakes
//     early but asynchronously when it looks before the commit, which is
//     likely, not certain.
//
// # Nothing commits after an abort
//
// Once a store call inside InTx has returned its core's ErrAborted
// (lease.ErrAborted, credential.ErrAborted, ...), nothing more of that
// transaction commits: every later store call with its context fails, and
// InTx returns a non-nil error even if fn returns nil. InTx runs fn once:
// it never runs it again after an abort (the Server answers 503
// unavailable and the worker retries the request). In InnoDB (MariaDB,
// MySQL) a deadlock rolls the whole transaction back and the session goes
// on in autocommit, so an adapter that carries on after it commits the
// transaction's later writes one by one.
//
// Aborted/NothingCommitsAfter provokes a real deadlock. Jobs A and B are
// committed; transaction 1 updates A (lease.Store.UpdateJob), transaction
// 2 updates B, then, concurrently, 1 updates B and 2 updates A. The
// database aborts one of them (PostgreSQL once its deadlock_timeout, 1 s
// by default, has passed). The aborted side then creates a job C,
// ignoring that call's error, and its function returns nil. The case
// requires that the aborted side's InTx return an error and that neither
// C nor its first update be there afterwards; that the other side's
// updates and InTx succeed and both its updates be there; and that InTx
// ran each function once.
//
// A store whose writers serialize cannot deadlock: bunstore on SQLite
// takes a write slot for the whole InTx, so transaction 2 cannot begin
// while 1 is open. The case detects it within 2 s and passes with a log
// saying why the rule was not exercised. Transaction 2 begins once
// transaction 1 has updated A; if its function has not started within
// 2 s, or its InTx returns before it starts, or its update of B, made
// with a context of its own that ends 2 s later, does not complete within
// those 2 s (it waits for transaction 1), then transaction 1 goes on
// alone and commits, and transaction 2's function, if it starts after
// that, returns at once. A store none of whose calls returned ErrAborted
// (it has no transactions, or it aborts at commit) passes with a log too.
//
// # Shared transactions
//
// When Tx also implements workerapi.SharedTransactor, each case but
// Aborted/NothingCommitsAfter runs a second time, on stores of its own,
// with InSharedTx in place of InTx (as in
// TestTransactions/Leases/ClaimLeases/Rollback/Shared): a shared
// transaction is a transaction, which every store joins. (Calls that
// share a transaction cannot deadlock each other.)
//
// The stores are driven directly through their Store interfaces with
// small, valid records at fixed times; nothing sleeps. Every context the
// suite passes has a deadline, so a store that waits on a lock its own
// transaction holds fails rather than hangs, if it honours its context.
package workerapitest

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/nodelane/nodelane/workerapi"
)

// caseTimeout bounds each case, in case a store call waits on a lock that
// the case's own transaction holds.
const caseTimeout = time.Minute

// errRollback is what the suite's transactions return to roll back.
var errRollback = errors.New("workerapitest: the function given to InTx failed, so InTx must roll back")

// Run runs the suite on stores made by newStores. Every case calls newStores once
// and uses Stores.Tx, Stores.Notifier and the six stores, which must share
// one new, empty database (Clock and Schema are not used and may be nil).
// Cases run in parallel (t.Parallel), so newStores may be called from
// several goroutines at once, and each call must return stores
// independent of every other call's: a database of their own, which no
// other case reads or writes, and a Notifier that no other case's
// Notify wakes.
//
//	workerapitest.Run(t, func(t *testing.T) workerapi.Stores { return newStores(t) })
func Run(t *testing.T, newStores func(t *testing.T) workerapi.Stores) {
	for _, g := range groups {
		t.Run(g.store, func(t *testing.T) {
			t.Parallel()
			for _, w := range g.writes {
				t.Run(w.name, func(t *testing.T) {
					t.Parallel()
					for _, c := range cases {
						t.Run(c.name, func(t *testing.T) {
							runCase(t, newStores, true, func(t *testing.T, ctx context.Context, st workerapi.Stores) {
								c.run(t, ctx, st, w)
							})
						})
					}
				})
			}
		})
	}
	for _, g := range storesCases {
		t.Run(g.name, func(t *testing.T) {
			t.Parallel()
			for _, c := range g.cases {
				t.Run(c.name, func(t *testing.T) {
					runCase(t, newStores, c.shared, c.run)
				})
			}
		})
	}
}

// runCase runs a case, in parallel, on stores of its own and, if shared
// and Tx is a SharedTransactor, again in a subtest "Shared" with
// InSharedTx in place of InTx.
func runCase(t *testing.T, newStores func(t *testing.T) workerapi.Stores, shared bool, run func(t *testing.T, ctx context.Context, st workerapi.Stores)) {
	t.Parallel()
	st := newStores(t)
	if err := st.Validate(); err != nil {
		t.Fatalf("newStores returned incomplete Stores: %v", err)
	}
	ctx, cancel := context.WithTimeout(t.Context(), caseTimeout)
	defer cancel()
	run(t, ctx, st)
	if _, ok := st.Tx.(workerapi.SharedTransactor); ok && shared {
		t.Run("Shared", func(t *testing.T) {
			st := newStores(t)
			st.Tx = sharedTx{st.Tx.(workerapi.SharedTransactor)}
			run(t, ctx, st)
		})
	}
}

// sharedTx is a Transactor whose InTx is the SharedTransactor's
// InSharedTx, for the cases' Shared runs.
type sharedTx struct{ workerapi.SharedTransactor }

func (s sharedTx) InTx(ctx context.Context, fn func(ctx context.Context) error) error {
	return s.InSharedTx(ctx, "workerapitest", fn)
}

// group is one store and its write methods.
type group struct {
	store  string
	writes []write
}

// write is one write method of a store.
type write struct {
	// name is the method's name.
	name string
	// probe commits, outside any transaction, what instance i (0 or 1) of
	// the write needs, and returns the instance. Instances of one write
	// on one database do not disturb each other. The write of an optional
	// interface returns a *notImplemented, and commits nothing, when the
	// store does not implement it.
	probe func(ctx context.Context, st workerapi.Stores, i int) (*probe, error)
}

// probe is one instance of a write, made observable.
type probe struct {
	// do makes the write.
	do func(ctx context.Context) error
	// checks observe it, one for each read method that can.
	checks []check
}

// check observes a write through one read method.
type check struct {
	// read names the call, as "GetJob" or "ListJobs(State)".
	read string
	// seen reports whether the read sees the write.
	seen func(ctx context.Context) (bool, error)
}

// notImplemented is the error of the probe of a write of an optional
// interface (lease.DrainStore, ...) when the store does not implement it:
// the write's cases have nothing to check, and pass.
type notImplemented struct {
	// iface names the interface, as "lease.DrainStore".
	iface string
}

func (e *notImplemented) Error() string { return "the store is no " + e.iface }

// newProbe makes instance i of w, failing t if its setup fails. It
// returns nil, and logs why, when the store does not implement the
// optional interface of w: the case then has nothing to check.
func newProbe(t *testing.T, ctx context.Context, st workerapi.Stores, w write, i int) *probe {
	t.Helper()
	p, err := w.probe(ctx, st, i)
	if no := (*notImplemented)(nil); errors.As(err, &no) {
		t.Logf("%v: nothing to check", no)
		return nil
	}
	if err != nil {
		t.Fatalf("setting up %s, outside any transaction: %v", w.name, err)
	}
	return p
}

// expect fails t unless every check of p sees the write (want) or none
// does, and reports whether they did. It only reports, so that it may run
// inside a transaction.
func (p *probe) expect(t *testing.T, ctx context.Context, write string, want bool, when, why string) bool {
	t.Helper()
	ok := true
	for _, c := range p.checks {
		seen, err := c.seen(ctx)
		switch {
		case err != nil:
			t.Errorf("%s, %s failed: %v", when, c.read, err)
		case seen && !want:
			t.Errorf("%s, %s still sees what %s wrote: %s", when, c.read, write, why)
		case !seen && want:
			t.Errorf("%s, %s does not see what %s wrote: %s", when, c.read, write, why)
		default:
			continue
		}
		ok = false
	}
	return ok
}

// The reasons the suite gives for a failed check.
const (
	whyLeaked = "the write did not join the transaction its context carries (or InTx did not roll back)"
	whyUnread = "the read did not join the transaction its context carries"
	whyLost   = "the transaction did not commit the write"
	whyNested = "the nested InTx did not join the outer transaction"
)

// testCase is one of the four cases each write goes through.
type testCase struct {
	name string
	run  func(t *testing.T, ctx context.Context, st workerapi.Stores, w write)
}

var cases = []testCase{
	{"Rollback", testRollback},
	{"ReadsOwnWrite", testReadsOwnWrite},
	{"Commit", testCommit},
	{"Nested", testNested},
}

// storesCase is a case of the suite that is not about one write: it
// drives the stores as a whole.
type storesCase struct {
	name string
	run  func(t *testing.T, ctx context.Context, st workerapi.Stores)
	// shared says whether the case runs again with InSharedTx.
	shared bool
}

// storesCases are the cases of the Notifier and of aborted transactions,
// by group.
var storesCases = []struct {
	name  string
	cases []storesCase
}{
	{"Notifier", []storesCase{
		{"WithoutTx", testNotifyWithoutTx, true},
		{"AfterCommit", testNotifyAfterCommit, true},
		{"NotBeforeCommit", testNotifyNotBeforeCommit, true},
	}},
	// Calls that share a transaction cannot deadlock each other.
	{"Aborted", []storesCase{
		{"NothingCommitsAfter", testNothingCommitsAfterAbort, false},
	}},
}

// wantRolledBack fails t unless InTx returned the error its function
// returned, and failed reports no failure of a store call inside it.
func wantRolledBack(t *testing.T, err, failed error) {
	t.Helper()
	if failed != nil {
		t.Fatal(failed)
	}
	if !errors.Is(err, errRollback) {
		t.Fatalf("InTx returned %v, want the error its function returned (%v)", err, errRollback)
	}
}

func testRollback(t *testing.T, ctx context.Context, st workerapi.Stores, w write) {
	p := newProbe(t, ctx, st, w, 0)
	if p == nil {
		return
	}
	var failed error
	err := st.Tx.InTx(ctx, func(ctx context.Context) error {
		if err := p.do(ctx); err != nil {
			failed = fmt.Errorf("%s inside InTx: %w", w.name, err)
			return failed
		}
		return errRollback
	})
	wantRolledBack(t, err, failed)
	p.expect(t, ctx, w.name, false, "after InTx rolled back", whyLeaked)
}

func testReadsOwnWrite(t *testing.T, ctx context.Context, st workerapi.Stores, w write) {
	p := newProbe(t, ctx, st, w, 0)
	if p == nil {
		return
	}
	var failed error
	err := st.Tx.InTx(ctx, func(ctx context.Context) error {
		if err := p.do(ctx); err != nil {
			failed = fmt.Errorf("%s inside InTx: %w", w.name, err)
			return failed
		}
		p.expect(t, ctx, w.name, true, "inside the transaction", whyUnread)
		return errRollback
	})
	wantRolledBack(t, err, failed)
}

func testCommit(t *testing.T, ctx context.Context, st workerapi.Stores, w write) {
	p := newProbe(t, ctx, st, w, 0)
	if p == nil {
		return
	}
	var failed error
	err := st.Tx.InTx(ctx, func(ctx context.Context) error {
		if err := p.do(ctx); err != nil {
			failed = fmt.Errorf("%s inside InTx: %w", w.name, err)
			return failed
		}
		return nil
	})
	if failed != nil {
		t.Fatal(failed)
	}
	if err != nil {
		t.Fatalf("InTx returned %v, want nil: its function returned nil", err)
	}
	p.expect(t, ctx, w.name, true, "after InTx committed", whyLost)
}

func testNested(t *testing.T, ctx context.Context, st workerapi.Stores, w write) {
	outer := newProbe(t, ctx, st, w, 0)
	if outer == nil {
		return
	}
	inner := newProbe(t, ctx, st, w, 1)
	var failed error
	err := st.Tx.InTx(ctx, func(ctx context.Context) error {
		if err := outer.do(ctx); err != nil {
			failed = fmt.Errorf("%s inside the outer InTx: %w", w.name, err)
			return failed
		}
		// Once the reads are seen to join the outer transaction, what
		// they miss inside the nested InTx is the nesting's fault.
		why := whyUnread
		if outer.expect(t, ctx, w.name, true, "inside the outer transaction", whyUnread) {
			why = whyNested
		}
		err := st.Tx.InTx(ctx, func(ctx context.Context) error {
			outer.expect(t, ctx, w.name, true, "inside an InTx nested in the one that wrote", why)
			if err := inner.do(ctx); err != nil {
				failed = fmt.Errorf("%s inside the nested InTx: %w", w.name, err)
				return failed
			}
			return nil
		})
		if failed != nil {
			return failed
		}
		if err != nil {
			failed = fmt.Errorf("the nested InTx returned %v, want nil: its function returned nil", err)
			return failed
		}
		inner.expect(t, ctx, w.name, true, "inside the outer transaction, after the nested InTx returned", why)
		return errRollback
	})
	wantRolledBack(t, err, failed)
	outer.expect(t, ctx, w.name, false, "after the outer InTx rolled back (the outer write)", whyLeaked)
	inner.expect(t, ctx, w.name, false, "after the outer InTx rolled back (the write of the nested InTx, which succeeded)",
		"the nested InTx committed on its own rather than join the outer transaction, or the write did not join the transaction its context carries")
}
