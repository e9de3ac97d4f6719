package client

import (
	"context"
	"errors"
	"fmt"
	"runtime/debug"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nodelane/nodelane/workerapi/wire"
)

// task is one leased job.
type task struct {
	w      *Runner
	id     string
	token  string
	ctx    context.Context
	cancel context.CancelCauseFunc
	rep    *Reporter
	lost   atomic.Bool
	// claimed is set by whoever reports the job's end (its own goroutine or
	// the drain), so that exactly one does.
	claimed atomic.Bool

	mu        sync.Mutex
	job       wire.Job  // as leased, then as accepted
	expiresAt time.Time // server time
	ttl       time.Duration
	timer     *time.Timer
	done      bool
}

func newTask(w *Runner, g wire.Grant) *task {
	t := &task{w: w, id: g.Job.ID, job: g.Job, token: g.LeaseToken}
	t.ctx, t.cancel = context.WithCancelCause(w.baseCtx)
	t.rep = &Reporter{t: t, kick: make(chan struct{}, 1)}
	return t
}

func (t *task) jobCopy() wire.Job {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.job
}

func (t *task) claim() bool { return t.claimed.CompareAndSwap(false, true) }

// stop cancels the job's context with cause (the first cause stays).
func (t *task) stop(cause error) { t.cancel(cause) }

// lose marks the lease lost and stops the job.
func (t *task) lose() {
	if t.lost.CompareAndSwap(false, true) {
		t.w.log.Warn("lease lost", "job", t.id)
	}
	t.cancel(ErrLeaseLost)
}

// margin is LeaseMargin, at most a fifth of the lease's lifetime.
func (t *task) margin() time.Duration { return min(t.w.cfg.LeaseMargin, t.ttl/5) }

