package leasetest

import (
	"context"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"

	"github.com/nodelane/nodelane/lease"
)

// reconcileTests check Manager.Reconcile (a worker that restarted, or
// heartbeats, ends the leases it no longer holds) and exact approvals (a
// worker's widening waits for an operator while what was approved keeps
// working).
var reconcileTests = []test{
	{"Restarted", testReconcileRestarted},
	{"CanceledAndOutOfAttempts", testReconcileCanceledAndOutOfAttempts},
	{"GrantedThrough", testReconcileGrantedThrough},
	{"Arguments", testReconcileArguments},
	{"ExactApproval", testExactApproval},
	{"StoreKeepsExactApproval", testStoreKeepsExactApproval},
}

// expiredLog records the jobs Config.Expired was called with.
type expiredLog struct {
	mu   sync.Mutex
	jobs []*lease.Job
}

func (l *expiredLog) add(_ context.Context, j *lease.Job) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.jobs = append(l.jobs, j)
}

func (l *expiredLog) ids() []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	var out []string
	for _, j := range l.jobs {
		out = append(out, j.ID)
	}
	slices.Sort(out)
	return out
}

func (f *fixture) reconcile(r lease.Reconciliation) []string {
	f.t.Helper()
	ended, err := f.m.Reconcile(f.ctx, r)
	if err != nil {
		f.t.Fatalf("Reconcile(%+v): %v", r, err)
	}
	var ids []string
	for _, j := range ended {
		ids = append(ids, j.ID)
	}
	return ids
}

// A worker that restarted holding one of its three jobs: the running
// job it lost goes back to the queue using an attempt (with a backoff),
// the leased one without; the held one and another worker's stay; the
// old tokens are lost; Config.Expired hears of each job ended.
func testReconcileRestarted(t *testing.T, f *fixture) {
	var log expiredLog
	f = f.withConfig(t, func(c *lease.Config) { c.Expired = log.add })
	w := f.defaultWorker("w")
	other := f.defaultWorker("other")
	run, leased, kept, theirs := f.enqueue("status_check"), f.enqueue("status_check"), f.enqueue("status_check"), f.enqueue("status_check")
	_, runRef := f.leaseOne(w)
	f.accept(runRef)
	_, leasedRef := f.leaseOne(w)
	_, keptRef := f.leaseOne(w)
	f.accept(keptRef)
	_, theirRef := f.leaseOne(other)
	if runRef.JobID != run.ID || leasedRef.JobID != leased.ID || keptRef.JobID != kept.ID || theirRef.JobID != theirs.ID {
		t.Fatal("leased in an unexpected order")
	}
	got := f.reconcile(lease.Reconciliation{WorkerID: w.ID, Held: []string{kept.ID, "job_unknown"}, Code: lease.CodeWorkerRestarted})
	if want := []string{run.ID, leased.ID}; !cmp.Equal(got, want) {
		t.Fatalf("ended %v, want %v", got, want)
	}
	if d := cmp.Diff([]string{run.ID, leased.ID}, log.ids()); d != "" {
		t.Errorf("Expired calls (-want +got):\n%s", d)
	}
	q := f.state(run.ID, lease.StateQueued)
	if q.Attempt != 2 || q.LastError == nil || q.LastError.Code != lease.CodeWorkerRestarted || q.LastError.Attempt != 1 {
		t.Fatalf("the running job: attempt %d, last error %+v", q.Attempt, q.LastError)
	}
	if d := q.ScheduledAt.Sub(f.now()); d < retryBase/2 || d > retryBase {
		t.Fatalf("backoff = %v, want [%v, %v]", d, retryBase/2, retryBase)
	}
	l := f.state(leased.ID, lease.StateQueued)
	if l.Attempt != 1 || l.LastError.Code != lease.CodeWorkerRestarted || l.ScheduledAt.After(f.now()) {
		t.Fatalf("the leased job used an attempt or a backoff: %+v", l)
	}
	f.state(kept.ID, lease.StateRunning)
	f.state(theirs.ID, lease.StateLeased)
	_, err := f.m.Accept(f.ctx, leasedRef)
	wantErr(t, "accept after the restart", err, lease.ErrLeaseLost)
	_, _, err = f.m.Complete(f.ctx, runRef, lease.Result{})
	wantErr(t, "complete after the restart", err, lease.ErrLeaseLost)
	f.complete(keptRef, lease.Result{})
	// Nothing left to end: a second reconciliation ends nothing.
	if got := f.reconcile(lease.Reconciliation{WorkerID: w.ID, Code: lease.CodeWorkerRestarted}); len(got) != 0 {
		t.Fatalf("second reconciliation ended %v", got)
	}
	// The leased job is leasable again at once, under a new epoch.
	j, _ := f.leaseOne(other)
	if j.ID != leased.ID || j.Lease.Epoch != 2 {
		t.Fatalf("re-leased %s at epoch %d, want %s at 2", j.ID, j.Lease.Epoch, leased.ID)
	}
}

