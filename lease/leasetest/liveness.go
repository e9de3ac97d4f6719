package leasetest

import (
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/nodelane/nodelane/lease"
)

var livenessTests = []test{
	{"Transitions", testLivenessTransitions},
	{"ExpireOffline", testExpireOffline},
	{"ExpireOfflineRecentLease", testExpireOfflineRecentLease},
	{"ExpireOfflineCanceled", testExpireOfflineCanceled},
	{"ExpireOfflineBatches", testExpireOfflineBatches},
	{"ExplainOffline", testExplainOffline},
	{"OfflineJobsCutoff", testOfflineJobsCutoff},
}

// The fixture's Manager has the default heartbeat interval (30 s) and
// OfflineAfter (90 s).
const (
	hbInterval   = lease.DefaultHeartbeatInterval
	offlineAfter = 3 * hbInterval
)

func (f *fixture) liveness(id string) lease.Liveness {
	f.t.Helper()
	w, err := f.m.Worker(f.ctx, id)
	if err != nil {
		f.t.Fatalf("Worker(%s): %v", id, err)
	}
	return f.m.Liveness(w)
}

func (f *fixture) beat(w *lease.Worker) {
	f.t.Helper()
	if _, err := f.m.Heartbeat(f.ctx, w.ID, "busy", nil); err != nil {
		f.t.Fatalf("Heartbeat(%s): %v", w.NodeID, err)
	}
}

func (f *fixture) expireOffline(want int) {
	f.t.Helper()
	if n, err := f.m.ExpireOffline(f.ctx); err != nil || n != want {
		f.t.Fatalf("ExpireOffline = %d, %v; want %d", n, err, want)
	}
}

func testLivenessTransitions(t *testing.T, f *fixture) {
	w := f.defaultWorker("w")
	steps := []struct {
		advance time.Duration
		want    lease.Liveness
	}{
		{0, lease.LivenessOnline},
		{hbInterval + hbInterval/2, lease.LivenessOnline},
		{time.Microsecond, lease.LivenessStale},
		{offlineAfter - hbInterval - hbInterval/2 - 2*time.Microsecond, lease.LivenessStale},
		{time.Microsecond, lease.LivenessOffline},
		{time.Hour, lease.LivenessOffline},
	}
	for i, s := range steps {
		f.clock.Advance(s.advance)
		if got := f.liveness(w.ID); got != s.want {
			t.Fatalf("step %d (+%v): liveness %s, want %s", i, s.advance, got, s.want)
		}
	}
	f.beat(w)
	if got := f.liveness(w.ID); got != lease.LivenessOnline {
		t.Fatalf("after a heartbeat: %s, want online", got)
	}
	got, err := f.m.Worker(f.ctx, w.ID)
	if err != nil {
		t.Fatal(err)
	}
	if want := f.now().Add(offlineAfter); !f.m.OfflineAt(got).Equal(want) {
		t.Fatalf("OfflineAt = %v, want %v", f.m.OfflineAt(got), want)
	}
}

// An offline worker's leases go back to the queue: a running job uses an
// attempt, a leased one does not; the old tokens are lost; a worker that
// heartbeats keeps its own.
func testExpireOffline(t *testing.T, f *fixture) {
	dead := f.defaultWorker("dead")
	alive := f.defaultWorker("alive")
	run := f.enqueue("status_check")
	held := f.enqueue("status_check")
	other := f.enqueue("status_check")
	_, runRef := f.leaseOne(dead)
	f.accept(runRef)
	_, heldRef := f.leaseOne(dead)
	_, otherRef := f.leaseOne(alive)
	f.accept(otherRef)
	if runRef.JobID != run.ID || heldRef.JobID != held.ID || otherRef.JobID != other.ID {
		t.Fatalf("leased %s, %s, %s in an unexpected order", runRef.JobID, heldRef.JobID, otherRef.JobID)
	}
	f.clock.Advance(acceptTTL / 2)
	f.accept(heldRef) // accepted later than run: its own cutoff
	f.clock.Advance(offlineAfter - acceptTTL/2 - time.Microsecond)
	f.beat(alive)
	f.expireOffline(0) // the dead worker is stale still
	f.clock.Advance(time.Microsecond)
	// run was accepted OfflineAfter ago; held only OfflineAfter - 30 s ago.
	f.expireOffline(1)
	q := f.state(run.ID, lease.StateQueued)
	if q.Attempt != 2 || q.LastError == nil || q.LastError.Code != lease.CodeWorkerOffline || q.LastError.Attempt != 1 {
		t.Fatalf("after the worker went offline: attempt %d, last error %+v", q.Attempt, q.LastError)
	}
	if d := q.ScheduledAt.Sub(f.now()); d < retryBase/2 || d > retryBase {
		t.Fatalf("backoff = %v, want [%v, %v]", d, retryBase/2, retryBase)
	}
	f.state(held.ID, lease.StateRunning)
	f.clock.Advance(acceptTTL / 2)
	f.beat(alive)
	f.expireOffline(1)
	h := f.state(held.ID, lease.StateQueued)
	if h.Attempt != 2 || h.LastError.Code != lease.CodeWorkerOffline {
		t.Fatalf("held: attempt %d, last error %+v", h.Attempt, h.LastError)
	}
	f.expireOffline(0)
	f.state(other.ID, lease.StateRunning)
	for _, ref := range []lease.Ref{runRef, heldRef} {
		_, err := f.m.Extend(f.ctx, ref)
		wantErr(t, "extend with the old token", err, lease.ErrLeaseLost)
		_, _, err = f.m.Complete(f.ctx, ref, lease.Result{})
		wantErr(t, "complete with the old token", err, lease.ErrLeaseLost)
	}
	touched, err := f.m.Touch(f.ctx, dead.ID, []string{run.ID, held.ID})
	if err != nil || len(touched.Lost) != 2 || len(touched.Leases) != 0 {
		t.Fatalf("Touch by the worker that came back = %+v, %v", touched, err)
	}
	f.clock.Advance(retryBase)
	f.beat(alive)
	lj, ref := f.leaseOne(alive)
	if lj.Lease.Epoch != 2 {
		t.Fatalf("re-leased %s at epoch %d, want 2", lj.ID, lj.Lease.Epoch)
	}
	f.accept(ref)
}

