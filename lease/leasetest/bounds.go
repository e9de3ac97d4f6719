package leasetest

import (
	"errors"
	"slices"
	"testing"
	"time"

	"github.com/nodelane/nodelane/lease"
)

// Every lease is bounded whatever its worker does: a cancel request leaves
// it CancelGrace at most, and no extension carries a running lease past
// the job's max runtime.
var boundTests = []test{
	{"CancelGraceRevokes", testCancelGraceRevokes},
	{"CancelGraceLazily", testCancelGraceLazily},
	{"CancelGraceBeforeAccept", testCancelGraceBeforeAccept},
	{"CompleteAfterCancel", testCompleteAfterCancel},
	{"MaxRuntimeCapsExtensions", testMaxRuntimeCapsExtensions},
	{"MaxRuntimeRevokes", testMaxRuntimeRevokes},
	{"MaxRuntimeLazily", testMaxRuntimeLazily},
	{"MaxRuntimeDefault", testMaxRuntimeDefault},
	{"MaxRuntimeValidated", testMaxRuntimeValidated},
}

// heartbeat extends ref's lease by Extend and by Touch, as a worker that
// keeps reporting does, and returns the job after both.
func (f *fixture) heartbeat(ref lease.Ref) *lease.Job {
	f.t.Helper()
	j, err := f.m.Extend(f.ctx, ref)
	if err != nil {
		f.t.Fatalf("Extend(%s): %v", ref.JobID, err)
	}
	got, err := f.m.Touch(f.ctx, ref.WorkerID, []string{ref.JobID})
	if err != nil || len(got.Leases) != 1 {
		f.t.Fatalf("Touch(%s) = %+v, %v", ref.JobID, got, err)
	}
	if tj := got.Leases[0]; !tj.Lease.ExpiresAt.Equal(j.Lease.ExpiresAt) {
		f.t.Fatalf("Touch set the lease to expire at %v, Extend at %v", tj.Lease.ExpiresAt, j.Lease.ExpiresAt)
	}
	return got.Leases[0]
}

// without returns the token writes of ws but those named in skip.
func without(ws []tokenWrite, skip ...string) []tokenWrite {
	var out []tokenWrite
	for _, w := range ws {
		drop := false
		for _, s := range skip {
			drop = drop || w.name == s
		}
		if !drop {
			out = append(out, w)
		}
	}
	return out
}

// wantCanceledRefusal checks that Complete under ref refuses with
// ErrCanceled and changes nothing.
func (f *fixture) wantCanceledRefusal(what string, ref lease.Ref) {
	f.t.Helper()
	before := f.get(ref.JobID)
	j, repeated, err := f.m.Complete(f.ctx, ref, lease.Result{FinalMessage: "done"})
	if !errors.Is(err, lease.ErrCanceled) || j != nil || repeated {
		f.t.Fatalf("%s: Complete = %+v, %v, %v; want nil, ErrCanceled", what, j, repeated, err)
	}
	f.same(before)
}

// A worker that keeps heartbeating after a cancel keeps its lease only
// for the grace: no extension renews it, and then the lease is revoked,
// the job ends canceled and every call under the token is lease lost.
func testCancelGraceRevokes(t *testing.T, f *fixture) {
	w := f.defaultWorker("w")
	j := f.enqueue("status_check")
	_, ref := f.leaseOne(w)
	f.accept(ref)
	f.clock.Advance(time.Minute)
	f.heartbeat(ref)
	cj := f.cancel(j.ID)
	canceledAt := f.now()
	if !cj.CancelRequested || !cj.Lease.ExpiresAt.Equal(canceledAt.Add(cancelGrace)) {
		t.Fatalf("Cancel = requested %v, lease expires at %v; want %v", cj.CancelRequested, cj.Lease.ExpiresAt, canceledAt.Add(cancelGrace))
	}
	f.same(cj)
	for i := 0; i < 4; i++ {
		f.clock.Advance(cancelGrace / 5)
		hj := f.heartbeat(ref)
		if !hj.Lease.ExpiresAt.Equal(canceledAt.Add(cancelGrace)) {
			t.Fatalf("heartbeat %d after the cancel extended the lease to %v", i, hj.Lease.ExpiresAt)
		}
		got, err := f.m.Touch(f.ctx, w.ID, []string{j.ID})
		if err != nil || len(got.Cancel) != 1 || got.Cancel[0] != j.ID {
			t.Fatalf("Touch after the cancel = %+v, %v; want the job in Cancel", got, err)
		}
	}
	f.clock.Advance(cancelGrace / 5) // the grace is over
	got, err := f.m.Touch(f.ctx, w.ID, []string{j.ID})
	if err != nil || len(got.Leases) != 0 || len(got.Lost) != 1 || got.Lost[0] != j.ID {
		t.Fatalf("Touch at the end of the grace = %+v, %v; want the job lost", got, err)
	}
	if n, err := f.m.Expire(f.ctx); err != nil || n != 1 {
		t.Fatalf("Expire at the end of the grace = %d, %v", n, err)
	}
	ended := f.state(j.ID, lease.StateCanceled)
	if ended.FinishedAt == nil || !ended.FinishedAt.Equal(f.now()) || ended.Result != nil {
		t.Fatalf("revoked job: finished %v, result %+v", ended.FinishedAt, ended.Result)
	}
	// A revoked lease is lost, not the lease that ended the job.
	f.refused(j.ID, without(f.tokenWrites("revoked", ref), "revoked: complete"))
	f.wantCanceledRefusal("complete after the revocation", ref)
	// Hours of heartbeats change nothing.
	for i := 0; i < 8; i++ {
		f.clock.Advance(8 * time.Hour)
		if got, err := f.m.Touch(f.ctx, w.ID, []string{j.ID}); err != nil || len(got.Lost) != 1 {
			t.Fatalf("Touch %d h after the revocation = %+v, %v", 8*(i+1), got, err)
		}
	}
	f.wantCanceledRefusal("complete 64 h later", ref)
	f.same(ended)
}

