// Package leasetest is the conformance suite that every lease.Store must
// pass. An adapter's test calls Run with a function that returns a new,
// empty store:
//
//	func TestLeaseStore(t *testing.T) {
//		leasetest.Run(t, func(t *testing.T) lease.Store { return newEmptyStore(t) })
//	}
//
// The suite's tests run in parallel, each on a store of its own: the
// function is called concurrently, from parallel subtests, and must
// return a store independent of every other it returned (a database, or
// a schema, of its own), so that no test sees another's writes.
//
// The suite drives the store through lease.Manager, so it checks the
// state machine end to end on that store: every legal and
// illegal transition, matching, ordering, expiry, fencing, idempotency,
// and 32 goroutines leasing 2,000 jobs (500 under the race detector).
//
// The tests are grouped by area, one file each: claim.go (matching,
// ordering, governors), accept_complete.go (the path to a result and the
// moves the state machine refuses), expiry.go (TTL, accept deadline,
// retries, Touch), fencing.go (stale tokens), cancel.go, retry.go
// (Manager.Retry of a failed or canceled job), bounds.go (a
// cancel's grace and the max runtime revoke leases), events.go (logs,
// status and artifacts), records.go (what the store keeps and the errors
// it gives: ids as bytes, JSON byte for byte, the worker filter, limits;
// order.go: lists in descending order with their cursor)
// and concurrency.go; approval.go checks least privilege (a request
// narrows the worker's registered types, never widens them; the cap on
// live leases; pending and pinned approvals; SetApproval and a PutWorker
// that keeps the approval); retention.go checks DeleteEnded and
// Manager.Prune (ended jobs go with their events and artifacts, nothing
// else does, concurrent deleters delete each job once); liveness.go
// checks online, stale and offline workers, ExpireOffline, and that
// Store.OfflineJobs keeps to its cutoff on both sides, at or before it:
// the worker's LastSeenAt, and the lease's AcceptedAt, else its LeasedAt
// (Liveness/OfflineJobsCutoff); reconcile.go
// checks Reconcile (a restarted or heartbeating worker ends the leases it
// no longer holds, sparing those granted after its newest lease answer)
// and exact approvals (a widening waits for an operator); tags.go
// checks pools (a job's tags restrict it to the workers that have them,
// an approval's pinned tags narrow a worker's, also with many workers
// claiming at once, and Explain names the missing tags); drain.go checks,
// on a store that is a lease.DrainStore, that a drain request is kept
// (PutWorker too keeps it) and grants the worker nothing. claim.go also runs a claim that the store retries
// after a rolled-back attempt called plan.
//
// The suite's own test, wrong_test.go, runs it on stores that are wrong in
// one way each (case-insensitive or locale-ordered ids, re-encoded JSON, a
// worker filter that keeps finished jobs, a limit <= 0 accepted, an
// OfflineJobs that ignores its cutoff or the lease's time, ...) and
// checks that the suite fails each, in the test that names the mistake.
package leasetest

import (
	"context"
	"crypto/rand"
	"encoding/json"
	"errors"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"

	"github.com/nodelane/nodelane/internal/testclock"
	"github.com/nodelane/nodelane/lease"
)

// Run runs the conformance suite against stores made by newStore. Each
// test gets its own store, and every test runs in parallel with the
// others (a test whose subtests share its store runs them one after
// another), so newStore is called concurrently, from parallel subtests,
// and must return independent stores: what one test writes must never
// show in another's store.
func Run(t *testing.T, newStore func(t *testing.T) lease.Store) {
	groups := []struct {
		name  string
		tests []test
	}{
		{"Claim", claimTests},
		{"AcceptComplete", acceptCompleteTests},
		{"Expiry", expiryTests},
		{"Fencing", fencingTests},
		{"Cancel", cancelTests},
		{"Retry", retryTests},
		{"Bounds", boundTests},
		{"Events", eventTests},
		{"Records", recordTests},
		{"Concurrency", concurrencyTests},
		{"Explain", explainTests},
		{"Approval", approvalTests},
		{"Retention", retentionTests},
		{"Answers", answerTests},
		{"Liveness", livenessTests},
		{"Tags", tagTests},
		{"Stats", statsTests},
		{"Retire", retireTests},
		{"Reconcile", reconcileTests},
		{"LeaseEnded", endedTests},
		{"Drain", drainTests},
	}
	for _, g := range groups {
		t.Run(g.name, func(t *testing.T) {
			t.Parallel()
			runGroup(t, newStore, g.tests)
		})
	}
}