// A lease granted since the cutoff keeps its job, whenever the worker last
// heartbeat: leasing shows it alive. A leased job that was never accepted
// uses no attempt.
func testExpireOfflineRecentLease(t *testing.T, f *fixture) {
	w := f.defaultWorker("w")
	j := f.enqueue("status_check")
	f.clock.Advance(2 * offlineAfter)
	if got := f.liveness(w.ID); got != lease.LivenessOffline {
		t.Fatalf("liveness %s, want offline", got)
	}
	_, ref := f.leaseOne(w)
	f.clock.Advance(offlineAfter - time.Microsecond)
	f.expireOffline(0)
	f.clock.Advance(time.Microsecond)
	// The accept deadline (60 s) passed already: Expire would take it too,
	// as accept_timeout; ExpireOffline runs first here.
	f.expireOffline(1)
	q := f.state(j.ID, lease.StateQueued)
	if q.Attempt != 1 || q.LastError.Code != lease.CodeWorkerOffline || q.ScheduledAt.After(f.now()) {
		t.Fatalf("an unaccepted lease used an attempt or a backoff: %+v", q)
	}
	_, err := f.m.Accept(f.ctx, ref)
	wantErr(t, "accept after the worker went offline", err, lease.ErrLeaseLost)
}

func testExpireOfflineCanceled(t *testing.T, f *fixture) {
	w := f.defaultWorker("w")
	j := f.enqueue("status_check")
	_, ref := f.leaseOne(w)
	f.accept(ref)
	if _, err := f.m.Cancel(f.ctx, j.ID); err != nil {
		t.Fatal(err)
	}
	f.clock.Advance(offlineAfter)
	f.expireOffline(1)
	c := f.state(j.ID, lease.StateCanceled)
	if !c.Lease.ExpiresAt.Equal(f.now()) {
		t.Fatalf("the canceled job's lease expires at %v, want now (%v)", c.Lease.ExpiresAt, f.now())
	}
	_, err := f.m.Extend(f.ctx, ref)
	wantErr(t, "extend after the cancel ended it", err, lease.ErrLeaseLost)
}

// More leases than one batch: ExpireOffline ends them all.
func testExpireOfflineBatches(t *testing.T, f *fixture) {
	const workers, each = 5, 16 // 80 leases, over a batch of 64
	var ids []string
	for i := range workers {
		w := f.worker(fmt.Sprintf("w%d", i), nil, []string{"status_check"}, lease.Governor{MaxJobs: each})
		for range each {
			ids = append(ids, f.enqueue("status_check").ID)
		}
		if gs := f.lease(w, each); len(gs) != each {
			t.Fatalf("worker %d leased %d, want %d", i, len(gs), each)
		}
	}
	f.clock.Advance(offlineAfter)
	f.expireOffline(workers * each)
	for _, id := range ids {
		f.state(id, lease.StateQueued)
	}
}