// A lease past its cancel's grace is dead before Expire sweeps it, and
// the next Lease sweeps it.
func testCancelGraceLazily(t *testing.T, f *fixture) {
	w := f.defaultWorker("w")
	j := f.enqueue("status_check")
	_, ref := f.leaseOne(w)
	f.accept(ref)
	f.cancel(j.ID)
	f.clock.Advance(cancelGrace)
	for _, tw := range without(f.tokenWrites("past the grace", ref), "past the grace: complete") {
		if err := tw.write(); !errors.Is(err, lease.ErrLeaseLost) {
			t.Fatalf("%s: err = %v, want ErrLeaseLost", tw.name, err)
		}
	}
	f.state(j.ID, lease.StateRunning)
	if gs := f.lease(w, 1); len(gs) != 0 {
		t.Fatalf("Lease granted %d jobs", len(gs))
	}
	f.state(j.ID, lease.StateCanceled)
	f.refused(j.ID, without(f.tokenWrites("swept", ref), "swept: complete"))
}

// A cancel of a leased job bounds its lease too: accepting it does not
// renew the lease past the grace.
func testCancelGraceBeforeAccept(t *testing.T, f *fixture) {
	w := f.defaultWorker("w")
	j := f.enqueue("status_check")
	_, ref := f.leaseOne(w)
	f.cancel(j.ID)
	canceledAt := f.now()
	f.clock.Advance(acceptTTL / 2)
	aj := f.accept(ref)
	if !aj.CancelRequested || !aj.Lease.ExpiresAt.Equal(canceledAt.Add(cancelGrace)) {
		t.Fatalf("Accept after a cancel: requested %v, expires at %v; want %v", aj.CancelRequested, aj.Lease.ExpiresAt, canceledAt.Add(cancelGrace))
	}
	f.clock.Advance(cancelGrace)
	f.expire(1)
	f.state(j.ID, lease.StateCanceled)
}

// Complete after a cancel request never succeeds: it ends the job
// canceled, returns it with ErrCanceled, and every complete after that
// is refused the same way and changes nothing.
func testCompleteAfterCancel(t *testing.T, f *fixture) {
	w := f.defaultWorker("w")
	cases := []struct {
		name   string
		accept bool
		wait   time.Duration // between the cancel and the complete
	}{
		{"within the grace", true, time.Second},
		{"past the grace, unswept", true, cancelGrace + time.Hour},
		{"before accept", false, time.Second},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			f := f.sub(t)
			j := f.enqueue("status_check")
			_, ref := f.leaseOne(w)
			if c.accept {
				f.accept(ref)
			}
			f.cancel(j.ID)
			f.clock.Advance(c.wait)
			cj, repeated, err := f.m.Complete(f.ctx, ref, lease.Result{OutputURI: "s3://out", FinalMessage: "done"})
			if !errors.Is(err, lease.ErrCanceled) || repeated || cj == nil {
				t.Fatalf("Complete after a cancel = %+v, %v, %v; want the job and ErrCanceled", cj, repeated, err)
			}
			if cj.State != lease.StateCanceled || cj.FinishedAt == nil || !cj.FinishedAt.Equal(f.now()) || cj.Result != nil {
				t.Fatalf("Complete after a cancel left %+v", cj)
			}
			f.same(cj)
			f.wantCanceledRefusal("complete again", ref)
			if gs := f.lease(w, 1); len(gs) != 0 {
				t.Fatalf("a canceled job was leased again")
			}
		})
	}
	// Another worker's complete is no cancel-ending: its lease is lost.
	j := f.enqueue("status_check")
	_, ref := f.leaseOne(w)
	f.accept(ref)
	f.cancel(j.ID)
	other := ref
	other.WorkerID = "wrk_other"
	before := f.get(j.ID)
	if _, _, err := f.m.Complete(f.ctx, other, lease.Result{}); !errors.Is(err, lease.ErrLeaseLost) {
		t.Fatalf("complete by another worker: err = %v, want ErrLeaseLost", err)
	}
	f.same(before)
}

