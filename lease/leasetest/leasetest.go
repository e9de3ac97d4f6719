// Package leasetest is the conformance suite that every lease.Store must
// pass. An adapter's test calls Run with a function that returns a new,
// empty store:
//
//	func TestLeaseStore(t *testing.T) {
//		leasetest.Run(t, func(t *testing.T) lease.Store { return newEmptyStore(t) })
//	}
//
// The suite drives the store through lease.Manager, so it checks the
// state machine of DESIGN §5 end to end on that store: every legal and
// illegal transition, matching, ordering, expiry, fencing, idempotency,
// and 32 goroutines leasing 2,000 jobs.
package leasetest

import (
	"context"
	"crypto/rand"
	"encoding/json"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"

	"github.com/nodelane/nodelane/lease"
)

// Clock is a settable clock for tests.
type Clock struct {
	mu sync.Mutex
	t  time.Time
}

// NewClock returns a Clock reading t.
func NewClock(t time.Time) *Clock { return &Clock{t: t} }

// Now returns the clock's time.
func (c *Clock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

// Advance moves the clock forward by d.
func (c *Clock) Advance(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.t = c.t.Add(d)
}

// epoch has a nanosecond part so that stores that fail to truncate or to
// round-trip microseconds are caught.
var epoch = time.Date(2026, 11, 30, 9, 0, 0, 123456789, time.UTC)

const (
	ttl       = 600 * time.Second
	acceptTTL = 60 * time.Second
	retryBase = 10 * time.Second
)

type fixture struct {
	t     *testing.T
	ctx   context.Context
	store lease.Store
	clock *Clock
	m     *lease.Manager
}

func newFixture(t *testing.T, newStore func(t *testing.T) lease.Store) *fixture {
	t.Helper()
	f := &fixture{t: t, ctx: context.Background(), store: newStore(t), clock: NewClock(epoch)}
	f.m = lease.NewManager(f.store, &lease.Config{
		LeaseTTL:      ttl,
		AcceptTimeout: acceptTTL,
		RetryBase:     retryBase,
		RetryMax:      time.Hour,
		Now:           f.clock.Now,
		Rand:          rand.Reader,
	})
	return f
}

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

// Run runs the conformance suite against stores made by newStore. Each
// subtest gets its own store.
func Run(t *testing.T, newStore func(t *testing.T) lease.Store) {
	tests := []struct {
		name string
		fn   func(t *testing.T, f *fixture)
	}{
		{"HappyPath", testHappyPath},
		{"IllegalTransitions", testIllegalTransitions},
		{"Ordering", testOrdering},
		{"MaxJobs", testMaxJobs},
		{"Scheduled", testScheduled},
		{"Matching", testMatching},
		{"Governor", testGovernor},
		{"AllowHook", testAllowHook},
		{"TTLExpiry", testTTLExpiry},
		{"AcceptDeadline", testAcceptDeadline},
		{"ExpiryChecksLazily", testExpiryChecksLazily},
		{"RetryBackoff", testRetryBackoff},
		{"AttemptsExhausted", testAttemptsExhausted},
		{"StaleTokenAfterReLease", testStaleToken},
		{"Release", testRelease},
		{"Cancel", testCancel},
		{"LogSeqIdempotent", testLogSeq},
		{"CompleteRepeated", testCompleteRepeated},
		{"Artifacts", testArtifacts},
		{"SentinelErrors", testSentinels},
		{"Timestamps", testTimestamps},
		{"ListAndPaging", testList},
		{"Workers", testWorkers},
		{"ConcurrentLeasing", testConcurrentLeasing},
		{"ConcurrentGovernor", testConcurrentGovernor},
		{"UpdateRevision", testUpdateRevision},
		{"Touch", testTouch},
		{"ConcurrentWritesOneLease", testConcurrentRelease},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			tc.fn(t, newFixture(t, newStore))
		})
	}
}

func testHappyPath(t *testing.T, f *fixture) {
	w := f.defaultWorker("studio-gpu")
	j := f.enqueue("lora_train", func(nj *lease.NewJob) {
		nj.Requirements = lease.Requirements{GPUSKU: "rtx-4090", GPUCount: 1, MinVRAMMB: 16000}
	})
	if j.State != lease.StateQueued || j.Attempt != 1 || j.MaxAttempts != 3 {
		t.Fatalf("enqueued job = %+v", j)
	}
	f.same(j)
	lj, ref := f.leaseOne(w)
	if lj.ID != j.ID || lj.State != lease.StateLeased || lj.Lease.Epoch != 1 || lj.Lease.WorkerID != w.ID {
		t.Fatalf("leased job = %+v lease %+v", lj, lj.Lease)
	}
	if lj.Lease.SKU != "rtx-4090" || !lj.Lease.ExpiresAt.Equal(lj.LeasedAt.Add(ttl)) || !lj.Lease.AcceptBy.Equal(lj.LeasedAt.Add(acceptTTL)) {
		t.Fatalf("lease = %+v", lj.Lease)
	}
	f.same(lj)
	aj, err := f.m.Accept(f.ctx, ref)
	if err != nil || aj.State != lease.StateRunning || aj.AcceptedAt == nil {
		t.Fatalf("Accept = %+v, %v", aj, err)
	}
	f.same(aj)
	f.clock.Advance(time.Minute)
	ej, err := f.m.Extend(f.ctx, ref)
	if err != nil || !ej.Lease.ExpiresAt.Equal(f.clock.Now().UTC().Truncate(time.Microsecond).Add(ttl)) {
		t.Fatalf("Extend = %+v, %v", ej, err)
	}
	cj, repeated, err := f.m.Complete(f.ctx, ref, lease.Result{OutputURI: "s3://out", Metrics: json.RawMessage(`{"loss":0.12}`), FinalMessage: "done"})
	if err != nil || repeated || cj.State != lease.StateSucceeded || cj.FinishedAt == nil || cj.Result.OutputURI != "s3://out" {
		t.Fatalf("Complete = %+v, %v, %v", cj, repeated, err)
	}
	f.same(cj)
	rj, err := f.m.SetReceipt(f.ctx, j.ID, "rcp_1")
	if err != nil || rj.ReceiptID != "rcp_1" {
		t.Fatalf("SetReceipt = %+v, %v", rj, err)
	}
	f.same(rj)
}