// Explain counts an offline worker out: "no online worker matches".
func testExplainOffline(t *testing.T, f *fixture) {
	w := f.defaultWorker("w")
	j := f.enqueue("status_check")
	f.clock.Advance(offlineAfter)
	ex := f.explain(j.ID, &lease.ExplainOptions{AllWorkers: true})
	if ex.Leasable || len(ex.Reasons) != 1 || ex.Reasons[0].Code != lease.ReasonWorkerOffline {
		t.Fatalf("only worker offline: leasable %v, reasons %v", ex.Leasable, ex.Reasons)
	}
	if v := verdict(t, ex, w); !v.Matches || !v.Offline || v.Available {
		t.Fatalf("verdict %+v", v)
	}
	f.beat(w)
	f.clock.Advance(2 * time.Second) // past the cached worker list
	if ex := f.explain(j.ID, nil); !ex.Leasable {
		t.Fatalf("after a heartbeat: not leasable: %v", ex.Reasons)
	}
	// A stale worker still counts.
	f.clock.Advance(offlineAfter - 4*time.Second)
	if got := f.liveness(w.ID); got != lease.LivenessStale {
		t.Fatalf("liveness %s, want stale", got)
	}
	if ex := f.explain(j.ID, nil); !ex.Leasable {
		t.Fatalf("stale worker: not leasable: %v", ex.Reasons)
	}
}

// Store.OfflineJobs filters on both sides of its cutoff, inclusively: the
// worker's LastSeenAt, and the lease's AcceptedAt, else its LeasedAt,
// each at or before cutoff. ExpireOffline re-checks every job it ends, so
// its own tests pass on a store that ignores the cutoff; but such a store
// fills each batch with jobs that ExpireOffline then skips, and a full
// batch of them, none ended, stops it before it reaches an offline one.
func testOfflineJobsCutoff(t *testing.T, f *fixture) {
	old := f.defaultWorker("old")     // last seen at S, never again
	beats := f.defaultWorker("beats") // last seen at B, after every lease
	acc, held, other := f.enqueue("status_check"), f.enqueue("status_check"), f.enqueue("status_check")
	f.clock.Advance(time.Second)
	_, accRef := f.leaseOne(old) // leased at L0
	f.clock.Advance(time.Second)
	_, heldRef := f.leaseOne(old) // leased at L, never accepted
	_, otherRef := f.leaseOne(beats)
	f.accept(otherRef) // accepted at L
	f.clock.Advance(time.Second)
	f.accept(accRef) // accepted at A
	f.clock.Advance(time.Second)
	f.beat(beats) // seen at B
	if accRef.JobID != acc.ID || heldRef.JobID != held.ID || otherRef.JobID != other.ID {
		t.Fatalf("leased %s, %s, %s in an unexpected order", accRef.JobID, heldRef.JobID, otherRef.JobID)
	}

	// The times as stored.
	seen := func(w *lease.Worker) time.Time {
		t.Helper()
		got, err := f.store.GetWorker(f.ctx, w.ID)
		if err != nil {
			t.Fatalf("GetWorker(%s): %v", w.NodeID, err)
		}
		return got.LastSeenAt
	}
	S, B := seen(old), seen(beats)
	L0, L := *f.get(acc.ID).LeasedAt, *f.get(held.ID).LeasedAt
	A := *f.get(acc.ID).AcceptedAt
	if !(S.Before(L0) && L0.Before(L) && L.Before(A) && A.Before(B)) || !f.get(other.ID).AcceptedAt.Equal(L) {
		t.Fatalf("stored times out of the test's order: seen %v, leased %v and %v, accepted %v, seen again %v", S, L0, L, A, B)
	}

	const us = time.Microsecond
	for _, c := range []struct {
		name   string
		cutoff time.Time
		want   []*lease.Job
	}{
		{"before the worker was last seen", S.Add(-us), nil},
		{"when the worker was last seen, before its leases", S, nil},
		// acc was leased at L0, but accepted later: its time is A.
		{"when acc was leased", L0, nil},
		{"just before held was leased", L.Add(-us), nil},
		{"when held was leased", L, []*lease.Job{held}},
		{"just before acc was accepted", A.Add(-us), []*lease.Job{held}},
		{"when acc was accepted", A, []*lease.Job{held, acc}},
		// other was accepted at L, but its worker was seen at B.
		{"just before beats was last seen", B.Add(-us), []*lease.Job{held, acc}},
		{"when beats was last seen", B, []*lease.Job{held, acc, other}},
		{"an hour later", B.Add(time.Hour), []*lease.Job{held, acc, other}},
	} {
		js, err := f.store.OfflineJobs(f.ctx, c.cutoff, 100)
		if err != nil {
			t.Fatalf("OfflineJobs(%s): %v", c.name, err)
		}
		var got, want []string
		for _, j := range js {
			got = append(got, j.ID)
		}
		for _, j := range c.want {
			want = append(want, j.ID)
		}
		slices.Sort(want)
		if !slices.Equal(got, want) {
			t.Errorf("OfflineJobs with the cutoff %s = %q, want %q (acc %s, held %s, other %s)", c.name, got, want, acc.ID, held.ID, other.ID)
		}
	}
}