// A job whose cancel was requested ends canceled; a running job out of
// attempts ends failed.
func testReconcileCanceledAndOutOfAttempts(t *testing.T, f *fixture) {
	w := f.defaultWorker("w")
	canceled := f.enqueue("status_check")
	last := f.enqueue("status_check", func(nj *lease.NewJob) { nj.MaxAttempts = 1 })
	_, cRef := f.leaseOne(w)
	f.accept(cRef)
	f.cancel(canceled.ID)
	_, lRef := f.leaseOne(w)
	f.accept(lRef)
	if got := f.reconcile(lease.Reconciliation{WorkerID: w.ID, Code: lease.CodeWorkerRestarted}); len(got) != 2 {
		t.Fatalf("ended %v, want both", got)
	}
	c := f.state(canceled.ID, lease.StateCanceled)
	if c.FinishedAt == nil || !c.Lease.ExpiresAt.Equal(f.now()) {
		t.Fatalf("canceled job: finished %v, lease expires %v", c.FinishedAt, c.Lease.ExpiresAt)
	}
	l := f.state(last.ID, lease.StateFailed)
	if l.LastError == nil || l.LastError.Code != lease.CodeWorkerRestarted {
		t.Fatalf("failed job's last error %+v", l.LastError)
	}
}

// A heartbeat's reconciliation spares a lease granted after the time the
// worker last heard from the lease route: at or before it, a job not
// listed is ended (not_held); later, it is kept.
func testReconcileGrantedThrough(t *testing.T, f *fixture) {
	w := f.defaultWorker("w")
	early, late := f.enqueue("status_check"), f.enqueue("status_check")
	_, eRef := f.leaseOne(w)
	through := f.now() // the answer that granted early
	f.clock.Advance(time.Millisecond)
	_, lRef := f.leaseOne(w) // granted after the worker's newest answer
	if eRef.JobID != early.ID || lRef.JobID != late.ID {
		t.Fatal("leased in an unexpected order")
	}
	// Before through: nothing granted then, nothing ended.
	if got := f.reconcile(lease.Reconciliation{WorkerID: w.ID, GrantedThrough: through.Add(-time.Microsecond), Code: lease.CodeNotHeld}); len(got) != 0 {
		t.Fatalf("ended %v before any grant", got)
	}
	got := f.reconcile(lease.Reconciliation{WorkerID: w.ID, GrantedThrough: through, Code: lease.CodeNotHeld})
	if !cmp.Equal(got, []string{early.ID}) {
		t.Fatalf("ended %v, want only %s (granted at leases_through)", got, early.ID)
	}
	e := f.state(early.ID, lease.StateQueued)
	if e.LastError == nil || e.LastError.Code != lease.CodeNotHeld || e.Attempt != 1 {
		t.Fatalf("early: %+v", e)
	}
	f.state(late.ID, lease.StateLeased)
	f.accept(lRef)
	// Once the worker heard of it, a heartbeat that lists it keeps it.
	if got := f.reconcile(lease.Reconciliation{WorkerID: w.ID, Held: []string{late.ID}, GrantedThrough: f.now(), Code: lease.CodeNotHeld}); len(got) != 0 {
		t.Fatalf("ended %v although held", got)
	}
	f.state(late.ID, lease.StateRunning)
}

func testReconcileArguments(t *testing.T, f *fixture) {
	for _, r := range []lease.Reconciliation{
		{Code: lease.CodeNotHeld},
		{WorkerID: "w"},
		{WorkerID: "w", Code: string(make([]byte, 129))},
	} {
		_, err := f.m.Reconcile(f.ctx, r)
		wantErr(t, "Reconcile with a missing argument", err, lease.ErrInvalidArgument)
	}
	// An unknown worker holds nothing.
	if got := f.reconcile(lease.Reconciliation{WorkerID: "wrk_nobody", Code: lease.CodeNotHeld}); len(got) != 0 {
		t.Fatalf("ended %v of an unknown worker", got)
	}
}