func testIllegalTransitions(t *testing.T, f *fixture) {
	w := f.defaultWorker("w")
	// complete and fail-like moves before accept
	j := f.enqueue("status_check")
	_, ref := f.leaseOne(w)
	_, _, err := f.m.Complete(f.ctx, ref, lease.Result{})
	wantTransition(t, "complete before accept", err, lease.StateLeased, lease.StateSucceeded)
	f.state(j.ID, lease.StateLeased)
	if _, err := f.m.Accept(f.ctx, ref); err != nil {
		t.Fatal(err)
	}
	if _, _, err := f.m.Complete(f.ctx, ref, lease.Result{}); err != nil {
		t.Fatal(err)
	}
	before := f.get(j.ID)
	_, err = f.m.Fail(f.ctx, ref, lease.Failure{Code: "x"})
	wantTransition(t, "fail after complete", err, lease.StateSucceeded, lease.StateFailed)
	_, err = f.m.Accept(f.ctx, ref)
	wantTransition(t, "accept after complete", err, lease.StateSucceeded, lease.StateRunning)
	_, err = f.m.Release(f.ctx, ref, "")
	wantTransition(t, "release after complete", err, lease.StateSucceeded, lease.StateQueued)
	_, err = f.m.Cancel(f.ctx, j.ID)
	wantTransition(t, "cancel after complete", err, lease.StateSucceeded, lease.StateCanceled)
	f.same(before) // nothing changed

	// a failed job stays failed
	j2 := f.enqueue("status_check")
	_, ref2 := f.leaseOne(w)
	f.m.Accept(f.ctx, ref2)
	if fj, err := f.m.Fail(f.ctx, ref2, lease.Failure{Code: "bad_input", Message: "no"}); err != nil || fj.State != lease.StateFailed {
		t.Fatalf("Fail = %+v, %v", fj, err)
	}
	_, _, err = f.m.Complete(f.ctx, ref2, lease.Result{})
	wantTransition(t, "complete after fail", err, lease.StateFailed, lease.StateSucceeded)
	_, err = f.m.Cancel(f.ctx, j2.ID)
	wantTransition(t, "cancel after fail", err, lease.StateFailed, lease.StateCanceled)
	_, err = f.m.SetReceipt(f.ctx, f.enqueue("status_check").ID, "r")
	wantTransition(t, "receipt on a queued job", err, lease.StateQueued, lease.StateQueued)
}

func testOrdering(t *testing.T, f *fixture) {
	w := f.worker("w", nil, []string{"status_check"}, lease.Governor{MaxJobs: 10})
	a := f.enqueue("status_check")
	b := f.enqueue("status_check", func(nj *lease.NewJob) { nj.Priority = 5 })
	c := f.enqueue("status_check")
	d := f.enqueue("status_check", func(nj *lease.NewJob) { nj.Priority = 5 })
	e := f.enqueue("status_check", func(nj *lease.NewJob) { nj.Priority = -1 })
	var got []string
	for range 5 {
		j, _ := f.leaseOne(w)
		got = append(got, j.ID)
	}
	want := []string{b.ID, d.ID, a.ID, c.ID, e.ID}
	if d := cmp.Diff(want, got); d != "" {
		t.Fatalf("lease order (-want +got):\n%s", d)
	}
	if gs := f.lease(w, 1); len(gs) != 0 {
		t.Fatalf("leased %d jobs from an empty queue", len(gs))
	}
}

func testMaxJobs(t *testing.T, f *fixture) {
	w := f.worker("w", nil, []string{"status_check"}, lease.Governor{MaxJobs: 10})
	var ids []string
	for i := range 5 {
		ids = append(ids, f.enqueue("status_check", func(nj *lease.NewJob) { nj.Priority = 10 - i }).ID)
	}
	gs := f.lease(w, 3)
	if len(gs) != 3 {
		t.Fatalf("max_jobs 3 granted %d", len(gs))
	}
	seen := map[string]bool{}
	for i, g := range gs {
		if g.Job.ID != ids[i] {
			t.Errorf("grant %d = %s, want %s", i, g.Job.ID, ids[i])
		}
		if seen[g.Token] || seen[g.Job.Lease.ID] {
			t.Errorf("grant %d repeats a token or lease id", i)
		}
		seen[g.Token], seen[g.Job.Lease.ID] = true, true
		f.same(g.Job)
	}
	if gs := f.lease(w, 10); len(gs) != 2 {
		t.Fatalf("second lease granted %d, want the 2 left", len(gs))
	}
	if _, err := f.m.Lease(f.ctx, lease.LeaseRequest{WorkerID: w.ID, MaxJobs: -1}); !errors.Is(err, lease.ErrInvalidArgument) {
		t.Fatalf("max_jobs -1: %v", err)
	}
}

func testScheduled(t *testing.T, f *fixture) {
	w := f.defaultWorker("w")
	j := f.enqueue("status_check", func(nj *lease.NewJob) { nj.ScheduledAt = epoch.Add(time.Hour) })
	if gs := f.lease(w, 1); len(gs) != 0 {
		t.Fatal("leased a job scheduled in the future")
	}
	f.clock.Advance(time.Hour)
	if lj, _ := f.leaseOne(w); lj.ID != j.ID {
		t.Fatalf("leased %s, want %s", lj.ID, j.ID)
	}
}

func testMatching(t *testing.T, f *fixture) {
	big := f.worker("big", []lease.GPU{{SKU: "h100", VRAMMB: 81920}, {SKU: "h100", VRAMMB: 81920}, {SKU: "rtx-4090", VRAMMB: 24576}}, []string{"lora_train", "status_check"}, lease.Governor{MaxJobs: 100})
	small := f.worker("small", []lease.GPU{{SKU: "rtx-3060", VRAMMB: 12288}}, []string{"lora_train", "status_check"}, lease.Governor{MaxJobs: 100})
	cpu := f.worker("cpu", nil, []string{"status_check", "lora_train"}, lease.Governor{MaxJobs: 100})
	type job struct {
		name string
		typ  string
		req  lease.Requirements
		want []string // workers that may take it
	}
	jobs := []job{
		{"cpu-only", "status_check", lease.Requirements{}, []string{"big", "small", "cpu"}},
		{"any 16GB gpu", "lora_train", lease.Requirements{MinVRAMMB: 16000}, []string{"big"}},
		{"any 1 gpu", "lora_train", lease.Requirements{GPUCount: 1}, []string{"big", "small"}},
		{"two h100", "lora_train", lease.Requirements{GPUSKU: "h100", GPUCount: 2, MinVRAMMB: 80000}, []string{"big"}},
		{"three h100", "lora_train", lease.Requirements{GPUSKU: "h100", GPUCount: 3}, nil},
		{"three any", "lora_train", lease.Requirements{GPUCount: 3}, []string{"big"}},
		{"three any 30GB", "lora_train", lease.Requirements{GPUCount: 3, MinVRAMMB: 30000}, nil},
		{"rtx-3060", "lora_train", lease.Requirements{GPUSKU: "rtx-3060"}, []string{"small"}},
		{"rtx-3060 13GB", "lora_train", lease.Requirements{GPUSKU: "rtx-3060", MinVRAMMB: 13000}, nil},
		{"unknown sku", "lora_train", lease.Requirements{GPUSKU: "a100"}, nil},
		{"unknown type", "raw_training", lease.Requirements{}, nil},
	}
	workers := map[string]*lease.Worker{"big": big, "small": small, "cpu": cpu}
	for _, jc := range jobs {
		t.Run(jc.name, func(t *testing.T) {
			j := f.enqueue(jc.typ, func(nj *lease.NewJob) { nj.Requirements = jc.req })
			defer f.m.Cancel(f.ctx, j.ID)
			for name, w := range workers {
				gs := f.lease(w, 1)
				took := len(gs) == 1
				want := false
				for _, n := range jc.want {
					want = want || n == name
				}
				if took != want {
					t.Errorf("worker %s took=%v, want %v", name, took, want)
				}
				for _, g := range gs {
					if g.Job.ID != j.ID {
						t.Fatalf("worker %s leased %s, a job of an earlier case", name, g.Job.ID)
					}
					if _, err := f.m.Release(f.ctx, lease.Ref{JobID: g.Job.ID, WorkerID: w.ID, Token: g.Token}, "test"); err != nil {
						t.Fatal(err)
					}
				}
			}
		})
	}
	// The request narrows what the worker offers.
	j := f.enqueue("lora_train", func(nj *lease.NewJob) { nj.Requirements.GPUSKU = "rtx-4090" })
	gs, err := f.m.Lease(f.ctx, lease.LeaseRequest{WorkerID: big.ID, GPUSKUs: []string{"h100"}})
	if err != nil || len(gs) != 0 {
		t.Fatalf("offering only h100 leased %d (%v)", len(gs), err)
	}
	gs, err = f.m.Lease(f.ctx, lease.LeaseRequest{WorkerID: big.ID, JobTypes: []string{"status_check"}})
	if err != nil || len(gs) != 0 {
		t.Fatalf("offering only status_check leased %d (%v)", len(gs), err)
	}
	gs, err = f.m.Lease(f.ctx, lease.LeaseRequest{WorkerID: big.ID, GPUSKUs: []string{"rtx-4090"}, JobTypes: []string{"lora_train"}})
	if err != nil || len(gs) != 1 || gs[0].Job.ID != j.ID {
		t.Fatalf("offering rtx-4090 leased %v (%v)", gs, err)
	}
	// The SKU recorded on the lease: the job's, else the worker's first GPU's.
	if gs[0].Job.Lease.SKU != "rtx-4090" {
		t.Fatalf("lease SKU = %q", gs[0].Job.Lease.SKU)
	}
	f.enqueue("status_check")
	gs, err = f.m.Lease(f.ctx, lease.LeaseRequest{WorkerID: big.ID, PolicyVersion: 7, Price: func(sku string) int64 { return map[string]int64{"h100": 2_500_000}[sku] }})
	if err != nil || len(gs) != 1 || gs[0].Job.Lease.SKU != "h100" || gs[0].Job.Lease.PriceMicroUSD != 2_500_000 || gs[0].Job.Lease.PolicyVersion != 7 {
		t.Fatalf("lease of a job without SKU = %+v (%v)", gs, err)
	}
	f.same(gs[0].Job)
	// An unregistered worker leases nothing.
	_, err = f.m.Lease(f.ctx, lease.LeaseRequest{WorkerID: "wrk_nobody"})
	wantErr(t, "unknown worker", err, lease.ErrNotFound)
}

