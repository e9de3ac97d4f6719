package leasetest

import (
	"testing"

	"github.com/nodelane/nodelane/lease"
)

var cancelTests = []test{
	{"ByState", testCancelByState},
	{"RequestedThenEnded", testCancelRequested},
}

// Cancel ends a queued job at once, asks a leased or running one to stop,
// and refuses a finished one.
func testCancelByState(t *testing.T, f *fixture) {
	w := f.defaultWorker("w")
	setups := []struct {
		name      string
		setup     func(f *fixture) *lease.Job
		wantState lease.State
		wantReq   bool
		wantErr   *lease.TransitionError
	}{
		{"queued", func(f *fixture) *lease.Job { return f.enqueue("status_check") }, lease.StateCanceled, false, nil},
		{"leased", func(f *fixture) *lease.Job {
			f.enqueue("status_check")
			j, _ := f.leaseOne(w)
			return j
		}, lease.StateLeased, true, nil},
		{"running", func(f *fixture) *lease.Job {
			f.enqueue("status_check")
			j, ref := f.leaseOne(w)
			f.accept(ref)
			return j
		}, lease.StateRunning, true, nil},
		{"succeeded", func(f *fixture) *lease.Job {
			f.enqueue("status_check")
			j, ref := f.leaseOne(w)
			f.accept(ref)
			f.complete(ref, lease.Result{})
			return j
		}, lease.StateSucceeded, false, &lease.TransitionError{From: lease.StateSucceeded, To: lease.StateCanceled}},
		{"failed", func(f *fixture) *lease.Job {
			f.enqueue("status_check")
			j, ref := f.leaseOne(w)
			f.accept(ref)
			f.fail(ref, lease.Failure{})
			return j
		}, lease.StateFailed, false, &lease.TransitionError{From: lease.StateFailed, To: lease.StateCanceled}},
	}
	for _, s := range setups {
		t.Run(s.name, func(t *testing.T) {
			f := f.sub(t)
			j := s.setup(f)
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
	_, err := f.m.Cancel(f.ctx, "job_missing")
	wantErr(t, "cancel unknown", err, lease.ErrNotFound)
}

// A job whose cancel was requested ends canceled, however its lease ends.
func testCancelRequested(t *testing.T, f *fixture) {
	w := f.defaultWorker("w")
	endings := []struct {
		name string
		end  func(f *fixture, ref lease.Ref)
	}{
		{"fail", func(f *fixture, ref lease.Ref) { f.fail(ref, lease.Failure{Code: "canceled", Retryable: true}) }},
		{"release", func(f *fixture, ref lease.Ref) { f.release(ref, "canceled") }},
		{"silence", func(f *fixture, ref lease.Ref) { f.clock.Advance(ttl); f.expire(1) }},
	}
	for _, e := range endings {
		t.Run(e.name, func(t *testing.T) {
			f := f.sub(t)
			j := f.enqueue("status_check")
			_, ref := f.leaseOne(w)
			f.accept(ref)
			if cj := f.cancel(j.ID); !cj.CancelRequested {
				t.Fatalf("Cancel of a running job = %+v, want its cancel requested", cj)
			}
			e.end(f, ref)
			if cj := f.state(j.ID, lease.StateCanceled); cj.FinishedAt == nil {
				t.Fatal("canceled job has no finished_at")
			}
		})
	}
}