// test is one test of the suite. It gets a fixture over a fresh store.
type test struct {
	name string
	fn   func(t *testing.T, f *fixture)
}

// runGroup runs each test of tests in parallel, each on a fresh store.
func runGroup(t *testing.T, newStore func(t *testing.T) lease.Store, tests []test) {
	t.Helper()
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			tc.fn(t, newFixture(t, newStore))
		})
	}
}

// epoch has a nanosecond part so that stores that fail to truncate or to
// round-trip microseconds are caught.
var epoch = time.Date(2026, 11, 30, 9, 0, 0, 123456789, time.UTC)

const (
	ttl         = 600 * time.Second
	acceptTTL   = 60 * time.Second
	retryBase   = 10 * time.Second
	cancelGrace = 5 * time.Minute
	maxRuntime  = 24 * time.Hour
)

// fixture is one test's store, clock and Manager. Its helpers fail t.
type fixture struct {
	t        *testing.T
	ctx      context.Context
	newStore func(t *testing.T) lease.Store
	store    lease.Store
	clock    *testclock.Clock
	m        *lease.Manager
}

func newFixture(t *testing.T, newStore func(t *testing.T) lease.Store) *fixture {
	t.Helper()
	f := &fixture{t: t, ctx: context.Background(), newStore: newStore, store: newStore(t), clock: testclock.New(epoch)}
	f.m = lease.NewManager(f.store, &lease.Config{
		LeaseTTL:      ttl,
		AcceptTimeout: acceptTTL,
		CancelGrace:   cancelGrace,
		MaxRuntime:    maxRuntime,
		RetryBase:     retryBase,
		RetryMax:      time.Hour,
		Now:           f.clock.Now,
		Rand:          rand.Reader,
	})
	return f
}

// sub returns the fixture for the subtest t: the same store, clock and
// Manager, whose helpers fail t rather than its parent.
func (f *fixture) sub(t *testing.T) *fixture {
	g := *f
	g.t = t
	return &g
}

// fresh returns a fixture for the subtest t over a new store of its own,
// for subtests that must not see each other's jobs.
func (f *fixture) fresh(t *testing.T) *fixture {
	t.Helper()
	return newFixture(t, f.newStore)
}

// now is the Manager's idea of the clock's time.
func (f *fixture) now() time.Time { return f.clock.Now().UTC().Truncate(time.Microsecond) }

func (f *fixture) enqueue(typ string, opts ...func(*lease.NewJob)) *lease.Job {
	f.t.Helper()
	nj := lease.NewJob{Type: typ, Payload: json.RawMessage(`{"n":1}`)}
	for _, o := range opts {
		o(&nj)
	}
	j, err := f.m.Enqueue(f.ctx, nj)
	if err != nil {
		f.t.Fatalf("Enqueue(%s): %v", typ, err)
	}
	f.clock.Advance(time.Millisecond) // keeps creation order unambiguous
	return j
}

func (f *fixture) worker(node string, gpus []lease.GPU, types []string, gov lease.Governor) *lease.Worker {
	f.t.Helper()
	w, err := f.m.RegisterWorker(f.ctx, &lease.Worker{
		NodeID:       node,
		Name:         node,
		Capabilities: lease.Capabilities{GPUs: gpus, JobTypes: types},
		Governor:     gov,
	})
	if err != nil {
		f.t.Fatalf("RegisterWorker(%s): %v", node, err)
	}
	return w
}

func (f *fixture) defaultWorker(node string) *lease.Worker {
	f.t.Helper()
	return f.worker(node, []lease.GPU{{SKU: "rtx-4090", VRAMMB: 24576}}, []string{"status_check", "lora_train"}, lease.Governor{MaxJobs: 4})
}

func (f *fixture) lease(w *lease.Worker, n int) []lease.Grant {
	f.t.Helper()
	gs, err := f.m.Lease(f.ctx, lease.LeaseRequest{WorkerID: w.ID, MaxJobs: n})
	if err != nil {
		f.t.Fatalf("Lease(%s): %v", w.NodeID, err)
	}
	return gs
}