func testGovernor(t *testing.T, f *fixture) {
	w := f.worker("w", []lease.GPU{{SKU: "rtx-4090", VRAMMB: 24576}}, []string{"status_check", "lora_train"}, lease.Governor{MaxJobs: 2, MaxVRAMMB: 16000})
	for range 4 {
		f.enqueue("status_check")
	}
	gs := f.lease(w, 5)
	if len(gs) != 2 {
		t.Fatalf("governor max_jobs 2 granted %d", len(gs))
	}
	if more := f.lease(w, 5); len(more) != 0 {
		t.Fatalf("worker at its governor limit was granted %d more", len(more))
	}
	ref := lease.Ref{JobID: gs[0].Job.ID, WorkerID: w.ID, Token: gs[0].Token}
	f.m.Accept(f.ctx, ref)
	if _, _, err := f.m.Complete(f.ctx, ref, lease.Result{}); err != nil {
		t.Fatal(err)
	}
	if more := f.lease(w, 5); len(more) != 1 {
		t.Fatalf("after one completion granted %d, want 1", len(more))
	}
	// max_vram_mb caps one job's VRAM requirement.
	other := f.worker("other", []lease.GPU{{SKU: "rtx-4090", VRAMMB: 24576}}, []string{"lora_train"}, lease.Governor{MaxJobs: 5, MaxVRAMMB: 16000})
	f.enqueue("lora_train", func(nj *lease.NewJob) { nj.Requirements.MinVRAMMB = 20000 })
	if gs := f.lease(other, 1); len(gs) != 0 {
		t.Fatal("a job over the governor's max_vram_mb was leased")
	}
	f.enqueue("lora_train", func(nj *lease.NewJob) { nj.Requirements.MinVRAMMB = 16000 })
	if gs := f.lease(other, 1); len(gs) != 1 || gs[0].Job.Requirements.MinVRAMMB != 16000 {
		t.Fatalf("a job within max_vram_mb: %v", gs)
	}
}

func testAllowHook(t *testing.T, f *fixture) {
	w := f.defaultWorker("w")
	blocked := f.enqueue("lora_train", func(nj *lease.NewJob) { nj.Priority = 9 })
	safe := f.enqueue("status_check")
	allow := func(typ string) bool { return typ != "lora_train" }
	gs, err := f.m.Lease(f.ctx, lease.LeaseRequest{WorkerID: w.ID, MaxJobs: 5, Allow: allow})
	if err != nil || len(gs) != 1 || gs[0].Job.ID != safe.ID {
		t.Fatalf("lease with lora_train refused = %v, %v", gs, err)
	}
	f.state(blocked.ID, lease.StateQueued)
	gs, err = f.m.Lease(f.ctx, lease.LeaseRequest{WorkerID: w.ID, MaxJobs: 5, Allow: func(string) bool { return true }})
	if err != nil || len(gs) != 1 || gs[0].Job.ID != blocked.ID {
		t.Fatalf("lease with everything allowed = %v, %v", gs, err)
	}
}

func testTTLExpiry(t *testing.T, f *fixture) {
	w := f.defaultWorker("w")
	j := f.enqueue("status_check")
	_, ref := f.leaseOne(w)
	f.m.Accept(f.ctx, ref)
	f.clock.Advance(ttl - time.Microsecond)
	if n, err := f.m.Expire(f.ctx); err != nil || n != 0 {
		t.Fatalf("Expire before the TTL = %d, %v", n, err)
	}
	f.clock.Advance(time.Microsecond)
	if n, err := f.m.Expire(f.ctx); err != nil || n != 1 {
		t.Fatalf("Expire at the TTL = %d, %v", n, err)
	}
	q := f.state(j.ID, lease.StateQueued)
	if q.Attempt != 2 || q.LastError == nil || q.LastError.Code != "lease_expired" || q.LastError.Attempt != 1 {
		t.Fatalf("after expiry: attempt %d, last error %+v", q.Attempt, q.LastError)
	}
	now := f.clock.Now().UTC().Truncate(time.Microsecond)
	if d := q.ScheduledAt.Sub(now); d < retryBase/2 || d > retryBase {
		t.Fatalf("backoff after the first attempt = %v, want [%v, %v]", d, retryBase/2, retryBase)
	}
	if n, err := f.m.Expire(f.ctx); err != nil || n != 0 {
		t.Fatalf("second Expire expired %d again (%v)", n, err)
	}
	_, err := f.m.Extend(f.ctx, ref)
	wantErr(t, "extend after expiry", err, lease.ErrLeaseLost)
	f.clock.Advance(retryBase)
	lj, _ := f.leaseOne(w)
	if lj.Lease.Epoch != 2 || lj.Attempt != 2 {
		t.Fatalf("re-lease: epoch %d attempt %d, want 2 and 2", lj.Lease.Epoch, lj.Attempt)
	}
}

func testAcceptDeadline(t *testing.T, f *fixture) {
	w := f.defaultWorker("w")
	j := f.enqueue("status_check")
	_, ref := f.leaseOne(w)
	f.clock.Advance(acceptTTL)
	if n, err := f.m.Expire(f.ctx); err != nil || n != 1 {
		t.Fatalf("Expire at the accept deadline = %d, %v", n, err)
	}
	q := f.state(j.ID, lease.StateQueued)
	if q.Attempt != 1 || q.LastError.Code != "accept_timeout" || q.ScheduledAt.After(f.clock.Now()) {
		t.Fatalf("an unaccepted lease used an attempt or a backoff: %+v", q)
	}
	_, err := f.m.Accept(f.ctx, ref)
	wantErr(t, "accept after the deadline", err, lease.ErrLeaseLost)
	lj, _ := f.leaseOne(w)
	if lj.Lease.Epoch != 2 {
		t.Fatalf("epoch = %d, want 2", lj.Lease.Epoch)
	}
}

