package leasetest

import (
	"crypto/sha256"
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

var acceptCompleteTests = []test{
	{"HappyPath", testHappyPath},
	{"IllegalTransitions", testIllegalTransitions},
	{"CompleteRepeated", testCompleteRepeated},
	{"CompleteWithReceipt", testCompleteWithReceipt},
	{"CompleteAll", testCompleteAll},
	{"EnqueueAll", testEnqueueAll},
	{"Release", testRelease},
	{"ClockMovedBack", testClockMovedBack},
	{"LeaseWithAccept", testLeaseWithAccept},
	{"LeaseWithAcceptMixed", testLeaseWithAcceptMixed},
	{"GuardedWrites", testGuardedWrites},
	{"AcceptAfterCancel", testAcceptAfterCancel},
}

// The Store's guarded writes, called directly: each write applies only
// where its guard holds (the job's state, its lease's worker and token,
// live at Now), answers in the order of the writes, and of several writes
// naming one job only the first applies.
func testGuardedWrites(t *testing.T, f *fixture) {
	w := f.defaultWorker("w")
	f.enqueue("status_check")
	f.enqueue("status_check")
	a, refA := f.leaseOne(w)
	b, refB := f.leaseOne(w)
	g := func(ref lease.Ref, worker, token string) lease.Guard {
		h := sha256.Sum256([]byte(token))
		return lease.Guard{JobID: ref.JobID, WorkerID: worker, TokenHash: h[:], Now: f.now()}
	}
	acc := func(gd lease.Guard) lease.AcceptWrite {
		return lease.AcceptWrite{Guard: gd, TTL: time.Minute, MaxRuntime: time.Hour}
	}
	js, err := f.store.AcceptLeased(f.ctx, []lease.AcceptWrite{acc(g(refB, "other", refB.Token)), acc(g(refA, w.ID, refA.Token)),
		acc(g(refA, w.ID, refA.Token)), acc(g(refB, w.ID, refA.Token))})
	if err != nil || len(js) != 4 || js[0] != nil || js[1] == nil || js[2] != nil || js[3] != nil {
		t.Fatalf("AcceptLeased(another worker's, the holder's twice, another token) = %v, %v; want only the second applied", js, err)
	}
	if j := js[1]; j.State != lease.StateRunning || j.Rev != a.Rev+1 || !j.Lease.ExpiresAt.Equal(f.now().Add(time.Minute)) {
		t.Errorf("accepted job: %s rev %d expiring %v; want running, rev %d, expiring in the write's TTL", j.State, j.Rev, j.Lease.ExpiresAt, a.Rev+1)
	}
	f.same(js[1])
	f.same(b)
	com := func(gd lease.Guard) lease.CompleteWrite {
		return lease.CompleteWrite{Guard: gd, MaxRuntime: time.Hour, Result: lease.Result{OutputURI: "s3://out", ReceiptID: "rcpt"}}
	}
	late := g(refA, w.ID, refA.Token)
	late.Now = late.Now.Add(time.Minute) // the lease expired
	js, err = f.store.CompleteRunning(f.ctx, []lease.CompleteWrite{com(g(refB, w.ID, refB.Token)), com(g(refA, w.ID, refA.Token)), com(late)})
	if err != nil || len(js) != 3 || js[0] != nil || js[1] == nil || js[2] != nil {
		t.Fatalf("CompleteRunning(not running, live, expired) = %v, %v; want only the second applied", js, err)
	}
	if j := js[1]; j.State != lease.StateSucceeded || j.ReceiptID != "rcpt" || j.Result.OutputURI != "s3://out" || j.Result.ReceiptID != "" {
		t.Errorf("completed job: %s, receipt %q, result %+v; want succeeded with the receipt on the job", j.State, j.ReceiptID, j.Result)
	}
	f.same(js[1])
	f.same(b)
	late.JobID = refB.JobID
	if js, err := f.store.AcceptLeased(f.ctx, []lease.AcceptWrite{acc(late)}); err != nil || len(js) != 1 || js[0] != nil {
		t.Errorf("AcceptLeased past the lease's expiry = %v, %v; want nothing applied", js, err)
	}
	f.same(b)
}

// Accepting a job whose cancel was requested while it was leased runs it
// under the lease the cancel bounded: the accept does not extend it, and
// its expiry ends the job canceled.
func testAcceptAfterCancel(t *testing.T, f *fixture) {
	w := f.defaultWorker("w")
	f.enqueue("status_check")
	j, ref := f.leaseOne(w)
	c := f.cancel(j.ID)
	got := f.accept(ref)
	if got.State != lease.StateRunning || !got.Lease.ExpiresAt.Equal(c.Lease.ExpiresAt) {
		t.Fatalf("accept after a cancel request: %s expiring %v; want running, expiring at the cancel's %v", got.State, got.Lease.ExpiresAt, c.Lease.ExpiresAt)
	}
	f.clock.Advance(c.Lease.ExpiresAt.Sub(f.now()))
	f.expire(1)
	f.state(j.ID, lease.StateCanceled)
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

// Complete stores Result.ReceiptID as the job's ReceiptID in the same
// write, keeps it out of the stored Result, and a repeat returns it.
func testCompleteWithReceipt(t *testing.T, f *fixture) {
	w := f.defaultWorker("studio-gpu")
	f.enqueue("status_check")
	_, ref := f.leaseOne(w)
	if _, err := f.m.Accept(f.ctx, ref); err != nil {
		t.Fatal(err)
	}
	cj, repeated, err := f.m.Complete(f.ctx, ref, lease.Result{FinalMessage: "done", ReceiptID: "rcp_c"})
	if err != nil || repeated || cj.ReceiptID != "rcp_c" || cj.Result == nil || cj.Result.ReceiptID != "" || cj.Result.FinalMessage != "done" {
		t.Fatalf("Complete = %+v (result %+v), %v, %v; want receipt rcp_c", cj, cj.Result, repeated, err)
	}
	f.same(cj)
	again, repeated, err := f.m.Complete(f.ctx, ref, lease.Result{FinalMessage: "other", ReceiptID: "rcp_other"})
	if err != nil || !repeated || again.ReceiptID != "rcp_c" || again.Result.FinalMessage != "done" {
		t.Fatalf("Complete again = %+v, %v, %v; want the first, rcp_c", again, repeated, err)
	}
	f.same(cj)
}

// CompleteAll answers each completion as Complete would answer it alone:
// the live ones completed (a job named twice only once), a repeat
// repeated, a job not yet accepted and a malformed token refused, and
// the refusals change nothing.
func testCompleteAll(t *testing.T, f *fixture) {
	w := f.defaultWorker("w")
	for range 4 {
		f.enqueue("status_check")
	}
	var refs []lease.Ref
	for range 4 {
		_, ref := f.leaseOne(w)
		refs = append(refs, ref)
	}
	for _, ref := range refs[:3] {
		f.accept(ref)
	}
	done := f.complete(refs[2], lease.Result{FinalMessage: "first"})
	notAccepted := f.get(refs[3].JobID)
	bad := refs[1]
	bad.Token = "nlt_not-a-token"
	cs := []lease.Completion{
		{Ref: refs[0], Result: lease.Result{FinalMessage: "a"}},
		{Ref: refs[1], Result: lease.Result{FinalMessage: "b", ReceiptID: "rcp_b"}},
		{Ref: refs[0], Result: lease.Result{FinalMessage: "a again"}},
		{Ref: refs[2], Result: lease.Result{FinalMessage: "repeat"}},
		{Ref: refs[3]},
		{Ref: bad},
	}
	if err := f.m.CompleteAll(f.ctx, cs); err != nil {
		t.Fatalf("CompleteAll: %v", err)
	}
	for i, want := range []struct {
		msg      string
		repeated bool
	}{{"a", false}, {"b", false}, {"a", true}, {"first", true}} {
		c := cs[i]
		if c.Err != nil || c.Repeated != want.repeated || c.Job == nil || c.Job.State != lease.StateSucceeded || c.Job.Result.FinalMessage != want.msg {
			t.Fatalf("completion %d = %+v; want succeeded with %q, repeated %v", i, c, want.msg, want.repeated)
		}
		f.same(c.Job)
	}
	if cs[1].Job.ReceiptID != "rcp_b" {
		t.Fatalf("completion 1 has receipt %q, want rcp_b", cs[1].Job.ReceiptID)
	}
	if cs[3].Job.Rev != done.Rev {
		t.Fatalf("the repeat wrote the job again: rev %d, was %d", cs[3].Job.Rev, done.Rev)
	}
	wantTransition(t, "complete before accept", cs[4].Err, lease.StateLeased, lease.StateSucceeded)
	wantErr(t, "complete with a malformed token", cs[5].Err, lease.ErrMalformedToken)
	f.same(notAccepted)
	if cs[4].Job != nil || cs[5].Job != nil {
		t.Fatalf("refused completions returned jobs: %+v, %+v", cs[4].Job, cs[5].Job)
	}
}

// EnqueueAll queues its jobs in order, all or none: a job the Manager
// refuses names its index, and an id taken, or named twice, is
// ErrConflict from the store; either way nothing is queued.
func testEnqueueAll(t *testing.T, f *fixture) {
	js, err := f.m.EnqueueAll(f.ctx, []lease.NewJob{{Type: "status_check"}, {Type: "lora_train", Priority: 3}, {Type: "status_check", ID: "job_mine"}})
	if err != nil || len(js) != 3 || js[0].Type != "status_check" || js[1].Priority != 3 || js[2].ID != "job_mine" {
		t.Fatalf("EnqueueAll = %+v, %v", js, err)
	}
	for _, j := range js {
		f.same(j)
	}
	_, err = f.m.EnqueueAll(f.ctx, []lease.NewJob{{Type: "status_check", ID: "job_a"}, {Type: "status_check", MaxAttempts: -1}})
	var be *lease.BatchError
	if !errors.As(err, &be) || be.Index != 1 || !errors.Is(err, lease.ErrInvalidArgument) {
		t.Errorf("EnqueueAll with a bad second job: %v; want a BatchError of index 1", err)
	}
	for _, ids := range [][]string{{"job_b", "job_mine"}, {"job_c", "job_c"}} {
		_, err = f.m.EnqueueAll(f.ctx, []lease.NewJob{{Type: "status_check", ID: ids[0]}, {Type: "status_check", ID: ids[1]}})
		wantErr(t, fmt.Sprintf("EnqueueAll of %v", ids), err, lease.ErrConflict)
	}
	if n := len(f.list(lease.JobFilter{Limit: 100})); n != 3 {
		t.Errorf("%d jobs stored, want the first batch's 3 alone", n)
	}
}

func testIllegalTransitions(t *testing.T, f *fixture) {
	w := f.defaultWorker("w")
	// complete and fail-like moves before accept
	j := f.enqueue("status_check")
	_, ref := f.leaseOne(w)
	_, _, err := f.m.Complete(f.ctx, ref, lease.Result{})
	wantTransition(t, "complete before accept", err, lease.StateLeased, lease.StateSucceeded)
	f.state(j.ID, lease.StateLeased)
	f.accept(ref)
	f.complete(ref, lease.Result{})
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
	f.accept(ref2)
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

func testCompleteRepeated(t *testing.T, f *fixture) {
	w := f.defaultWorker("w")
	f.enqueue("status_check")
	_, ref := f.leaseOne(w)
	f.accept(ref)
	first := f.complete(ref, lease.Result{FinalMessage: "done"})
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
	_, _, err := f.m.Complete(f.ctx, other, lease.Result{})
	wantErr(t, "complete by another worker", err, lease.ErrLeaseLost)
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
			f.accept(ref)
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

// A clock that moved back between accept and the end (a replica that
// came into step with the database's clock) never makes a job end before
// it started: FinishedAt is then its AcceptedAt, and the attempt lasted 0.
func testClockMovedBack(t *testing.T, f *fixture) {
	w := f.defaultWorker("w")
	for _, end := range []string{"complete", "fail"} {
		f.enqueue("status_check", func(nj *lease.NewJob) { nj.MaxAttempts = 1 })
		_, ref := f.leaseOne(w)
		acc := f.accept(ref)
		f.clock.Advance(-time.Millisecond)
		var j *lease.Job
		var err error
		if end == "complete" {
			j, _, err = f.m.Complete(f.ctx, ref, lease.Result{})
		} else {
			j, err = f.m.Fail(f.ctx, ref, lease.Failure{Code: "oom", Message: "out of memory"})
		}
		if err != nil {
			t.Fatalf("%s after the clock moved back: %v", end, err)
		}
		if j.FinishedAt == nil || !j.FinishedAt.Equal(*acc.AcceptedAt) {
			t.Errorf("%s: finished at %v, accepted at %v: want the accept's time", end, j.FinishedAt, acc.AcceptedAt)
		}
		f.same(j)
		f.clock.Advance(time.Second)
	}
}

// Lease with Accept claims straight into running in one write: each job
// is as Lease then Accept at the same instant would leave it, but for its
// ids, its token and one revision less; the grant's Leased is the job as
// the lease alone would have left it.
func testLeaseWithAccept(t *testing.T, f *fixture) {
	short := func(nj *lease.NewJob) { nj.Requirements.MaxRuntimeSeconds = 60 } // under the TTL
	// The reference: Lease then Accept, on a store of its own.
	ref := f.fresh(t)
	rw := ref.defaultWorker("studio-gpu")
	ref.enqueue("status_check")
	ref.enqueue("lora_train", short)
	var want []*lease.Job
	var leased []*lease.Job
	for _, g := range ref.lease(rw, 2) {
		leased = append(leased, g.Job)
		want = append(want, ref.accept(lease.Ref{JobID: g.Job.ID, WorkerID: rw.ID, Token: g.Token}))
	}

	w := f.defaultWorker("studio-gpu")
	enq := []*lease.Job{f.enqueue("status_check"), f.enqueue("lora_train", short)}
	gs, err := f.m.Lease(f.ctx, lease.LeaseRequest{WorkerID: w.ID, MaxJobs: 2, Accept: true})
	if err != nil || len(gs) != 2 {
		t.Fatalf("Lease with accept = %d grants, %v; want 2", len(gs), err)
	}
	now := f.now()
	ignore := cmp.Options{
		cmpopts.IgnoreFields(lease.Job{}, "ID", "Rev"),
		cmpopts.IgnoreFields(lease.Lease{}, "ID", "JobID", "WorkerID", "TokenHash"),
		cmpopts.EquateEmpty(),
	}
	for i, g := range gs {
		j := g.Job
		if j.ID != enq[i].ID || j.State != lease.StateRunning || j.AcceptedAt == nil || !j.AcceptedAt.Equal(now) ||
			!j.LeasedAt.Equal(now) || j.Rev != enq[i].Rev+1 || j.Lease.JobID != j.ID {
			t.Fatalf("grant %d: job %+v, want %s running, accepted now, rev %d", i, j, enq[i].ID, enq[i].Rev+1)
		}
		if wantExp := now.Add(min(ttl, []time.Duration{maxRuntime, time.Minute}[i])); !j.Lease.ExpiresAt.Equal(wantExp) ||
			!j.Lease.AcceptBy.Equal(now.Add(acceptTTL)) {
			t.Errorf("grant %d: lease %+v, want expiry %v, accept_by %v", i, j.Lease, wantExp, now.Add(acceptTTL))
		}
		if d := cmp.Diff(want[i], j, ignore); d != "" {
			t.Errorf("grant %d differs from Lease then Accept (-then +with accept):\n%s", i, d)
		}
		if d := cmp.Diff(leased[i], g.Leased, ignore); d != "" || g.Leased.Rev != j.Rev-1 {
			t.Errorf("grant %d: Leased differs from the lease alone (-lease +Leased, rev %d):\n%s", i, g.Leased.Rev, d)
		}
		f.same(j)
	}
	// Each lease works as an accepted one: accept again changes nothing,
	// complete succeeds.
	for _, g := range gs {
		j := g.Job
		r := lease.Ref{JobID: j.ID, WorkerID: w.ID, Token: g.Token}
		if aj := f.accept(r); aj.Rev != j.Rev || aj.State != lease.StateRunning {
			t.Errorf("Accept again = %+v, want it unchanged", aj)
		}
		f.same(j)
		f.clock.Advance(time.Second)
		if cj := f.complete(r, lease.Result{}); cj.State != lease.StateSucceeded || !cj.FinishedAt.Equal(f.now()) {
			t.Errorf("Complete = %+v", cj)
		}
	}

	// Without accept nothing changes: leased, Leased nil.
	f.enqueue("status_check")
	g := f.lease(w, 1)
	if len(g) != 1 || g[0].Job.State != lease.StateLeased || g[0].Job.AcceptedAt != nil || g[0].Leased != nil {
		t.Fatalf("Lease without accept = %+v", g)
	}

	// A running job counts against the worker's live leases as an accepted
	// one does: with 1 live and MaxJobs 4, 3 of 5 queued are claimed.
	for range 5 {
		f.enqueue("status_check")
	}
	gs, err = f.m.Lease(f.ctx, lease.LeaseRequest{WorkerID: w.ID, MaxJobs: 10, Accept: true})
	if err != nil || len(gs) != 3 {
		t.Fatalf("Lease with accept at the limit = %d grants, %v; want 3", len(gs), err)
	}
}

// Concurrent Lease calls with and without accept, which a store may
// claim in one statement, each get what they asked for.
func testLeaseWithAcceptMixed(t *testing.T, f *fixture) {
	const workers, each = 8, 3
	ws := make([]*lease.Worker, workers)
	for i := range ws {
		ws[i] = f.worker(fmt.Sprintf("node-%d", i), []lease.GPU{{SKU: "rtx-4090", VRAMMB: 24576}}, []string{"status_check"}, lease.Governor{MaxJobs: each})
	}
	for range workers * each {
		f.enqueue("status_check")
	}
	got := make([][]lease.Grant, workers)
	errs := make([]error, workers)
	var wg sync.WaitGroup
	for i, w := range ws {
		wg.Go(func() {
			got[i], errs[i] = f.m.Lease(f.ctx, lease.LeaseRequest{WorkerID: w.ID, MaxJobs: each, Accept: i%2 == 0})
		})
	}
	wg.Wait()
	seen := map[string]bool{}
	for i, gs := range got {
		if errs[i] != nil || len(gs) != each {
			t.Fatalf("worker %d: %d grants, %v; want %d", i, len(gs), errs[i], each)
		}
		want := lease.StateLeased
		if i%2 == 0 {
			want = lease.StateRunning
		}
		for _, g := range gs {
			if seen[g.Job.ID] {
				t.Fatalf("job %s granted twice", g.Job.ID)
			}
			seen[g.Job.ID] = true
			if g.Job.State != want || (g.Job.AcceptedAt != nil) != (i%2 == 0) || (g.Leased != nil) != (i%2 == 0) || g.Job.Lease.WorkerID != ws[i].ID {
				t.Errorf("worker %d: job %s %s, lease %+v; want %s", i, g.Job.ID, g.Job.State, g.Job.Lease, want)
			}
			f.same(g.Job)
		}
	}
}
