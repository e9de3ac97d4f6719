package leasetest

import (
	"testing"

	"github.com/nodelane/nodelane/lease"
)

var retryTests = []test{
	{"FailedOrCanceledOnly", testRetry},
}

// Manager.Retry puts a failed or canceled job back in the queue with a
// fresh attempt budget, its LastError and last lease kept; the store
// round-trips the cleared FinishedAt, result and receipt, so the job
// leases again (with the next epoch) and can succeed; a job in any other
// state is refused with a *TransitionError and left as it was.
func testRetry(t *testing.T, f *fixture) {
	w := f.defaultWorker("w")

	// A job that failed for good on its last attempt.
	failed := f.enqueue("status_check", func(nj *lease.NewJob) { nj.MaxAttempts = 1 })
	_, ref := f.leaseOne(w)
	f.accept(ref)
	first := f.fail(ref, lease.Failure{Code: "oom", Message: "out of memory", Retryable: true})
	if first.State != lease.StateFailed {
		t.Fatalf("a failure on the last attempt left the job %s", first.State)
	}
	if _, err := f.m.SetReceipt(f.ctx, failed.ID, "rcp_failed"); err != nil {
		t.Fatalf("SetReceipt: %v", err)
	}
	j, err := f.m.Retry(f.ctx, failed.ID)
	if err != nil {
		t.Fatalf("Retry(failed): %v", err)
	}
	if j.State != lease.StateQueued || j.Attempt != 1 || j.FinishedAt != nil || j.ReceiptID != "" || j.CancelRequested || j.Result != nil {
		t.Fatalf("Retry(failed) = %+v", j)
	}
	if j.LastError == nil || j.LastError.Code != "oom" || j.Lease == nil || j.Lease.Epoch != first.Lease.Epoch {
		t.Fatalf("Retry dropped the history: last error %+v, lease %+v", j.LastError, j.Lease)
	}
	if !j.ScheduledAt.Equal(f.now()) {
		t.Fatalf("Retry scheduled the job at %v, want now %v", j.ScheduledAt, f.now())
	}
	f.same(j)
	if got := f.list(lease.JobFilter{State: lease.StateQueued}); len(got) != 1 || got[0].ID != failed.ID {
		t.Fatalf("queued jobs after the retry: %v", got)
	}
	// It leases again at once, under the next epoch, and succeeds.
	again, ref2 := f.leaseOne(w)
	if again.ID != failed.ID || again.Lease.Epoch <= first.Lease.Epoch || again.Attempt != 1 {
		t.Fatalf("the retried job leased as %+v", again)
	}
	f.accept(ref2)
	if done := f.complete(ref2, lease.Result{FinalMessage: "ok"}); done.State != lease.StateSucceeded {
		t.Fatalf("the retried job ended %s", done.State)
	}

	// A queued job canceled, then retried.
	canceled := f.enqueue("status_check")
	f.cancel(canceled.ID)
	if j, err := f.m.Retry(f.ctx, canceled.ID); err != nil || j.State != lease.StateQueued || j.FinishedAt != nil {
		t.Fatalf("Retry(canceled) = %+v, %v", j, err)
	}
	f.same(f.get(canceled.ID))

	// Every other state is refused, and nothing changes: the retried
	// canceled job is leased next, a lora_train job runs, one stays
	// queued, and the first one succeeded.
	_, leased := f.leaseOne(w)
	if leased.JobID != canceled.ID {
		t.Fatalf("leased %s, want the retried %s", leased.JobID, canceled.ID)
	}
	f.enqueue("lora_train")
	_, running := f.leaseOne(w)
	f.accept(running)
	queued := f.enqueue("lora_train")
	for _, id := range []string{queued.ID, leased.JobID, running.JobID, failed.ID} {
		before := f.get(id)
		_, err := f.m.Retry(f.ctx, id)
		wantTransition(t, "Retry of a "+string(before.State)+" job", err, before.State, lease.StateQueued)
		f.same(before)
	}
	_, err = f.m.Retry(f.ctx, "job_missing")
	wantErr(t, "Retry of an unknown job", err, lease.ErrNotFound)
}