// extend records a later expiry and re-arms the watchdog.
func (t *task) extend(exp time.Time) {
	if exp.IsZero() {
		return
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	if !exp.After(t.expiresAt) {
		return
	}
	if ttl := t.w.c.until(exp); ttl > t.ttl {
		t.ttl = ttl
	}
	t.expiresAt = exp
	t.armLocked()
}

func (t *task) rearm() {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.armLocked()
}

func (t *task) armLocked() {
	if t.done || t.expiresAt.IsZero() {
		return
	}
	d := t.w.c.until(t.expiresAt) - t.margin()
	if t.timer == nil {
		t.timer = time.AfterFunc(d, t.expiring)
	} else {
		t.timer.Reset(d)
	}
}

// expiring runs when the watchdog fires: unless the lease was extended
// meanwhile, the job stops.
func (t *task) expiring() {
	t.mu.Lock()
	if t.done {
		t.mu.Unlock()
		return
	}
	if d := t.w.c.until(t.expiresAt) - t.margin(); d > 0 {
		t.timer.Reset(d)
		t.mu.Unlock()
		return
	}
	t.mu.Unlock()
	if context.Cause(t.ctx) == nil {
		t.w.log.Warn("lease about to expire without renewal: stopping the job", "job", t.id)
	}
	t.cancel(ErrLeaseExpiring)
}

// deadline is the lease's expiry on the local clock, as far as known.
func (t *task) deadline() time.Time {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.expiresAt.IsZero() {
		return time.Now().Add(t.w.cfg.ReportPatience)
	}
	return time.Now().Add(t.w.c.until(t.expiresAt))
}

// finish stops the watchdog.
func (t *task) finish() {
	t.mu.Lock()
	t.done = true
	if t.timer != nil {
		t.timer.Stop()
	}
	t.mu.Unlock()
	t.cancel(context.Canceled)
}

// persist calls fn until it succeeds, fails for good, the lease is lost
// or expires, ReportPatience runs out, or Run ends. With settledBy409 (fail,
// release: the server answers a repeat with 409), a 409 after an attempt
// that may have reached the server unanswered means that attempt did the
// work: done.
func (t *task) persist(what string, settledBy409 bool, fn func(ctx context.Context) error) error {
	start := time.Now()
	unanswered, renewals := false, 0
	for attempt := 1; ; attempt++ {
		used := t.w.c.id.Token()
		err := fn(t.w.hardCtx)
		if err == nil {
			return nil
		}
		if settledBy409 && (unanswered || afterUnanswered(err)) && (IsLeaseLost(err) || IsCode(err, wire.CodeInvalidTransition)) {
			t.w.log.Info("an earlier unanswered request did it", "job", t.id, "op", what)
			return nil
		}
		if IsLeaseLost(err) {
			t.lose()
			return err
		}
		if IsCode(err, wire.CodeTokenExpired) && renewals < 2 {
			renewals++
			if rerr := t.w.renew(t.w.hardCtx, used); rerr == nil {
				continue
			}
		}
		if !IsRetryable(err) || t.lost.Load() || t.w.hardCtx.Err() != nil {
			return err
		}
		var te *transportError
		if errors.As(err, &te) || afterUnanswered(err) {
			unanswered = true
		}
		d := backoffDelay(time.Second, 15*time.Second, attempt) + 200*time.Millisecond
		if now := time.Now(); now.Add(d).After(t.deadline()) || now.Add(d).After(start.Add(t.w.cfg.ReportPatience)) {
			return fmt.Errorf("%w (gave up: the lease runs out)", err)
		}
		t.w.log.Warn("retrying a report", "job", t.id, "op", what, "err", err, "in", d)
		if !sleep(t.w.hardCtx, d) {
			return err
		}
	}
}

// afterUnanswered reports whether err followed an unanswered attempt of
// the same call.
func afterUnanswered(err error) bool {
	var ue *unansweredError
	return errors.As(err, &ue)
}

// run accepts the job (unless the lease did), runs its handler and
// reports how it ended.
func (t *task) run(h HandlerFunc) {
	w := t.w
	end := JobEnd{Job: t.jobCopy()}
	defer func() {
		t.finish()
		w.remove(t)
		if end.Outcome != "" {
			w.ended(end)
		}
	}()

	if end.Job.State != wire.JobStateRunning {
		acc, err := t.accept()
		if err != nil {
			if !t.claim() {
				return
			}
			end.Outcome, end.Err = JobLost, err
			if !IsLeaseLost(err) && !IsCode(err, wire.CodeInvalidTransition) {
				// Not ours to run (blocked by the envelope since the lease, or
				// the server could not be reached in time): hand it back.
				if _, rerr := w.c.Release(w.hardCtx, t.id, wire.ReleaseRequest{LeaseToken: t.token, Reason: "not accepted: " + ErrorCode(err)}); rerr == nil {
					end.Outcome = JobReleased
				}
			}
			return
		}
		if acc.Job.ID != "" {
			t.mu.Lock()
			t.job = acc.Job
			t.mu.Unlock()
			end.Job = acc.Job
		}
		t.extend(acc.ExpiresAt)
	}
	if end.Job.CancelRequested {
		t.stop(ErrJobCanceled)
	}
	w.mu.Lock()
	draining := w.draining
	w.mu.Unlock()
	if draining {
		t.stop(ErrDrained) // leased just before the drain: hand it back unstarted
	}
	t.rep.seqBase = w.c.ServerNow().UnixMicro()

	stopFlusher := make(chan struct{})
	flusherDone := make(chan struct{})
	go func() {
		defer close(flusherDone)
		t.rep.loop(stopFlusher)
	}()
	var herr error
	if context.Cause(t.ctx) == nil {
		herr = t.call(h)
	} else {
		herr = context.Cause(t.ctx)
	}
	close(stopFlusher)
	<-flusherDone
	cause := context.Cause(t.ctx)

	if !t.claim() {
		return // the drain released it
	}
	end.Err = herr
	switch {
	case t.lost.Load():
		end.Outcome = JobLost
		return
	case (errors.Is(cause, ErrLeaseExpiring) || errors.Is(cause, ErrOffline)) && herr != nil:
		end.Outcome = JobLost
		reason := "lease could not be renewed"
		if errors.Is(cause, ErrOffline) {
			reason = "no heartbeat got through before the deadline"
		}
		ctx, cancel := context.WithTimeout(w.hardCtx, w.c.cfg.RequestTimeout)
		_, _ = w.c.Release(ctx, t.id, wire.ReleaseRequest{LeaseToken: t.token, Reason: reason})
		cancel()
		return
	}
	if err := t.persist("logs", false, t.rep.Flush); err != nil {
		if t.lost.Load() {
			end.Outcome, end.Err = JobLost, err
			return
		}
		w.log.Warn("log lines not delivered", "job", t.id, "err", err)
	}
	switch {
	case herr == nil:
		var out *wire.CompleteResponse
		req := t.rep.completeRequest()
		req.WaitForProofs = w.cfg.WaitForProofs
		err := t.persist("complete", false, func(ctx context.Context) error {
			var err error
			if w.completes != nil {
				out, err = w.completes.complete(ctx, t.id, req)
			} else {
				out, err = w.c.Complete(ctx, t.id, req)
			}
			return err
		})
		if out != nil && out.Job.ID == "" {
			// Answered in a batch, which does not repeat the job.
			out.Job = t.jobCopy()
			out.Job.State, out.Job.ReceiptID = wire.JobStateSucceeded, &out.ReceiptID
		}
		end.Outcome, end.Complete = JobSucceeded, out
		switch {
		case IsCode(err, wire.CodeJobCanceled):
			// Its cancel was requested: the server ended it canceled.
			end.Outcome, end.Err = JobCanceled, err
		case err != nil:
			end.Outcome, end.Err = t.failedReport(), err
		}
	case errors.Is(cause, ErrDrained):
		err := t.persist("release", true, func(ctx context.Context) error {
			_, err := w.c.Release(ctx, t.id, wire.ReleaseRequest{LeaseToken: t.token, Reason: "drain"})
			return err
		})
		end.Outcome = JobReleased
		if err != nil {
			end.Outcome, end.Err = t.failedReport(), err
		}
	default:
		req := wire.FailRequest{LeaseToken: t.token, ErrorCode: "handler_error", Message: truncate(herr.Error(), 4096),
			Retryable: !IsPermanent(herr)}
		end.Outcome = JobFailed
		var ce *codedError
		switch {
		case errors.Is(cause, ErrJobCanceled):
			req.ErrorCode, req.Retryable = "canceled", false
			end.Outcome = JobCanceled
		case errors.As(herr, &ce):
			req.ErrorCode = ce.code
		}
		var out *wire.FailResponse
		err := t.persist("fail", true, func(ctx context.Context) error {
			var err error
			out, err = w.c.Fail(ctx, t.id, req)
			return err
		})
		end.Fail = out
		if err != nil {
			end.Outcome, end.Err = t.failedReport(), errors.Join(herr, err)
		}
	}
}

// accept accepts the job (POST /workers/jobs/{id}/accept), persisting.
func (t *task) accept() (*wire.AcceptResponse, error) {
	var acc *wire.AcceptResponse
	err := t.persist("accept", false, func(ctx context.Context) error {
		var err error
		acc, err = t.w.c.Accept(ctx, t.id, wire.TokenRequest{LeaseToken: t.token})
		return err
	})
	if err == nil && acc == nil {
		err = errors.New("client: accept: no answer")
	}
	return acc, err
}

func (t *task) failedReport() JobOutcome {
	if t.lost.Load() {
		return JobLost
	}
	return JobAbandoned
}

// call runs the handler, turning a panic into an error.
func (t *task) call(h HandlerFunc) (err error) {
	defer func() {
		if p := recover(); p != nil {
			t.w.log.Error("handler panicked", "job", t.id, "panic", p, "stack", string(debug.Stack()))
			err = WithErrorCode("panic", fmt.Errorf("panic: %v", p))
		}
	}()
	job := t.jobCopy()
	return h(t.ctx, &job, t.rep)
}

func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n]
}
