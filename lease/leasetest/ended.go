package leasetest

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/nodelane/nodelane/lease"
)

// endedTests check Config.LeaseEnded, the one hook every server-side end
// of a lease goes through: called exactly once per ended lease, with the
// job as written, by expiry (TTL, accept deadline, cancel grace, max
// runtime), ExpireOffline and Retire, never for a lease that survives,
// and once in all when two Managers race to end the same lease.
var endedTests = []test{
	{"EveryServerEnd", testLeaseEndedEveryEnd},
	{"Race", testLeaseEndedRace},
	{"HookError", testLeaseEndedError},
}

// endedLog records the calls of LeaseEnded.
type endedLog struct {
	mu    sync.Mutex
	calls []string // "job epoch code state"
}

func (l *endedLog) hook(_ context.Context, j *lease.Job) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	code := ""
	if j.LastError != nil {
		code = j.LastError.Code
	}
	l.calls = append(l.calls, fmt.Sprintf("%s %d %s %s", j.ID, j.Lease.Epoch, code, j.State))
	return nil
}

// take returns the calls since the last take.
func (l *endedLog) take() []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	c := l.calls
	l.calls = nil
	return c
}

func (f *fixture) withEnded(t *testing.T, log *endedLog, tx func(context.Context, func(context.Context) error) error) *fixture {
	t.Helper()
	return f.withConfig(t, func(c *lease.Config) {
		c.CancelGrace, c.MaxRuntime = cancelGrace, maxRuntime
		c.LeaseEnded, c.InTx = log.hook, tx
	})
}

func wantEnded(t *testing.T, what string, got []string, want ...string) {
	t.Helper()
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("%s: LeaseEnded calls %q, want %q", what, got, want)
	}
}

func testLeaseEndedEveryEnd(t *testing.T, f *fixture) {
	log := &endedLog{}
	inTx := 0
	f = f.withEnded(t, log, func(ctx context.Context, fn func(context.Context) error) error {
		inTx++
		return fn(ctx)
	})
	w := f.defaultWorker("w")

	// A TTL expiry after accept uses an attempt.
	j := f.enqueue("status_check")
	_, ref := f.leaseOne(w)
	f.accept(ref)
	f.clock.Advance(ttl)
	f.expire(1)
	wantEnded(t, "TTL", log.take(), j.ID+" 1 lease_expired queued")
	f.expire(0)
	wantEnded(t, "Expire again", log.take())
	f.clock.Advance(time.Hour)
	f.cancel(j.ID)

	// An accept deadline.
	j = f.enqueue("status_check")
	_, _ = f.leaseOne(w)
	f.clock.Advance(acceptTTL)
	f.expire(1)
	wantEnded(t, "accept timeout", log.take(), j.ID+" 1 accept_timeout queued")
	f.cancel(j.ID)

	// A cancel's grace running out.
	j = f.enqueue("status_check")
	_, ref = f.leaseOne(w)
	f.accept(ref)
	f.cancel(j.ID)
	f.clock.Advance(cancelGrace - time.Microsecond)
	f.heartbeat(ref)
	f.expire(0)
	wantEnded(t, "within the grace", log.take())
	f.clock.Advance(time.Microsecond)
	f.expire(1)
	wantEnded(t, "cancel grace", log.take(), j.ID+" 1 lease_expired canceled")

	// The max runtime.
	j = f.enqueue("status_check", func(nj *lease.NewJob) { nj.Requirements.MaxRuntimeSeconds = 60 })
	_, ref = f.leaseOne(w)
	f.accept(ref)
	f.clock.Advance(time.Minute)
	f.expire(1)
	wantEnded(t, "max runtime", log.take(), j.ID+" 1 "+lease.CodeMaxRuntimeExceeded+" failed")

	// A worker gone offline.
	j = f.enqueue("status_check")
	_, ref = f.leaseOne(w)
	f.accept(ref)
	f.clock.Advance(offlineAfter)
	f.expireOffline(1)
	wantEnded(t, "offline", log.take(), j.ID+" 1 "+lease.CodeWorkerOffline+" queued")
	f.clock.Advance(time.Hour)
	f.cancel(j.ID)

	// Retire: both live leases end.
	w = f.defaultWorker("w2")
	j1 := f.enqueue("status_check")
	_, _ = f.leaseOne(w)
	j2 := f.enqueue("status_check")
	_, ref = f.leaseOne(w)
	f.accept(ref)
	if _, _, ended, err := f.m.Retire(f.ctx, w.ID, "gone"); err != nil || len(ended) != 2 {
		t.Fatalf("Retire: %d ended, %v", len(ended), err)
	}
	wantEnded(t, "retire", log.take(), j1.ID+" 1 "+lease.CodeWorkerRetired+" queued", j2.ID+" 1 "+lease.CodeWorkerRetired+" queued")

	// The worker's own ends are not server-side: no call.
	w = f.defaultWorker("w3")
	f.enqueue("status_check")
	_, ref = f.leaseOne(w)
	f.accept(ref)
	f.complete(ref, lease.Result{})
	f.enqueue("status_check")
	_, ref = f.leaseOne(w)
	f.release(ref, "")
	wantEnded(t, "complete and release", log.take())
	if inTx == 0 {
		t.Fatal("InTx was never called")
	}
}