// Extensions never carry a running lease past accept + max runtime.
func testMaxRuntimeCapsExtensions(t *testing.T, f *fixture) {
	w := f.defaultWorker("w")
	// A max runtime shorter than the TTL caps the lease from accept on.
	f.enqueue("status_check", func(nj *lease.NewJob) { nj.Requirements.MaxRuntimeSeconds = 120 })
	_, short := f.leaseOne(w)
	f.clock.Advance(time.Second)
	aj := f.accept(short)
	if want := aj.AcceptedAt.Add(120 * time.Second); !aj.Lease.ExpiresAt.Equal(want) {
		t.Fatalf("accept: expires at %v, want %v", aj.Lease.ExpiresAt, want)
	}
	f.same(aj)
	f.clock.Advance(time.Minute)
	if hj := f.heartbeat(short); !hj.Lease.ExpiresAt.Equal(aj.Lease.ExpiresAt) {
		t.Fatalf("heartbeat: expires at %v, want %v", hj.Lease.ExpiresAt, aj.Lease.ExpiresAt)
	}

	// A longer one lets the TTL apply until the runtime's end is nearer.
	f.enqueue("status_check", func(nj *lease.NewJob) { nj.Requirements.MaxRuntimeSeconds = 3600 })
	_, long := f.leaseOne(w)
	lj := f.accept(long)
	end := lj.AcceptedAt.Add(time.Hour)
	if want := lj.AcceptedAt.Add(ttl); !lj.Lease.ExpiresAt.Equal(want) {
		t.Fatalf("accept: expires at %v, want %v", lj.Lease.ExpiresAt, want)
	}
	for i := 0; i < 11; i++ {
		f.clock.Advance(5 * time.Minute)
		want := f.now().Add(ttl)
		if end.Before(want) {
			want = end
		}
		hj := f.heartbeat(long)
		if !hj.Lease.ExpiresAt.Equal(want) {
			t.Fatalf("heartbeat at %v: expires at %v, want %v", f.now().Sub(*lj.AcceptedAt), hj.Lease.ExpiresAt, want)
		}
		f.same(hj)
	}
	// Status events, logs and artifacts extend no further.
	res, err := f.m.RecordEvents(f.ctx, long, lease.Event{Kind: lease.EventStatus, Type: "progress"})
	if err != nil || !res.Job.Lease.ExpiresAt.Equal(end) {
		t.Fatalf("status event: %+v, %v; want the lease to expire at %v", res.Job, err, end)
	}
}

// A lease that reaches its max runtime is revoked: the job ends failed,
// max_runtime_exceeded, without a retry although attempts are left, and
// every call under its token, complete included, is lease lost.
func testMaxRuntimeRevokes(t *testing.T, f *fixture) {
	w := f.defaultWorker("w")
	j := f.enqueue("status_check", func(nj *lease.NewJob) { nj.Requirements.MaxRuntimeSeconds = 3600 })
	if j.MaxAttempts < 2 {
		t.Fatalf("max attempts %d, want some left", j.MaxAttempts)
	}
	_, ref := f.leaseOne(w)
	aj := f.accept(ref)
	for f.now().Before(aj.AcceptedAt.Add(time.Hour - 5*time.Minute)) {
		f.clock.Advance(5 * time.Minute)
		f.heartbeat(ref)
	}
	f.clock.Advance(5*time.Minute - time.Microsecond)
	if n, err := f.m.Expire(f.ctx); err != nil || n != 0 {
		t.Fatalf("Expire before the max runtime = %d, %v", n, err)
	}
	f.clock.Advance(time.Microsecond)
	f.expire(1)
	fj := f.state(j.ID, lease.StateFailed)
	if e := fj.LastError; e == nil || e.Code != lease.CodeMaxRuntimeExceeded || e.Attempt != 1 || fj.Attempt != 1 ||
		fj.FinishedAt == nil || !fj.FinishedAt.Equal(f.now()) {
		t.Fatalf("job past its max runtime: %+v, last error %+v", fj, fj.LastError)
	}
	f.refused(j.ID, f.tokenWrites("past the max runtime", ref))
	if gs := f.lease(w, 1); len(gs) != 0 {
		t.Fatal("a job failed by its max runtime was leased again")
	}
}