func (f *fixture) leaseOne(w *lease.Worker) (*lease.Job, lease.Ref) {
	f.t.Helper()
	gs := f.lease(w, 1)
	if len(gs) != 1 {
		f.t.Fatalf("Lease(%s) granted %d jobs, want 1", w.NodeID, len(gs))
	}
	return gs[0].Job, lease.Ref{JobID: gs[0].Job.ID, WorkerID: w.ID, Token: gs[0].Token}
}

func (f *fixture) accept(ref lease.Ref) *lease.Job {
	f.t.Helper()
	j, err := f.m.Accept(f.ctx, ref)
	if err != nil {
		f.t.Fatalf("Accept(%s): %v", ref.JobID, err)
	}
	return j
}

func (f *fixture) complete(ref lease.Ref, res lease.Result) *lease.Job {
	f.t.Helper()
	j, repeated, err := f.m.Complete(f.ctx, ref, res)
	if err != nil || repeated {
		f.t.Fatalf("Complete(%s): repeated=%v, %v", ref.JobID, repeated, err)
	}
	return j
}

func (f *fixture) fail(ref lease.Ref, fl lease.Failure) *lease.Job {
	f.t.Helper()
	j, err := f.m.Fail(f.ctx, ref, fl)
	if err != nil {
		f.t.Fatalf("Fail(%s): %v", ref.JobID, err)
	}
	return j
}

func (f *fixture) release(ref lease.Ref, reason string) *lease.Job {
	f.t.Helper()
	j, err := f.m.Release(f.ctx, ref, reason)
	if err != nil {
		f.t.Fatalf("Release(%s): %v", ref.JobID, err)
	}
	return j
}

func (f *fixture) cancel(id string) *lease.Job {
	f.t.Helper()
	j, err := f.m.Cancel(f.ctx, id)
	if err != nil {
		f.t.Fatalf("Cancel(%s): %v", id, err)
	}
	return j
}

// expire runs Expire and checks that it ended want leases.
func (f *fixture) expire(want int) {
	f.t.Helper()
	n, err := f.m.Expire(f.ctx)
	if err != nil || n != want {
		f.t.Fatalf("Expire = %d, %v; want %d", n, err, want)
	}
}

func (f *fixture) get(id string) *lease.Job {
	f.t.Helper()
	j, err := f.m.Get(f.ctx, id)
	if err != nil {
		f.t.Fatalf("Get(%s): %v", id, err)
	}
	return j
}

// same checks that the store gives back exactly the job the Manager wrote.
func (f *fixture) same(want *lease.Job) {
	f.t.Helper()
	got := f.get(want.ID)
	if d := cmp.Diff(want, got, cmpopts.EquateEmpty()); d != "" {
		f.t.Fatalf("stored job differs from the one written (-written +stored):\n%s", d)
	}
	if want.Rev != got.Rev {
		f.t.Fatalf("stored rev = %d, written %d", got.Rev, want.Rev)
	}
}

// list returns every job matching jf, paging through Manager.List.
func (f *fixture) list(jf lease.JobFilter) []*lease.Job {
	f.t.Helper()
	var out []*lease.Job
	for {
		page, next, err := f.m.List(f.ctx, jf)
		if err != nil {
			f.t.Fatalf("List(%+v): %v", jf, err)
		}
		out = append(out, page...)
		if next == "" {
			return out
		}
		jf.After = next
	}
}

func (f *fixture) state(id string, want lease.State) *lease.Job {
	f.t.Helper()
	j := f.get(id)
	if j.State != want {
		f.t.Fatalf("job %s state = %s, want %s", id, j.State, want)
	}
	return j
}

func wantErr(t *testing.T, what string, err, target error) {
	t.Helper()
	if !errors.Is(err, target) {
		t.Fatalf("%s: err = %v, want %v", what, err, target)
	}
}

func wantTransition(t *testing.T, what string, err error, from, to lease.State) {
	t.Helper()
	var te *lease.TransitionError
	if !errors.As(err, &te) || !errors.Is(err, lease.ErrInvalidTransition) {
		t.Fatalf("%s: err = %v, want *TransitionError", what, err)
	}
	if te.From != from || te.To != to {
		t.Fatalf("%s: transition %s -> %s, want %s -> %s", what, te.From, te.To, from, to)
	}
}