// A lease past its TTL or accept deadline is dead even before Expire has
// swept it.
func testExpiryChecksLazily(t *testing.T, f *fixture) {
	w := f.defaultWorker("w")
	f.enqueue("status_check")
	f.enqueue("status_check")
	_, unaccepted := f.leaseOne(w)
	_, running := f.leaseOne(w)
	f.m.Accept(f.ctx, running)
	f.clock.Advance(acceptTTL)
	_, err := f.m.Accept(f.ctx, unaccepted)
	wantErr(t, "accept at the deadline", err, lease.ErrLeaseLost)
	if _, err := f.m.Extend(f.ctx, running); err != nil {
		t.Fatalf("the accepted lease should live on: %v", err)
	}
	f.clock.Advance(ttl)
	_, err = f.m.Extend(f.ctx, running)
	wantErr(t, "extend at the TTL", err, lease.ErrLeaseLost)
	_, _, err = f.m.Complete(f.ctx, running, lease.Result{})
	wantErr(t, "complete at the TTL", err, lease.ErrLeaseLost)
	// Lease sweeps what is due before it claims: the unaccepted job is
	// eligible at once, the expired running one after its backoff.
	gs := f.lease(w, 4)
	if len(gs) != 1 || gs[0].Job.ID != unaccepted.JobID || gs[0].Job.Attempt != 1 {
		t.Fatalf("Lease after both expired granted %v, want the unaccepted job", gs)
	}
	if j := f.state(running.JobID, lease.StateQueued); j.Attempt != 2 {
		t.Fatalf("expired running job on attempt %d, want 2", j.Attempt)
	}
}

func testRetryBackoff(t *testing.T, f *fixture) {
	w := f.defaultWorker("w")
	j := f.enqueue("status_check", func(nj *lease.NewJob) { nj.MaxAttempts = 5 })
	for attempt := 1; attempt <= 3; attempt++ {
		_, ref := f.leaseOne(w)
		f.m.Accept(f.ctx, ref)
		fj, err := f.m.Fail(f.ctx, ref, lease.Failure{Code: "oom", Message: "out of memory", Payload: json.RawMessage(`{"gb":24}`), Retryable: true})
		if err != nil || fj.State != lease.StateQueued || fj.Attempt != attempt+1 {
			t.Fatalf("attempt %d: Fail = %+v, %v", attempt, fj, err)
		}
		f.same(fj)
		base := retryBase << (attempt - 1)
		now := f.clock.Now().UTC().Truncate(time.Microsecond)
		if d := fj.ScheduledAt.Sub(now); d < base/2 || d > base {
			t.Fatalf("attempt %d: backoff %v, want [%v, %v]", attempt, d, base/2, base)
		}
		if gs := f.lease(w, 1); len(gs) != 0 {
			t.Fatalf("attempt %d: the job was leased during its backoff", attempt)
		}
		f.clock.Advance(fj.ScheduledAt.Sub(now))
	}
	f.state(j.ID, lease.StateQueued)
	// A retryable failure before accept requeues at once and uses no attempt.
	_, ref := f.leaseOne(w)
	fj, err := f.m.Fail(f.ctx, ref, lease.Failure{Code: "busy", Retryable: true})
	if err != nil || fj.State != lease.StateQueued || fj.Attempt != 4 || fj.ScheduledAt.After(f.clock.Now()) {
		t.Fatalf("retryable failure before accept = %+v, %v", fj, err)
	}
}

func testAttemptsExhausted(t *testing.T, f *fixture) {
	w := f.defaultWorker("w")
	j := f.enqueue("status_check", func(nj *lease.NewJob) { nj.MaxAttempts = 2 })
	_, ref := f.leaseOne(w)
	f.m.Accept(f.ctx, ref)
	f.clock.Advance(ttl)
	f.m.Expire(f.ctx) // attempt 1 used by the TTL
	f.clock.Advance(time.Hour)
	_, ref = f.leaseOne(w)
	f.m.Accept(f.ctx, ref)
	fj, err := f.m.Fail(f.ctx, ref, lease.Failure{Code: "oom", Message: "again", Retryable: true})
	if err != nil || fj.State != lease.StateFailed || fj.LastError.Code != "oom" || fj.LastError.Attempt != 2 || fj.FinishedAt == nil {
		t.Fatalf("last attempt failing = %+v, %v", fj, err)
	}
	f.same(fj)
	// and by TTL expiry
	j2 := f.enqueue("status_check", func(nj *lease.NewJob) { nj.MaxAttempts = 1 })
	_, ref = f.leaseOne(w)
	f.m.Accept(f.ctx, ref)
	f.clock.Advance(ttl)
	f.m.Expire(f.ctx)
	if fj := f.state(j2.ID, lease.StateFailed); fj.LastError.Code != "lease_expired" {
		t.Fatalf("expired last attempt: %+v", fj.LastError)
	}
	f.state(j.ID, lease.StateFailed)
	// non-retryable failure on the first attempt
	f.enqueue("status_check")
	_, ref = f.leaseOne(w)
	f.m.Accept(f.ctx, ref)
	if fj, err := f.m.Fail(f.ctx, ref, lease.Failure{Code: "bad_input", Retryable: false}); err != nil || fj.State != lease.StateFailed || fj.Attempt != 1 {
		t.Fatalf("non-retryable failure = %+v, %v", fj, err)
	}
}