// A lease at its max runtime is dead before Expire sweeps it, and the next
// Lease sweeps it.
func testMaxRuntimeLazily(t *testing.T, f *fixture) {
	w := f.defaultWorker("w")
	j := f.enqueue("status_check", func(nj *lease.NewJob) { nj.Requirements.MaxRuntimeSeconds = 60 })
	_, ref := f.leaseOne(w)
	f.accept(ref)
	f.clock.Advance(time.Minute)
	before := f.get(j.ID)
	for _, tw := range f.tokenWrites("at the max runtime", ref) {
		if err := tw.write(); !errors.Is(err, lease.ErrLeaseLost) {
			t.Fatalf("%s: err = %v, want ErrLeaseLost", tw.name, err)
		}
	}
	if got, err := f.m.Touch(f.ctx, w.ID, []string{j.ID}); err != nil || len(got.Lost) != 1 {
		t.Fatalf("Touch at the max runtime = %+v, %v", got, err)
	}
	f.same(before)
	f.lease(w, 1)
	if fj := f.state(j.ID, lease.StateFailed); fj.LastError == nil || fj.LastError.Code != lease.CodeMaxRuntimeExceeded {
		t.Fatalf("swept job: %+v", fj.LastError)
	}
}

// A job without max_runtime_seconds runs for Config.MaxRuntime at most;
// a job's own max runtime overrides it, longer or shorter.
func testMaxRuntimeDefault(t *testing.T, f *fixture) {
	m := lease.NewManager(f.store, &lease.Config{
		LeaseTTL: ttl, AcceptTimeout: acceptTTL, MaxRuntime: 2 * time.Hour, Now: f.clock.Now,
	})
	f.m = m
	w := f.defaultWorker("w")
	def := f.enqueue("status_check")
	longer := f.enqueue("status_check", func(nj *lease.NewJob) { nj.Requirements.MaxRuntimeSeconds = 3 * 3600 })
	gs := f.lease(w, 2)
	if len(gs) != 2 {
		t.Fatalf("leased %d jobs, want 2", len(gs))
	}
	var refs []lease.Ref
	for _, g := range gs {
		ref := lease.Ref{JobID: g.Job.ID, WorkerID: w.ID, Token: g.Token}
		f.accept(ref)
		refs = append(refs, ref)
	}
	for i := 0; i < 24; i++ { // 2 h
		f.clock.Advance(5 * time.Minute)
		for _, ref := range refs {
			if ref.JobID == def.ID && i == 23 {
				continue
			}
			f.heartbeat(ref)
		}
	}
	f.expire(1)
	if fj := f.state(def.ID, lease.StateFailed); fj.LastError == nil || fj.LastError.Code != lease.CodeMaxRuntimeExceeded {
		t.Fatalf("default max runtime: %+v", fj.LastError)
	}
	f.state(longer.ID, lease.StateRunning)
	// A default of MaxRuntimeLimit (the most Config.WithDefaults allows) holds.
	f.m = lease.NewManager(f.store, &lease.Config{
		LeaseTTL: 40 * 24 * time.Hour, MaxRuntime: lease.MaxRuntimeLimit, Now: f.clock.Now,
	})
	j := f.enqueue("status_check")
	f.fail(refs[slices.IndexFunc(refs, func(r lease.Ref) bool { return r.JobID == longer.ID })], lease.Failure{Code: "done"})
	_, ref := f.leaseOne(w)
	if ref.JobID != j.ID {
		t.Fatalf("leased %s, want %s", ref.JobID, j.ID)
	}
	if aj := f.accept(ref); !aj.Lease.ExpiresAt.Equal(aj.AcceptedAt.Add(lease.MaxRuntimeLimit)) {
		t.Fatalf("with a default of the limit the lease expires at %v, want %v", aj.Lease.ExpiresAt, aj.AcceptedAt.Add(lease.MaxRuntimeLimit))
	}
}

// max_runtime_seconds is 0 to MaxRuntimeLimit, kept as given.
func testMaxRuntimeValidated(t *testing.T, f *fixture) {
	limit := int(lease.MaxRuntimeLimit / time.Second)
	for _, bad := range []int{-1, limit + 1} {
		_, err := f.m.Enqueue(f.ctx, lease.NewJob{Type: "status_check", Requirements: lease.Requirements{MaxRuntimeSeconds: bad}})
		wantErr(t, "max_runtime_seconds out of range", err, lease.ErrInvalidArgument)
	}
	for _, ok := range []int{0, 1, limit} {
		j := f.enqueue("status_check", func(nj *lease.NewJob) { nj.Requirements.MaxRuntimeSeconds = ok })
		if j.Requirements.MaxRuntimeSeconds != ok {
			t.Fatalf("enqueued max_runtime_seconds %d, want %d", j.Requirements.MaxRuntimeSeconds, ok)
		}
		f.same(j)
	}
}