// Two Managers on one store expire the same lease at once: one call in all.
func testLeaseEndedRace(t *testing.T, f *fixture) {
	log := &endedLog{}
	f = f.withEnded(t, log, nil)
	other := lease.NewManager(f.store, &lease.Config{
		LeaseTTL: ttl, AcceptTimeout: acceptTTL, RetryBase: retryBase, RetryMax: time.Hour,
		Now: f.clock.Now, Rand: rand.Reader, LeaseEnded: log.hook,
	})
	w := f.defaultWorker("w")
	const n = 4 // the default worker's governor max_jobs
	for range n {
		f.enqueue("status_check")
	}
	for _, g := range f.lease(w, n) {
		f.accept(lease.Ref{JobID: g.Job.ID, WorkerID: w.ID, Token: g.Token})
	}
	f.clock.Advance(ttl)
	var wg sync.WaitGroup
	counts := make([]int, 4)
	errs := make([]error, 4)
	for i := range counts {
		m := f.m
		if i%2 == 1 {
			m = other
		}
		wg.Go(func() { counts[i], errs[i] = m.Expire(f.ctx) })
	}
	wg.Wait()
	total := 0
	for i := range counts {
		if errs[i] != nil {
			t.Fatalf("Expire: %v", errs[i])
		}
		total += counts[i]
	}
	calls := log.take()
	seen := map[string]bool{}
	for _, c := range calls {
		if seen[c] {
			t.Fatalf("LeaseEnded called twice with %q", c)
		}
		seen[c] = true
	}
	if total != n || len(calls) != n {
		t.Fatalf("the racing Expires ended %d leases and called LeaseEnded %d times, want %d and %d", total, len(calls), n, n)
	}
}

// A hook's error is the error of the call that ended the lease (without
// InTx the write stands: rolling it back is the transaction's job), and
// an EndLease that writes nothing calls no hook.
func testLeaseEndedError(t *testing.T, f *fixture) {
	boom := errors.New("boom")
	f = f.withConfig(t, func(c *lease.Config) {
		c.LeaseEnded = func(context.Context, *lease.Job) error { return boom }
	})
	w := f.defaultWorker("w")
	f.enqueue("status_check")
	_, ref := f.leaseOne(w)
	f.accept(ref)
	f.clock.Advance(ttl)
	if _, err := f.m.Expire(f.ctx); !errors.Is(err, boom) {
		t.Fatalf("Expire = %v, want the hook's error", err)
	}
	if _, err := f.m.EndLease(f.ctx, ref.JobID, func(*lease.Job, time.Time) (*lease.Job, error) { return nil, nil }); err != nil {
		t.Fatalf("EndLease writing nothing = %v", err)
	}
}