// After the job passed to a new lease, every write under the old token
// fails with ErrLeaseLost, whichever way the old lease ended.
func testStaleToken(t *testing.T, f *fixture) {
	ends := []struct {
		name string
		end  func(f *fixture, ref lease.Ref)
	}{
		{"ttl expiry", func(f *fixture, ref lease.Ref) {
			f.m.Accept(f.ctx, ref)
			f.clock.Advance(ttl)
			f.m.Expire(f.ctx)
			f.clock.Advance(time.Hour)
		}},
		{"accept deadline", func(f *fixture, ref lease.Ref) {
			f.clock.Advance(acceptTTL)
			f.m.Expire(f.ctx)
		}},
		{"release", func(f *fixture, ref lease.Ref) {
			f.m.Accept(f.ctx, ref)
			if _, err := f.m.Release(f.ctx, ref, "spot preemption"); err != nil {
				f.t.Fatal(err)
			}
		}},
		{"retryable fail", func(f *fixture, ref lease.Ref) {
			f.m.Accept(f.ctx, ref)
			f.m.Fail(f.ctx, ref, lease.Failure{Retryable: true})
			f.clock.Advance(time.Hour)
		}},
	}
	for _, e := range ends {
		t.Run(e.name, func(t *testing.T) {
			f.t = t
			a := f.defaultWorker("a-" + e.name)
			b := f.defaultWorker("b-" + e.name)
			j := f.enqueue("status_check")
			_, old := f.leaseOne(a)
			e.end(f, old)
			nj, cur := f.leaseOne(b)
			if nj.ID != j.ID || nj.Lease.Epoch != 2 {
				t.Fatalf("re-lease = %s epoch %d", nj.ID, nj.Lease.Epoch)
			}
			before := f.get(j.ID)
			ops := map[string]func() error{
				"extend": func() error { _, err := f.m.Extend(f.ctx, old); return err },
				"accept": func() error { _, err := f.m.Accept(f.ctx, old); return err },
				"events": func() error {
					_, err := f.m.RecordEvents(f.ctx, old, lease.Event{Kind: lease.EventLog, Seq: 1, Message: "x"})
					return err
				},
				"artifact": func() error {
					_, err := f.m.AddArtifact(f.ctx, old, lease.Artifact{Type: "adapter", Name: "a"})
					return err
				},
				"complete": func() error { _, _, err := f.m.Complete(f.ctx, old, lease.Result{}); return err },
				"fail":     func() error { _, err := f.m.Fail(f.ctx, old, lease.Failure{}); return err },
				"release":  func() error { _, err := f.m.Release(f.ctx, old, ""); return err },
				// the new holder's token under the old holder's name
				"other worker": func() error {
					_, err := f.m.Extend(f.ctx, lease.Ref{JobID: cur.JobID, WorkerID: a.ID, Token: cur.Token})
					return err
				},
			}
			for name, op := range ops {
				wantErr(t, name, op(), lease.ErrLeaseLost)
			}
			f.same(before)
			if evs, err := f.m.Events(f.ctx, j.ID, 0, 10); err != nil || len(evs) != 0 {
				t.Fatalf("a stale lease stored %d events (%v)", len(evs), err)
			}
			if arts, err := f.m.Artifacts(f.ctx, lease.ArtifactFilter{JobID: j.ID}); err != nil || len(arts) != 0 {
				t.Fatalf("a stale lease stored %d artifacts (%v)", len(arts), err)
			}
			// The live lease still works.
			if _, err := f.m.Accept(f.ctx, cur); err != nil {
				t.Fatal(err)
			}
			if _, _, err := f.m.Complete(f.ctx, cur, lease.Result{}); err != nil {
				t.Fatal(err)
			}
		})
	}
}

func testRelease(t *testing.T, f *fixture) {
	w := f.defaultWorker("w")
	j := f.enqueue("status_check", func(nj *lease.NewJob) { nj.MaxAttempts = 1 })
	for i := 1; i <= 3; i++ {
		lj, ref := f.leaseOne(w)
		if lj.Lease.Epoch != int64(i) {
			t.Fatalf("lease %d has epoch %d", i, lj.Lease.Epoch)
		}
		if i%2 == 0 {
			f.m.Accept(f.ctx, ref)
		}
		rj, err := f.m.Release(f.ctx, ref, "spot preemption")
		if err != nil || rj.State != lease.StateQueued || rj.Attempt != 1 || rj.ScheduledAt.After(f.clock.Now()) {
			t.Fatalf("Release %d = %+v, %v", i, rj, err)
		}
		f.same(rj)
		_, err = f.m.Release(f.ctx, ref, "again")
		wantErr(t, "release twice", err, lease.ErrLeaseLost)
	}
	f.state(j.ID, lease.StateQueued)
}

func testCancel(t *testing.T, f *fixture) {
	w := f.defaultWorker("w")
	setups := []struct {
		name      string
		setup     func() (*lease.Job, lease.Ref)
		wantState lease.State
		wantReq   bool
		wantErr   *lease.TransitionError
	}{
		{"queued", func() (*lease.Job, lease.Ref) { return f.enqueue("status_check"), lease.Ref{} }, lease.StateCanceled, false, nil},
		{"leased", func() (*lease.Job, lease.Ref) { f.enqueue("status_check"); return f.leaseOne(w) }, lease.StateLeased, true, nil},
		{"running", func() (*lease.Job, lease.Ref) {
			f.enqueue("status_check")
			j, ref := f.leaseOne(w)
			f.m.Accept(f.ctx, ref)
			return j, ref
		}, lease.StateRunning, true, nil},
		{"succeeded", func() (*lease.Job, lease.Ref) {
			f.enqueue("status_check")
			j, ref := f.leaseOne(w)
			f.m.Accept(f.ctx, ref)
			f.m.Complete(f.ctx, ref, lease.Result{})
			return j, ref
		}, lease.StateSucceeded, false, &lease.TransitionError{From: lease.StateSucceeded, To: lease.StateCanceled}},
		{"failed", func() (*lease.Job, lease.Ref) {
			f.enqueue("status_check")
			j, ref := f.leaseOne(w)
			f.m.Accept(f.ctx, ref)
			f.m.Fail(f.ctx, ref, lease.Failure{})
			return j, ref
		}, lease.StateFailed, false, &lease.TransitionError{From: lease.StateFailed, To: lease.StateCanceled}},
	}
	for _, s := range setups {
		t.Run(s.name, func(t *testing.T) {
			j, _ := s.setup()
			cj, err := f.m.Cancel(f.ctx, j.ID)
			if s.wantErr != nil {
				wantTransition(t, "cancel", err, s.wantErr.From, s.wantErr.To)
				f.state(j.ID, s.wantState)
				return
			}
			if err != nil || cj.State != s.wantState || cj.CancelRequested != s.wantReq {
				t.Fatalf("Cancel = %+v, %v", cj, err)
			}
			f.same(cj)
			again, err := f.m.Cancel(f.ctx, j.ID)
			if err != nil || again.Rev != cj.Rev {
				t.Fatalf("Cancel again changed the job or failed: %+v, %v", again, err)
			}
		})
	}
	endings := []struct {
		name string
		end  func(ref lease.Ref)
	}{
		{"fail", func(ref lease.Ref) { f.m.Fail(f.ctx, ref, lease.Failure{Code: "canceled", Retryable: true}) }},
		{"release", func(ref lease.Ref) { f.m.Release(f.ctx, ref, "canceled") }},
		{"silence", func(ref lease.Ref) { f.clock.Advance(ttl); f.m.Expire(f.ctx) }},
	}
	for _, e := range endings {
		t.Run("requested then "+e.name, func(t *testing.T) {
			j := f.enqueue("status_check")
			_, ref := f.leaseOne(w)
			f.m.Accept(f.ctx, ref)
			f.m.Cancel(f.ctx, j.ID)
			e.end(ref)
			if cj := f.state(j.ID, lease.StateCanceled); cj.FinishedAt == nil {
				t.Fatal("canceled job has no finished_at")
			}
		})
	}
	_, err := f.m.Cancel(f.ctx, "job_missing")
	wantErr(t, "cancel unknown", err, lease.ErrNotFound)
}

