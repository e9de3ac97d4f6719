package workerapi

import (
	"context"
	"fmt"
	"time"

	"github.com/nodelane/nodelane/lease"
	"github.com/nodelane/nodelane/receipts"
)

// Every attempt's end is a receipt (PROTOCOL.md §6, §8): a lease that
// ends mints exactly one, job_completed for a success and job_failed for
// every other end, in the transaction of the write that ended it. The
// worker's own ends (complete, fail, release) mint theirs in their
// handlers; the ends the lease Manager makes without a request of the
// lease's worker (expiry, offline, retire, reconcile) go through
// lease.Config.LeaseEnded, which is leaseEnded here, run with its write in
// one transaction of lease.Config.InTx, which is endTx here.

// jobGPUs is how many GPUs a job's attempt holds, as charged: its
// gpu_count, or 1 for a job with none that ran on a GPU SKU.
func jobGPUs(j *lease.Job) int64 {
	gpus := int64(j.Requirements.GPUCount)
	if gpus == 0 && j.Lease != nil && j.Lease.SKU != "" {
		gpus = 1
	}
	return gpus
}

// attemptFailed is the job_failed receipt of the attempt whose lease the
// last write of j ended: j is the job as written, its Lease the lease
// that ended and its AcceptedAt when that lease was accepted (nil when it
// never was: then the receipt has no started_at and no actual_ms). code
// is the reason, attempt the attempt that ended and ended when. The
// outcome follows j's state; the attempt's GPU time is never charged.
func attemptFailed(j *lease.Job, code string, attempt int, ended time.Time) (receipts.Receipt, error) {
	outcome := receipts.OutcomeFailed
	switch j.State {
	case lease.StateQueued:
		outcome = receipts.OutcomeRequeued
	case lease.StateCanceled:
		outcome = receipts.OutcomeCanceled
	}
	r := receipts.Receipt{
		Kind: receipts.KindJobFailed, JobID: j.ID, WorkerID: j.Lease.WorkerID, JobType: j.Type,
		LeaseEpoch: j.Lease.Epoch, LeaseID: j.Lease.ID, Attempt: int64(attempt),
		ErrorCode: code, Outcome: outcome, EndedAt: ended,
		GPUCount: jobGPUs(j), Charged: receipts.ChargedNo,
	}
	if j.AcceptedAt != nil {
		r.StartedAt = *j.AcceptedAt
		// A replica's clock that moved back to the database's since the
		// accept must not make an end that no receipt can record (and
		// so an expiry that never commits): the attempt then lasted 0.
		if ended.Before(r.StartedAt) {
			ended, r.EndedAt = r.StartedAt, r.StartedAt
		}
		ms, err := receipts.DurationMS(r.StartedAt, ended)
		if err != nil {
			return receipts.Receipt{}, fmt.Errorf("workerapi: job %s: %w", j.ID, err)
		}
		r.ActualMS = ms
	}
	return r, nil
}

// endNotes carries, in the context of a lease end made outside a request
// (the maintainer), what to do once its transaction commits, and ctx, the
// context endTx was called with: without the transaction, which has ended
// by then.
type endNotes struct {
	ctx context.Context
	fs  []func()
}

type endNotesKey struct{}

// afterCommit runs f once the change being made in ctx commits: with the
// request's notes in a request, with endTx's outside one, else at once.
// f gets a context without ctx's transaction, which has ended by then:
// the request's, or the one endTx was called with.
func afterCommit(ctx context.Context, f func(ctx context.Context)) {
	if c := callFrom(ctx); c != nil {
		c.note(func() { f(context.WithoutCancel(c.r.Context())) })
		return
	}
	if n, ok := ctx.Value(endNotesKey{}).(*endNotes); ok {
		n.fs = append(n.fs, func() { f(n.ctx) })
		return
	}
	f(ctx)
}

// endTx is lease.Config.InTx: each server-side end of a lease and its
// receipt commit in one transaction of the Transactor, which joins a
// request's. Outside a request, the counts, logs and hook events of the
// end run once it committed.
func (s *Server) endTx(ctx context.Context, fn func(ctx context.Context) error) error {
	if callFrom(ctx) != nil || ctx.Value(endNotesKey{}) != nil {
		return s.st.Tx.InTx(ctx, fn)
	}
	n := &endNotes{ctx: ctx}
	err := s.st.Tx.InTx(context.WithValue(ctx, endNotesKey{}, n), func(ctx context.Context) error {
		n.fs = nil // a retried transaction starts again
		return fn(ctx)
	})
	if err == nil {
		for _, f := range n.fs {
			f()
		}
	}
	return err
}

// leaseEnded is lease.Config.LeaseEnded, the one hook every server-side
// end of a lease goes through (expiry, offline, retire, reconcile): in
// the transaction of the write, it mints the attempt's job_failed
// receipt (error_code the job's LastError code: lease_expired,
// accept_timeout, max_runtime_exceeded, worker_offline, worker_retired,
// worker_restarted, not_held, ...), records it as the job's receipt_id
// when the job ended, and, once the write commits, counts and logs the
// end (EventMetrics.ObserveLeases LeaseExpired, JobMetrics.ObserveJob
// and "job expired", except
// for a retirement, which the retire route logs), queues its
// ReceiptMinted hook and, for the maintainer's ends, wakes the worker's
// signals long-poll.
func (s *Server) leaseEnded(ctx context.Context, j *lease.Job) error {
	if j.Lease == nil || j.LastError == nil {
		return fmt.Errorf("workerapi: job %s ended a lease without a lease or a reason", j.ID)
	}
	r, err := attemptFailed(j, j.LastError.Code, j.LastError.Attempt, j.LastError.At)
	if err != nil {
		return err
	}
	st, err := s.mint(ctx, r)
	if err != nil {
		return err
	}
	if j.State.Terminal() {
		done, err := s.leases.SetReceipt(ctx, j.ID, st.ID)
		if err != nil {
			return err
		}
		*j = *done
	}
	minted, jc := *st, *j
	hook := func(ctx context.Context, h Hooks) { h.ReceiptMinted(ctx, minted) }
	if c := callFrom(ctx); c != nil {
		c.after(hook)
	} else {
		afterCommit(ctx, func(context.Context) { s.hooks.emit([]hookEvent{hook}) })
	}
	if callFrom(ctx) == nil {
		// The maintainer's end (expiry, offline): the worker's signals
		// long-poll, if it holds one open, hears of the lost job now
		// rather than at its next heartbeat. A request's ends are the
		// caller's own (reconcile) or signalled by their route (retire).
		wid := jc.Lease.WorkerID
		afterCommit(ctx, func(ctx context.Context) {
			if sn, ok := s.st.Notifier.(SignalNotifier); ok {
				if err := sn.NotifyWorker(context.WithoutCancel(ctx), wid); err != nil {
					s.log.Warn("waking a worker's signals long-poll", "worker", wid, "err", err)
				}
			}
		})
	}
	afterCommit(ctx, func(context.Context) {
		switch jc.LastError.Code {
		case lease.CodeWorkerRetired, lease.CodeWorkerRestarted, lease.CodeNotHeld:
			return // the retire, register, start and heartbeat routes log their ends
		}
		if em := s.events(); em != nil {
			em.ObserveLeases(LeaseExpired, 1)
		}
		s.logJob("expired", "", &jc)
		from := lease.StateLeased
		if jc.AcceptedAt != nil {
			from = lease.StateRunning
		}
		s.observeJob(from, &jc)
	})
	return nil
}
