package leasetest

import (
	"encoding/json"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/nodelane/nodelane/lease"
)

var expiryTests = []test{
	{"TTLExpiry", testTTLExpiry},
	{"AcceptDeadline", testAcceptDeadline},
	{"ExpiryChecksLazily", testExpiryChecksLazily},
	{"RetryBackoff", testRetryBackoff},
	{"AttemptsExhausted", testAttemptsExhausted},
	{"Touch", testTouch},
}

func testTTLExpiry(t *testing.T, f *fixture) {
	w := f.defaultWorker("w")
	j := f.enqueue("status_check")
	_, ref := f.leaseOne(w)
	f.accept(ref)
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
	f.accept(running)
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
		f.accept(ref)
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
	f.accept(ref)
	f.clock.Advance(ttl)
	f.expire(1) // attempt 1 used by the TTL
	f.clock.Advance(time.Hour)
	_, ref = f.leaseOne(w)
	f.accept(ref)
	fj, err := f.m.Fail(f.ctx, ref, lease.Failure{Code: "oom", Message: "again", Retryable: true})
	if err != nil || fj.State != lease.StateFailed || fj.LastError.Code != "oom" || fj.LastError.Attempt != 2 || fj.FinishedAt == nil {
		t.Fatalf("last attempt failing = %+v, %v", fj, err)
	}
	f.same(fj)
	// and by TTL expiry
	j2 := f.enqueue("status_check", func(nj *lease.NewJob) { nj.MaxAttempts = 1 })
	_, ref = f.leaseOne(w)
	f.accept(ref)
	f.clock.Advance(ttl)
	f.expire(1)
	if fj := f.state(j2.ID, lease.StateFailed); fj.LastError.Code != "lease_expired" {
		t.Fatalf("expired last attempt: %+v", fj.LastError)
	}
	f.state(j.ID, lease.StateFailed)
	// non-retryable failure on the first attempt
	f.enqueue("status_check")
	_, ref = f.leaseOne(w)
	f.accept(ref)
	if fj, err := f.m.Fail(f.ctx, ref, lease.Failure{Code: "bad_input", Retryable: false}); err != nil || fj.State != lease.StateFailed || fj.Attempt != 1 {
		t.Fatalf("non-retryable failure = %+v, %v", fj, err)
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
	f.accept(ra)
	jpending, _ := f.leaseOne(a)
	jb, _ := f.leaseOne(b)
	queued := f.enqueue("status_check")
	f.cancel(ja.ID)
	canceledAt := f.now()
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
		want := now.Add(ttl)
		if j.ID == ja.ID {
			want = canceledAt.Add(cancelGrace) // a cancel request ends extensions
		}
		if !j.Lease.ExpiresAt.Equal(want) {
			t.Fatalf("job %s expires at %v, want %v", j.ID, j.Lease.ExpiresAt, want)
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