func testLogSeq(t *testing.T, f *fixture) {
	w := f.defaultWorker("w")
	j := f.enqueue("status_check")
	_, ref := f.leaseOne(w)
	f.m.Accept(f.ctx, ref)
	f.clock.Advance(time.Minute)
	res, err := f.m.RecordEvents(f.ctx, ref,
		lease.Event{Kind: lease.EventLog, Seq: 1, Message: "epoch 1", Payload: json.RawMessage(`{"loss":1.5}`)},
		lease.Event{Kind: lease.EventLog, Seq: 2, Message: "epoch 2"},
		lease.Event{Kind: lease.EventLog, Seq: 2, Message: "epoch 2 again"},
		lease.Event{Kind: lease.EventStatus, Type: "progress", Message: "50%"},
		lease.Event{Kind: lease.EventStatus, Type: "progress", Message: "50%"},
	)
	if err != nil || res.Accepted != 4 || res.Duplicates != 1 {
		t.Fatalf("RecordEvents = %+v, %v", res, err)
	}
	if !res.Job.Lease.ExpiresAt.Equal(f.clock.Now().UTC().Truncate(time.Microsecond).Add(ttl)) {
		t.Fatal("events did not extend the lease")
	}
	res, err = f.m.RecordEvents(f.ctx, ref, lease.Event{Kind: lease.EventLog, Seq: 1, Message: "resent"}, lease.Event{Kind: lease.EventLog, Seq: 3, Message: "epoch 3"})
	if err != nil || res.Accepted != 1 || res.Duplicates != 1 {
		t.Fatalf("resend = %+v, %v", res, err)
	}
	evs, err := f.m.Events(f.ctx, j.ID, 0, 100)
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for i, e := range evs {
		got = append(got, fmt.Sprintf("%s:%d:%s", e.Kind, e.Seq, e.Message))
		if e.Epoch != 1 || e.JobID != j.ID || (i > 0 && e.ID <= evs[i-1].ID) {
			t.Errorf("event %d = %+v", i, e)
		}
	}
	want := []string{"log:1:epoch 1", "log:2:epoch 2", "status:0:50%", "status:0:50%", "log:3:epoch 3"}
	if d := cmp.Diff(want, got); d != "" {
		t.Fatalf("stored events (-want +got):\n%s", d)
	}
	if string(evs[0].Payload) != `{"loss":1.5}` {
		t.Fatalf("payload = %s", evs[0].Payload)
	}
	page, _ := f.m.Events(f.ctx, j.ID, evs[1].ID, 2)
	if len(page) != 2 || page[0].ID != evs[2].ID {
		t.Fatalf("paging events after %d: %v", evs[1].ID, page)
	}
	for _, bad := range []lease.Event{{Kind: lease.EventLog, Message: "no seq"}, {Kind: lease.EventStatus}, {Kind: "other", Type: "x"}, {Kind: lease.EventLog, Seq: 9, Payload: json.RawMessage(`{`)}} {
		_, err := f.m.RecordEvents(f.ctx, ref, bad)
		wantErr(t, fmt.Sprintf("event %+v", bad), err, lease.ErrInvalidArgument)
	}
	_, err = f.m.RecordEvents(f.ctx, ref)
	wantErr(t, "no events", err, lease.ErrInvalidArgument)
}

func testCompleteRepeated(t *testing.T, f *fixture) {
	w := f.defaultWorker("w")
	f.enqueue("status_check")
	_, ref := f.leaseOne(w)
	f.m.Accept(f.ctx, ref)
	first, repeated, err := f.m.Complete(f.ctx, ref, lease.Result{FinalMessage: "done"})
	if err != nil || repeated {
		t.Fatal(err)
	}
	f.clock.Advance(time.Hour) // even after the lease would have expired
	for range 3 {
		again, repeated, err := f.m.Complete(f.ctx, ref, lease.Result{FinalMessage: "different"})
		if err != nil || !repeated {
			t.Fatalf("repeat: repeated=%v err=%v", repeated, err)
		}
		if d := cmp.Diff(first, again, cmpopts.EquateEmpty()); d != "" || again.Rev != first.Rev {
			t.Fatalf("repeat returned another job (-first +again):\n%s", d)
		}
	}
	other := ref
	other.WorkerID = "wrk_other"
	_, _, err = f.m.Complete(f.ctx, other, lease.Result{})
	wantErr(t, "complete by another worker", err, lease.ErrLeaseLost)
}

func testArtifacts(t *testing.T, f *fixture) {
	w := f.defaultWorker("w")
	j1 := f.enqueue("lora_train")
	j2 := f.enqueue("status_check")
	_, r1 := f.leaseOne(w)
	_, r2 := f.leaseOne(w)
	f.m.Accept(f.ctx, r1)
	sum := "9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08"
	a, err := f.m.AddArtifact(f.ctx, r1, lease.Artifact{Type: "adapter", Name: "adapter.safetensors", URI: "s3://b/a", SHA256: sum, SizeBytes: 123, Metadata: json.RawMessage(`{"rank":8}`), ReceiptID: "rcp_x"})
	if err != nil || a.ID == "" || a.JobID != j1.ID || a.WorkerID != w.ID || a.Epoch != 1 {
		t.Fatalf("AddArtifact = %+v, %v", a, err)
	}
	if _, err := f.m.AddArtifact(f.ctx, r2, lease.Artifact{Type: "log", Name: "out.txt"}); err != nil {
		t.Fatal(err)
	}
	all, err := f.m.Artifacts(f.ctx, lease.ArtifactFilter{})
	if err != nil || len(all) != 2 {
		t.Fatalf("all artifacts: %v, %v", all, err)
	}
	got, err := f.m.Artifacts(f.ctx, lease.ArtifactFilter{JobID: j1.ID})
	if err != nil || len(got) != 1 {
		t.Fatalf("by job: %v, %v", got, err)
	}
	if d := cmp.Diff(a, got[0]); d != "" {
		t.Fatalf("stored artifact (-added +stored):\n%s", d)
	}
	if got, _ := f.m.Artifacts(f.ctx, lease.ArtifactFilter{Type: "log"}); len(got) != 1 || got[0].JobID != j2.ID {
		t.Fatalf("by type: %v", got)
	}
	if got, _ := f.m.Artifacts(f.ctx, lease.ArtifactFilter{After: all[0].ID}); len(got) != 1 || got[0].ID != all[1].ID {
		t.Fatalf("after: %v", got)
	}
	bad := []lease.Artifact{
		{Name: "no type"},
		{Type: "adapter"},
		{Type: "adapter", Name: "x", SHA256: "ABC"},
		{Type: "adapter", Name: "x", SHA256: "9F86D081884C7D659A2FEAA0C55AD015A3BF4F1B2B0B822CD15D6C15B0F00A08"},
		{Type: "adapter", Name: "x", SizeBytes: -1},
		{Type: "adapter", Name: "x", Metadata: json.RawMessage(`[`)},
	}
	for _, b := range bad {
		_, err := f.m.AddArtifact(f.ctx, r1, b)
		wantErr(t, fmt.Sprintf("artifact %+v", b), err, lease.ErrInvalidArgument)
	}
}

func testSentinels(t *testing.T, f *fixture) {
	w := f.defaultWorker("w")
	j := f.enqueue("status_check")
	_, ref := f.leaseOne(w)
	_, err := f.m.Get(f.ctx, "job_missing")
	wantErr(t, "get unknown", err, lease.ErrNotFound)
	_, err = f.m.Accept(f.ctx, lease.Ref{JobID: "job_missing", WorkerID: w.ID, Token: ref.Token})
	wantErr(t, "accept unknown job", err, lease.ErrNotFound)
	malformed := map[string]string{
		"empty":         "",
		"wrong prefix":  "nlc_" + ref.Token[4:],
		"bad checksum":  ref.Token[:len(ref.Token)-1] + flip(ref.Token[len(ref.Token)-1]),
		"bad body":      ref.Token[:10] + flip(ref.Token[10]) + ref.Token[11:],
		"short":         ref.Token[:len(ref.Token)-1],
		"long":          ref.Token + "0",
		"not base62":    ref.Token[:10] + "-" + ref.Token[11:],
		"trailing line": ref.Token[:len(ref.Token)-1] + "\n",
	}
	for name, tok := range malformed {
		_, err := f.m.Accept(f.ctx, lease.Ref{JobID: j.ID, WorkerID: w.ID, Token: tok})
		wantErr(t, name, err, lease.ErrMalformedToken)
	}
	f.state(j.ID, lease.StateLeased)
	badJobs := []lease.NewJob{
		{},
		{Type: string(make([]byte, 129))},
		{Type: "x", MaxAttempts: -1},
		{Type: "x", MaxAttempts: 101},
		{Type: "x", Requirements: lease.Requirements{GPUCount: -1}},
		{Type: "x", Payload: json.RawMessage(`{"a":`)},
	}
	for i, nj := range badJobs {
		_, err := f.m.Enqueue(f.ctx, nj)
		wantErr(t, fmt.Sprintf("bad job %d", i), err, lease.ErrInvalidArgument)
	}
	dup := f.enqueue("status_check")
	_, err = f.m.Enqueue(f.ctx, lease.NewJob{ID: dup.ID, Type: "status_check"})
	wantErr(t, "duplicate id", err, lease.ErrConflict)
	_, _, err = f.m.List(f.ctx, lease.JobFilter{State: "bogus"})
	wantErr(t, "list bogus state", err, lease.ErrInvalidArgument)
}

