// Package workerapitest is the conformance suite for the transactions a
// workerapi.Server runs its requests in. A Server commits a request's
// state change, its nonce and its receipts together through
// workerapi.Stores.Tx, so every store of workerapi.Stores must join the
// transaction that Tx carries in a context. The cores' own suites
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
//				Tx:          db,
//				Leases:      db.LeaseStore(),
//				Credentials: db.CredentialStore(),
//				Nonces:      db.NonceStore(),
//				Envelope:    db.EnvelopeStore(),
//				Receipts:    db.ReceiptStore(),
//			}
//		})
//	}
//
// For every write method of every store (lease.Store's CreateJobs,
// UpdateJob, ClaimLeases, AcceptLeased, CompleteRunning, AddEvents, AddArtifact, PutWorker, SetApproval
// and DeleteEnded;
// credential.Store's CreatePrincipal, UpdatePrincipal, CreateCredential
// and UpdateCredential; replay.Store's Insert and Collect;
// envelope.Store's Apply; receipts.Store's AddReceipt, Sequence and
// AddCheckpoint) the suite checks, each on a fresh database, that:
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
// When Tx also implements workerapi.SharedTransactor, each case runs a
// second time, on stores of its own, with InSharedTx in place of InTx
// (as in TestTransactions/Leases/ClaimJobs/Rollback/Shared): a shared
// transaction is a transaction, which every store joins.
//
// Sequence and Collect are held to this too, although a Server calls them
// outside any transaction: their Store interfaces say that every method
// joins the transaction its context carries.
//
// A failing subtest names the store, the write and the case, as in
// TestTransactions/Leases/ClaimLeases/Rollback, and its message names the
// read that saw (or missed) the write. A NonceStore has no read method:
// an Insert of the same nonce (replay.ErrReplayedNonce while it is held)
// and a second Collect at the same time (nothing left to delete) are its
// reads.
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
// and uses Stores.Tx and the five stores, which must share one new, empty
// database (Stores.Notifier is not used and may be nil). Cases run in
// parallel (t.Parallel), so newStores may be called from several
// goroutines at once, and each call must return stores independent of
// every other call's: a database of their own, which no other case reads
// or writes.
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
							t.Parallel()
							st := newStores(t)
							if missing := missingStore(st); missing != "" {
								t.Fatalf("newStores returned Stores without %s", missing)
							}
							ctx, cancel := context.WithTimeout(t.Context(), caseTimeout)
							defer cancel()
							c.run(t, ctx, st, w)
							if _, ok := st.Tx.(workerapi.SharedTransactor); ok {
								t.Run("Shared", func(t *testing.T) {
									st := newStores(t)
									st.Tx = sharedTx{st.Tx.(workerapi.SharedTransactor)}
									c.run(t, ctx, st, w)
								})
							}
						})
					}
				})
			}
		})
	}
}

// sharedTx is a Transactor whose InTx is the SharedTransactor's
// InSharedTx, for the cases' Shared runs.
type sharedTx struct{ workerapi.SharedTransactor }

func (s sharedTx) InTx(ctx context.Context, fn func(ctx context.Context) error) error {
	return s.InSharedTx(ctx, "workerapitest", fn)
}

// missingStore names the first store the suite needs that st lacks.
func missingStore(st workerapi.Stores) string {
	for _, s := range []struct {
		name    string
		missing bool
	}{
		{"Tx", st.Tx == nil}, {"Leases", st.Leases == nil}, {"Credentials", st.Credentials == nil},
		{"Nonces", st.Nonces == nil}, {"Envelope", st.Envelope == nil}, {"Receipts", st.Receipts == nil},
	} {
		if s.missing {
			return s.name
		}
	}
	return ""
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
	// on one database do not disturb each other.
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

// newProbe makes instance i of w, failing t if its setup fails.
func newProbe(t *testing.T, ctx context.Context, st workerapi.Stores, w write, i int) *probe {
	t.Helper()
	p, err := w.probe(ctx, st, i)
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
