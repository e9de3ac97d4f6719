package leasetest

import (
	"errors"
	"testing"
	"time"

	"github.com/nodelane/nodelane/lease"
)

var fencingTests = []test{
	{"StaleTokenAfterReLease", testStaleToken},
	{"StaleTokenSameWorker", testStaleTokenSameWorker},
}

// leaseEnds are the ways a lease ends and hands its job back to the
// queue. Each leaves the clock where the job is eligible again.
var leaseEnds = []struct {
	name string
	end  func(f *fixture, ref lease.Ref)
}{
	{"ttl expiry", func(f *fixture, ref lease.Ref) {
		f.accept(ref)
		f.clock.Advance(ttl)
		f.expire(1)
		f.clock.Advance(time.Hour) // past the backoff
	}},
	{"accept deadline", func(f *fixture, ref lease.Ref) {
		f.clock.Advance(acceptTTL)
		f.expire(1)
	}},
	{"release", func(f *fixture, ref lease.Ref) {
		f.accept(ref)
		f.release(ref, "spot preemption")
	}},
	{"retryable fail", func(f *fixture, ref lease.Ref) {
		f.accept(ref)
		f.fail(ref, lease.Failure{Retryable: true})
		f.clock.Advance(time.Hour) // past the backoff
	}},
}

// tokenWrite is one Manager call that presents a lease token.
type tokenWrite struct {
	name  string
	write func() error
}

// tokenWrites are every Manager call that presents a lease token, each
// under ref, named after what ref is.
func (f *fixture) tokenWrites(what string, ref lease.Ref) []tokenWrite {
	ws := []tokenWrite{
		{"accept", func() error { _, err := f.m.Accept(f.ctx, ref); return err }},
		{"extend", func() error { _, err := f.m.Extend(f.ctx, ref); return err }},
		{"log", func() error {
			_, err := f.m.RecordEvents(f.ctx, ref, lease.Event{Kind: lease.EventLog, Seq: 1, Message: "x"})
			return err
		}},
		{"status", func() error {
			_, err := f.m.RecordEvents(f.ctx, ref, lease.Event{Kind: lease.EventStatus, Type: "progress", Message: "x"})
			return err
		}},
		{"artifact", func() error {
			_, err := f.m.AddArtifact(f.ctx, ref, lease.Artifact{Type: "adapter", Name: "a"})
			return err
		}},
		{"complete", func() error { _, _, err := f.m.Complete(f.ctx, ref, lease.Result{}); return err }},
		{"fail", func() error { _, err := f.m.Fail(f.ctx, ref, lease.Failure{}); return err }},
		{"retryable fail", func() error { _, err := f.m.Fail(f.ctx, ref, lease.Failure{Retryable: true}); return err }},
		{"release", func() error { _, err := f.m.Release(f.ctx, ref, ""); return err }},
	}
	for i := range ws {
		ws[i].name = what + ": " + ws[i].name
	}
	return ws
}

// refused checks that each write fails with ErrLeaseLost, and that
// together they change nothing: not the job, nor its events or artifacts.
func (f *fixture) refused(jobID string, writes []tokenWrite) {
	f.t.Helper()
	before := f.get(jobID)
	passed := false
	for _, w := range writes {
		if err := w.write(); !errors.Is(err, lease.ErrLeaseLost) {
			f.t.Errorf("%s: err = %v, want %v", w.name, err, lease.ErrLeaseLost)
			passed = true
		}
	}
	if passed {
		f.t.FailNow()
	}
	f.same(before)
	if evs, err := f.m.Events(f.ctx, jobID, 0, 10); err != nil || len(evs) != 0 {
		f.t.Fatalf("a stale lease stored %d events (%v)", len(evs), err)
	}
	if arts, err := f.m.Artifacts(f.ctx, lease.ArtifactFilter{JobID: jobID}); err != nil || len(arts) != 0 {
		f.t.Fatalf("a stale lease stored %d artifacts (%v)", len(arts), err)
	}
}

// After the job passed to another worker's lease, every write under the
// old token fails with ErrLeaseLost, whichever way the old lease ended and
// whether or not the new one was accepted yet.
func testStaleToken(t *testing.T, f *fixture) {
	for _, e := range leaseEnds {
		t.Run(e.name, func(t *testing.T) {
			t.Parallel()
			f := f.fresh(t)
			a := f.defaultWorker("a")
			b := f.defaultWorker("b")
			j := f.enqueue("status_check")
			_, old := f.leaseOne(a)
			e.end(f, old)
			nj, cur := f.leaseOne(b)
			if nj.ID != j.ID || nj.Lease.Epoch != 2 {
				t.Fatalf("re-lease = %s epoch %d", nj.ID, nj.Lease.Epoch)
			}
			stale := append(f.tokenWrites("old token", old),
				f.tokenWrites("new token, old worker", lease.Ref{JobID: j.ID, WorkerID: a.ID, Token: cur.Token})...)
			f.refused(j.ID, stale)
			f.accept(cur)
			f.refused(j.ID, stale)
			// The live lease still works.
			f.complete(cur, lease.Result{})
		})
	}
}

// After the job passed to a new lease of the same worker, the old token is
// as dead as if another worker held the job: the token, not the worker,
// decides. Nor does the worker's live token for another job count.
func testStaleTokenSameWorker(t *testing.T, f *fixture) {
	for _, e := range leaseEnds {
		t.Run(e.name, func(t *testing.T) {
			t.Parallel()
			f := f.fresh(t)
			w := f.defaultWorker("w")
			j := f.enqueue("status_check")
			_, old := f.leaseOne(w)
			e.end(f, old)
			nj, cur := f.leaseOne(w)
			if nj.ID != j.ID || nj.Lease.Epoch != 2 || nj.Lease.WorkerID != w.ID || cur.Token == old.Token {
				t.Fatalf("re-lease = %s epoch %d worker %s, token changed %v", nj.ID, nj.Lease.Epoch, nj.Lease.WorkerID, cur.Token != old.Token)
			}
			f.enqueue("status_check")
			_, other := f.leaseOne(w)
			stale := append(f.tokenWrites("old token", old),
				f.tokenWrites("another job's token", lease.Ref{JobID: j.ID, WorkerID: w.ID, Token: other.Token})...)
			f.refused(j.ID, stale)
			f.accept(cur)
			f.refused(j.ID, stale)
			// Both live leases still work.
			f.complete(cur, lease.Result{})
			f.accept(other)
			f.complete(other, lease.Result{})
		})
	}
}