func flip(c byte) string {
	if c == 'A' {
		return "B"
	}
	return "A"
}

func testTimestamps(t *testing.T, f *fixture) {
	w := f.defaultWorker("w")
	j := f.enqueue("status_check", func(nj *lease.NewJob) { nj.ScheduledAt = epoch.Add(time.Nanosecond * 1500) })
	for _, ts := range []time.Time{j.CreatedAt, j.ScheduledAt} {
		if ts.Nanosecond()%1000 != 0 || ts.Location() != time.UTC {
			t.Fatalf("time %v is not UTC microseconds", ts)
		}
	}
	f.same(j)
	lj, ref := f.leaseOne(w)
	f.same(lj)
	aj, _ := f.m.Accept(f.ctx, ref)
	f.same(aj)
	fj, _ := f.m.Fail(f.ctx, ref, lease.Failure{Code: "c", Retryable: true})
	f.same(fj)
	if !fj.LastError.At.Equal(f.clock.Now().UTC().Truncate(time.Microsecond)) {
		t.Fatalf("last error at %v", fj.LastError.At)
	}
	w2, err := f.m.Worker(f.ctx, w.ID)
	if err != nil || !w2.RegisteredAt.Equal(w.RegisteredAt) || w2.RegisteredAt.Nanosecond()%1000 != 0 {
		t.Fatalf("worker times: %+v, %v", w2, err)
	}
}

func testList(t *testing.T, f *fixture) {
	w := f.defaultWorker("w")
	var ids []string
	for i := range 7 {
		typ := "status_check"
		if i%2 == 1 {
			typ = "lora_train"
		}
		ids = append(ids, f.enqueue(typ).ID)
	}
	f.leaseOne(w)
	var got []string
	after := ""
	for pages := 0; ; pages++ {
		jobs, next, err := f.m.List(f.ctx, lease.JobFilter{After: after, Limit: 3})
		if err != nil || pages > 5 {
			t.Fatal(err, pages)
		}
		for _, j := range jobs {
			got = append(got, j.ID)
		}
		if next == "" {
			break
		}
		after = next
	}
	if d := cmp.Diff(ids, got); d != "" {
		t.Fatalf("paged list (-want +got):\n%s", d)
	}
	count := func(f2 lease.JobFilter) int {
		jobs, _, err := f.m.List(f.ctx, f2)
		if err != nil {
			t.Fatal(err)
		}
		return len(jobs)
	}
	if n := count(lease.JobFilter{Type: "lora_train"}); n != 3 {
		t.Errorf("lora_train jobs = %d", n)
	}
	if n := count(lease.JobFilter{State: lease.StateLeased}); n != 1 {
		t.Errorf("leased jobs = %d", n)
	}
	if n := count(lease.JobFilter{State: lease.StateQueued, Type: "status_check"}); n != 3 {
		t.Errorf("queued status_check = %d", n)
	}
	if n := count(lease.JobFilter{WorkerID: w.ID}); n != 1 {
		t.Errorf("jobs of the worker = %d", n)
	}
}

func testWorkers(t *testing.T, f *fixture) {
	w := f.worker("node-a", []lease.GPU{{SKU: "rtx-4090", VRAMMB: 24576}}, []string{"status_check"}, lease.Governor{MaxJobs: 2, MaxVRAMMB: 20000})
	f.clock.Advance(time.Minute)
	w.Tags = []string{"lab"}
	w2, err := f.m.RegisterWorker(f.ctx, w)
	if err != nil || w2.ID != w.ID || !w2.RegisteredAt.Equal(w.RegisteredAt) || !w2.LastSeenAt.After(w.LastSeenAt) {
		t.Fatalf("re-register = %+v, %v", w2, err)
	}
	got, err := f.m.WorkerByNode(f.ctx, "node-a")
	if err != nil {
		t.Fatal(err)
	}
	if d := cmp.Diff(w2, got, cmpopts.EquateEmpty()); d != "" {
		t.Fatalf("stored worker (-put +got):\n%s", d)
	}
	hb, err := f.m.Heartbeat(f.ctx, w.ID, "busy", json.RawMessage(`{"gpu_util":0.93}`))
	if err != nil || hb.Status != "busy" || string(hb.Metrics) != `{"gpu_util":0.93}` {
		t.Fatalf("Heartbeat = %+v, %v", hb, err)
	}
	if got, _ := f.m.Worker(f.ctx, w.ID); string(got.Metrics) != `{"gpu_util":0.93}` {
		t.Fatalf("metrics not stored: %s", got.Metrics)
	}
	_, err = f.m.RegisterWorker(f.ctx, &lease.Worker{NodeID: "node-a"})
	wantErr(t, "a second worker for the node", err, lease.ErrConflict)
	_, err = f.m.RegisterWorker(f.ctx, &lease.Worker{})
	wantErr(t, "no node id", err, lease.ErrInvalidArgument)
	_, err = f.m.WorkerByNode(f.ctx, "node-z")
	wantErr(t, "unknown node", err, lease.ErrNotFound)
	_, err = f.m.Heartbeat(f.ctx, "wrk_missing", "idle", nil)
	wantErr(t, "heartbeat unknown", err, lease.ErrNotFound)
	b := f.worker("node-b", nil, nil, lease.Governor{})
	list, err := f.m.Workers(f.ctx, "", 10)
	if err != nil || len(list) != 2 {
		t.Fatalf("Workers = %v, %v", list, err)
	}
	if list, _ := f.m.Workers(f.ctx, list[0].ID, 10); len(list) != 1 || (list[0].ID != b.ID && list[0].ID != w.ID) {
		t.Fatalf("Workers after: %v", list)
	}
}