// An exact approval that pins nothing covers the types and tags the
// worker had when it was approved: a type or tag it registers later is
// pending and not granted, while the approved ones keep working, until
// an operator approves again.
func testExactApproval(t *testing.T, f *fixture) {
	w, err := f.m.RegisterWorker(f.ctx, &lease.Worker{
		NodeID: "p", Capabilities: lease.Capabilities{JobTypes: []string{"status_check"}}, Tags: []string{"lab"},
		Governor: lease.Governor{MaxJobs: 4}, Approval: lease.Approval{Pending: true},
	})
	if err != nil {
		t.Fatal(err)
	}
	types, tags := w.PendingApproval()
	if !cmp.Equal(types, []string{"status_check"}) || !cmp.Equal(tags, []string{"lab"}) {
		t.Fatalf("pending worker: pending %v %v, want all", types, tags)
	}
	w, changed := f.approve(w, lease.Approval{Exact: true, By: "op"})
	if !changed || !w.Approval.Exact || !cmp.Equal(w.Approval.JobTypes, []string{"status_check"}) || !cmp.Equal(w.Approval.Tags, []string{"lab"}) {
		t.Fatalf("exact approval = %+v, changed %v", w.Approval, changed)
	}
	if types, tags := w.PendingApproval(); len(types)+len(tags) != 0 {
		t.Fatalf("approved worker: pending %v %v", types, tags)
	}
	// The worker restarts with a new type and a new tag.
	w.Capabilities.JobTypes = []string{"status_check", "lora_train"}
	w.Tags = []string{"lab", "gpu-pool"}
	if w, err = f.m.RegisterWorker(f.ctx, w); err != nil {
		t.Fatal(err)
	}
	types, tags = w.PendingApproval()
	if !cmp.Equal(types, []string{"lora_train"}) || !cmp.Equal(tags, []string{"gpu-pool"}) {
		t.Fatalf("after a widening: pending %v %v", types, tags)
	}
	if got := w.EffectiveTags(); !cmp.Equal(got, []string{"lab"}) {
		t.Fatalf("effective tags %v, want [lab]", got)
	}
	wide := f.enqueue("lora_train")
	pooled := f.enqueue("status_check", func(nj *lease.NewJob) { nj.Requirements.Tags = []string{"gpu-pool"} })
	ok := f.enqueue("status_check", func(nj *lease.NewJob) { nj.Requirements.Tags = []string{"lab"} })
	gs := f.lease(w, 4)
	if len(gs) != 1 || gs[0].Job.ID != ok.ID {
		t.Fatalf("granted %d jobs; want only the approved %s", len(gs), ok.ID)
	}
	// The same approval again (pinning nothing) covers the widening.
	w, changed = f.approve(w, lease.Approval{Exact: true, By: "op"})
	if !changed || !cmp.Equal(w.Approval.JobTypes, []string{"lora_train", "status_check"}) {
		t.Fatalf("second approval = %+v, changed %v", w.Approval, changed)
	}
	if _, changed := f.approve(w, lease.Approval{Exact: true, By: "op"}); changed {
		t.Fatal("a third, identical approval changed something")
	}
	gs = f.lease(w, 4)
	var got []string
	for _, g := range gs {
		got = append(got, g.Job.ID)
	}
	slices.Sort(got)
	want := []string{wide.ID, pooled.ID}
	slices.Sort(want)
	if d := cmp.Diff(want, got, cmpopts.EquateEmpty()); d != "" {
		t.Fatalf("after the second approval (-want +got):\n%s", d)
	}
	// A worker without tags approved exactly approves no tag: a tag it
	// registers later is pending.
	bare, err := f.m.RegisterWorker(f.ctx, &lease.Worker{NodeID: "bare", Capabilities: lease.Capabilities{JobTypes: []string{"status_check"}}, Approval: lease.Approval{Pending: true}})
	if err != nil {
		t.Fatal(err)
	}
	bare, _ = f.approve(bare, lease.Approval{Exact: true})
	bare.Tags = []string{"new"}
	if bare, err = f.m.RegisterWorker(f.ctx, bare); err != nil {
		t.Fatal(err)
	}
	if _, tags := bare.PendingApproval(); !cmp.Equal(tags, []string{"new"}) {
		t.Fatalf("bare worker's pending tags %v", tags)
	}
	// An approval that is not exact and pins nothing allows every type
	// and tag registered later, as approvals stored before Exact do.
	loose, err := f.m.RegisterWorker(f.ctx, &lease.Worker{NodeID: "loose", Capabilities: lease.Capabilities{JobTypes: []string{"status_check"}}, Approval: lease.Approval{Pending: true}})
	if err != nil {
		t.Fatal(err)
	}
	loose, _ = f.approve(loose, lease.Approval{})
	loose.Capabilities.JobTypes = append(loose.Capabilities.JobTypes, "lora_train")
	loose.Tags = []string{"any"}
	if loose, err = f.m.RegisterWorker(f.ctx, loose); err != nil {
		t.Fatal(err)
	}
	if types, tags := loose.PendingApproval(); len(types)+len(tags) != 0 {
		t.Fatalf("a loose approval leaves %v %v pending", types, tags)
	}
}

// A store keeps Approval.Exact, and an exact approval's empty lists.
func testStoreKeepsExactApproval(t *testing.T, f *fixture) {
	w := f.pendingWorker("p", []string{"status_check"})
	at := f.now()
	want := lease.Approval{At: &at, By: "op", JobTypes: []string{"status_check"}, Exact: true}
	if err := f.store.SetApproval(f.ctx, w.ID, nil, want); err != nil {
		t.Fatal(err)
	}
	got, err := f.store.GetWorker(f.ctx, w.ID)
	if err != nil {
		t.Fatal(err)
	}
	if d := cmp.Diff(want, got.Approval, cmpopts.EquateEmpty()); d != "" {
		t.Fatalf("stored approval (-set +stored):\n%s", d)
	}
	// A PutWorker of a record read before keeps it exact.
	got.Approval = lease.Approval{}
	if err := f.store.PutWorker(f.ctx, got); err != nil {
		t.Fatal(err)
	}
	if got, err = f.store.GetWorker(f.ctx, w.ID); err != nil || !got.Approval.Exact {
		t.Fatalf("after PutWorker: %+v, %v", got.Approval, err)
	}
}