// 32 goroutines, each its own worker, lease 2,000 jobs: every job is
// leased exactly once, and none is lost.
func testConcurrentLeasing(t *testing.T, f *fixture) {
	const jobs, claimers = 2000, 32
	want := map[string]bool{}
	for range jobs {
		j, err := f.m.Enqueue(f.ctx, lease.NewJob{Type: "status_check"})
		if err != nil {
			t.Fatal(err)
		}
		want[j.ID] = true
	}
	var (
		mu     sync.Mutex
		leased = map[string]int{}
		wg     sync.WaitGroup
		errs   = make(chan error, claimers)
	)
	for c := range claimers {
		w := f.worker(fmt.Sprintf("claimer-%02d", c), nil, []string{"status_check"}, lease.Governor{MaxJobs: 8})
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				gs, err := f.m.Lease(f.ctx, lease.LeaseRequest{WorkerID: w.ID, MaxJobs: 1 + c%4})
				if err != nil {
					errs <- err
					return
				}
				if len(gs) == 0 {
					return
				}
				for _, g := range gs {
					mu.Lock()
					leased[g.Job.ID]++
					mu.Unlock()
					ref := lease.Ref{JobID: g.Job.ID, WorkerID: w.ID, Token: g.Token}
					if _, err := f.m.Accept(f.ctx, ref); err != nil {
						errs <- fmt.Errorf("accept %s: %w", g.Job.ID, err)
						return
					}
					if _, _, err := f.m.Complete(f.ctx, ref, lease.Result{}); err != nil {
						errs <- fmt.Errorf("complete %s: %w", g.Job.ID, err)
						return
					}
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	for id, n := range leased {
		if n != 1 || !want[id] {
			t.Errorf("job %s leased %d times (known %v)", id, n, want[id])
		}
	}
	if len(leased) != jobs {
		t.Errorf("leased %d distinct jobs, want %d", len(leased), jobs)
	}
	done, _, err := f.m.List(f.ctx, lease.JobFilter{State: lease.StateSucceeded, Limit: 1000})
	if err != nil {
		t.Fatal(err)
	}
	total := len(done)
	for len(done) == 1000 {
		if done, _, err = f.m.List(f.ctx, lease.JobFilter{State: lease.StateSucceeded, After: done[len(done)-1].ID, Limit: 1000}); err != nil {
			t.Fatal(err)
		}
		total += len(done)
	}
	if total != jobs {
		t.Errorf("%d jobs succeeded, want %d", total, jobs)
	}
}

// Many goroutines leasing for one worker never exceed its governor.
func testConcurrentGovernor(t *testing.T, f *fixture) {
	w := f.worker("one", nil, []string{"status_check"}, lease.Governor{MaxJobs: 3})
	for range 40 {
		f.enqueue("status_check")
	}
	var wg sync.WaitGroup
	var mu sync.Mutex
	total := 0
	for range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			gs, err := f.m.Lease(f.ctx, lease.LeaseRequest{WorkerID: w.ID, MaxJobs: 2})
			if err != nil {
				t.Error(err)
			}
			mu.Lock()
			total += len(gs)
			mu.Unlock()
		}()
	}
	wg.Wait()
	if total != 3 {
		t.Fatalf("8 concurrent leases for a worker with max_jobs 3 granted %d", total)
	}
	live, _, _ := f.m.List(f.ctx, lease.JobFilter{WorkerID: w.ID})
	if len(live) != 3 {
		t.Fatalf("the worker holds %d live leases", len(live))
	}
}

// UpdateJob writes only at the revision it was given.
func testUpdateRevision(t *testing.T, f *fixture) {
	j := f.enqueue("status_check")
	cur := f.get(j.ID)
	next := *cur
	next.Priority = 42
	next.Rev = cur.Rev + 1
	if err := f.store.UpdateJob(f.ctx, &next, cur.Rev); err != nil {
		t.Fatalf("UpdateJob at the current rev: %v", err)
	}
	stale := *cur
	stale.Priority = 7
	stale.Rev = cur.Rev + 1
	wantErr(t, "UpdateJob at a stale rev", f.store.UpdateJob(f.ctx, &stale, cur.Rev), lease.ErrConflict)
	if got := f.get(j.ID); got.Priority != 42 || got.Rev != next.Rev {
		t.Fatalf("after a stale write: priority %d rev %d", got.Priority, got.Rev)
	}
	missing := next
	missing.ID = "job_missing"
	wantErr(t, "UpdateJob of a missing job", f.store.UpdateJob(f.ctx, &missing, next.Rev), lease.ErrNotFound)
}

// Concurrent writes under one lease: exactly one release wins, and the
// losers see ErrLeaseLost, never a second transition.
func testConcurrentRelease(t *testing.T, f *fixture) {
	w := f.defaultWorker("w")
	for round := range 5 {
		j := f.enqueue("status_check")
		_, ref := f.leaseOne(w)
		f.m.Accept(f.ctx, ref)
		const n = 16
		var wg sync.WaitGroup
		errs := make([]error, n)
		for i := range n {
			wg.Add(1)
			go func() {
				defer wg.Done()
				if i%2 == 0 {
					_, errs[i] = f.m.Release(f.ctx, ref, "race")
				} else {
					_, errs[i] = f.m.Fail(f.ctx, ref, lease.Failure{Code: "race", Retryable: true})
				}
			}()
		}
		wg.Wait()
		wins := 0
		for _, err := range errs {
			switch {
			case err == nil:
				wins++
			case !errors.Is(err, lease.ErrLeaseLost):
				t.Fatalf("round %d: %v", round, err)
			}
		}
		if wins != 1 {
			t.Fatalf("round %d: %d concurrent writes under one lease succeeded, want 1", round, wins)
		}
		got := f.state(j.ID, lease.StateQueued)
		if got.Attempt != 1 && got.Attempt != 2 {
			t.Fatalf("round %d: attempt %d", round, got.Attempt)
		}
		f.m.Cancel(f.ctx, j.ID)
	}
}

// Touch extends the worker's own live leases and reports the rest lost.
func testTouch(t *testing.T, f *fixture) {
	a := f.defaultWorker("a")
	b := f.defaultWorker("b")
	f.enqueue("status_check")
	f.enqueue("status_check")
	f.enqueue("status_check")
	ja, ra := f.leaseOne(a)
	f.m.Accept(f.ctx, ra)
	jpending, _ := f.leaseOne(a)
	jb, _ := f.leaseOne(b)
	queued := f.enqueue("status_check")
	f.m.Cancel(f.ctx, ja.ID)
	f.clock.Advance(10 * time.Second)
	now := f.clock.Now().UTC().Truncate(time.Microsecond)
	got, err := f.m.Touch(f.ctx, a.ID, []string{ja.ID, jpending.ID, jb.ID, queued.ID, "job_missing", ja.ID})
	if err != nil {
		t.Fatal(err)
	}
	if len(got.Leases) != 2 || got.Leases[0].ID != ja.ID || got.Leases[1].ID != jpending.ID {
		t.Fatalf("extended %v", got.Leases)
	}
	for _, j := range got.Leases {
		if !j.Lease.ExpiresAt.Equal(now.Add(ttl)) {
			t.Fatalf("job %s expires at %v, want %v", j.ID, j.Lease.ExpiresAt, now.Add(ttl))
		}
		f.same(j)
	}
	if d := cmp.Diff([]string{jb.ID, queued.ID, "job_missing"}, got.Lost); d != "" {
		t.Fatalf("lost (-want +got):\n%s", d)
	}
	if d := cmp.Diff([]string{ja.ID}, got.Cancel); d != "" {
		t.Fatalf("cancel (-want +got):\n%s", d)
	}
	// Past the accept deadline the unaccepted lease is lost, even unswept.
	f.clock.Advance(acceptTTL)
	got, err = f.m.Touch(f.ctx, a.ID, []string{jpending.ID, ja.ID})
	if err != nil || len(got.Leases) != 1 || got.Leases[0].ID != ja.ID || len(got.Lost) != 1 || got.Lost[0] != jpending.ID {
		t.Fatalf("after the accept deadline: %+v, %v", got, err)
	}
}
