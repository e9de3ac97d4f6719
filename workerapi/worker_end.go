package workerapi

import (
	"context"
	"errors"
	"fmt"
	"net/http"

	"github.com/nodelane/nodelane/lease"
	"github.com/nodelane/nodelane/receipts"
	"github.com/nodelane/nodelane/workerapi/wire"
)

// complete: POST /workers/jobs/{id}/complete. It mints the job_completed
// receipt and the job_charged receipt (id: the job_completed id and
// ".charge") with the state change, and answers with them once it
// commits; the background sequencer integrates them at its next cycle.
// Only with wait_for_proofs does it wait for that cycle, to answer with
// their proofs too: the sequencer's durable commit and signature are not
// in the latency of every completion. Completing again with the same
// lease token mints nothing and rebuilds the same answer from what was
// stored, with the proofs if the receipts are sequenced by then (see
// proofs). A job whose cancel was requested ends canceled instead
// (completeCanceled). The batch complete (complete_batch.go) completes
// each of its jobs with the same completeJob.
func (s *Server) complete(ctx context.Context, c *call) (int, any, error) {
	var req wire.CompleteRequest
	ref, err := c.decodeLeased(&req, &req.LeaseToken)
	if err != nil {
		return 0, nil, err
	}
	res, err := completeResult(&req)
	if err != nil {
		return 0, nil, err
	}
	out, refusal, err := s.completeJob(ctx, c, ref, res)
	if err != nil || refusal != nil {
		// On a refusal, completeCanceled has set c.then to answer it once
		// the job's end commits.
		return 0, nil, err
	}
	if req.WaitForProofs || sequenced(out) {
		c.then = func(ctx context.Context) (int, any, error) {
			s.proofs(ctx, req.WaitForProofs, out)
			return http.StatusOK, *out, nil
		}
	}
	return http.StatusOK, *out, nil
}

// completeResult is the lease.Result a complete's body reports.
func completeResult(req *wire.CompleteRequest) (lease.Result, error) {
	metrics, err := object("metrics", req.Metrics)
	if err != nil {
		return lease.Result{}, err
	}
	res := lease.Result{Metrics: metrics}
	if req.OutputURI != nil {
		res.OutputURI = *req.OutputURI
	}
	if req.FinalMessage != nil {
		res.FinalMessage = *req.FinalMessage
	}
	return res, nil
}

// completeJob completes ref's job with res in the transaction of ctx, and
// returns the answer with its receipts but without their proofs (proofs
// adds them after the commit). A repeat under the same lease token mints
// nothing and rebuilds the first answer. A job whose cancel was requested
// ends canceled (completeCanceled, which sets c.then to answer the
// refusal): completeJob then returns that refusal (lease.ErrCanceled), to
// be committed with the job's end and answered. Any err is to be rolled
// back.
func (s *Server) completeJob(ctx context.Context, c *call, ref lease.Ref, res lease.Result) (out *wire.CompleteResponse, refusal, err error) {
	// The job_completed receipt's id goes in with the completion, so the
	// job records it in the same write.
	if res.ReceiptID, err = newReceiptID(s.now(), s.cfg.Rand); err != nil {
		return nil, nil, err
	}
	j, repeated, err := s.leases.Complete(ctx, ref, res)
	if errors.Is(err, lease.ErrCanceled) && j != nil {
		if _, _, serr := s.completeCanceled(ctx, c, j, err); serr != nil {
			return nil, nil, serr
		}
		return nil, err, nil
	}
	if err != nil {
		return nil, nil, err
	}
	var (
		completedID string
		// minted are the job_completed and job_charged receipts, as stored.
		minted []*receipts.Stored
	)
	if repeated {
		if completedID = j.ReceiptID; completedID == "" {
			return nil, nil, fmt.Errorf("workerapi: completed job %s has no receipt", j.ID)
		}
		for _, id := range []string{completedID, chargeID(completedID)} {
			st, err := s.receipts.Get(ctx, id)
			if err != nil {
				return nil, nil, err
			}
			minted = append(minted, st)
		}
	} else {
		if minted, err = s.settle(ctx, c, j, res.ReceiptID); err != nil {
			return nil, nil, err
		}
		completedID = minted[0].ID
		if j.ReceiptID != completedID {
			// A lease.Store that does not write Result.ReceiptID.
			if j, err = s.leases.SetReceipt(ctx, j.ID, completedID); err != nil {
				return nil, nil, err
			}
		}
		if err := s.jobChanged(ctx, c, lease.StateRunning, j); err != nil {
			return nil, nil, err
		}
	}
	charge, err := minted[1].Receipt()
	if err != nil {
		return nil, nil, err
	}
	return &wire.CompleteResponse{
		Job:           wireJob(j),
		ActualMS:      charge.ActualMS,
		ActualHours:   receipts.Hours(charge.ActualMS),
		ActualCostUSD: receipts.FormatMicros(charge.CostMicros),
		ReceiptID:     completedID,
		Receipts:      []receipts.WireReceipt{minted[0].Wire(), minted[1].Wire()},
		Proofs:        []receipts.Proof{},
	}, nil, nil
}

// settle mints the receipts of a completion, and returns them as stored:
// job_completed, with id, and job_charged for the time from accept to
// completion on the job's GPUs (its gpu_count, or 1 for a job with none
// that ran on a GPU SKU) at the price snapshotted on its lease.
func (s *Server) settle(ctx context.Context, c *call, j *lease.Job, id string) ([]*receipts.Stored, error) {
	ch, err := jobCharge(j)
	if err != nil {
		return nil, err
	}
	snap, err := s.gate.Snapshot(ctx)
	if err != nil {
		return nil, err
	}
	done := receipts.Receipt{
		ID: id, Kind: receipts.KindJobCompleted,
		JobID: j.ID, WorkerID: j.Lease.WorkerID, JobType: j.Type, LeaseEpoch: j.Lease.Epoch, LeaseID: j.Lease.ID,
		Attempt: int64(j.Attempt), StartedAt: *j.AcceptedAt, EndedAt: *j.FinishedAt,
		ActualMS: ch.ActualMS, GPUCount: ch.GPUCount, Charged: receipts.ChargedYes,
	}
	if r := j.Result; r != nil {
		done.OutputURI = r.OutputURI
		if len(r.Metrics) > 0 {
			if done.MetricsSHA256, err = payloadHash(r.Metrics); err != nil {
				return nil, err
			}
		}
	}
	cr := ch.Receipt(j.ID, j.Lease.WorkerID, j.Lease.SKU)
	cr.ID, cr.LeaseID = chargeID(id), j.Lease.ID
	return s.mintAllFor(ctx, c, snap, done, cr)
}

// proofs adds to the answers outs the proofs of their receipts, all
// against one signed checkpoint, after the completions committed. With
// wait it waits for them (awaitProofs: the background sequencer, woken,
// or this request itself without Start) up to Config.ProofWait; if the
// wait runs out the answers keep their receipts without proofs: the
// completions committed, and repeating them returns them. Without wait
// it reads the proofs from the store once, if every receipt of outs is
// sequenced already (a repeat, see sequenced), and adds nothing if they
// are not all covered by the latest checkpoint.
func (s *Server) proofs(ctx context.Context, wait bool, outs ...*wire.CompleteResponse) {
	var ids []string
	for _, out := range outs {
		for _, r := range out.Receipts {
			ids = append(ids, r.ID)
		}
	}
	if len(ids) == 0 {
		return
	}
	var (
		ss  []*receipts.Stored
		ps  []receipts.Proof
		cp  *receipts.Checkpoint
		err error
	)
	if wait {
		ss, ps, cp, err = s.awaitProofs(ctx, ids)
	} else {
		ss, ps, cp, err = s.receipts.ProveAll(ctx, ids...)
	}
	if err != nil {
		if wait || !errors.Is(err, receipts.ErrNotSequenced) {
			s.log.Warn("answering a completion without proofs", "receipts", ids, "err", err)
		}
		return
	}
	k := 0
	for _, out := range outs {
		for i := range out.Receipts {
			out.Receipts[i] = ss[k].Wire()
			out.Proofs = append(out.Proofs, ps[k])
			k++
		}
		out.Checkpoint = string(cp.Note)
	}
}

// sequenced reports whether every receipt of out has its index: those of
// a repeated completion, which proofs can prove without waiting.
func sequenced(out *wire.CompleteResponse) bool {
	for _, r := range out.Receipts {
		if r.Index == nil {
			return false
		}
	}
	return len(out.Receipts) > 0
}

// failJob: POST /workers/jobs/{id}/fail. No charge: a job_failed receipt
// says how the attempt ended (requeued, failed or canceled).
func (s *Server) failJob(ctx context.Context, c *call) (int, any, error) {
	var req wire.FailRequest
	ref, err := c.decodeLeased(&req, &req.LeaseToken)
	if err != nil {
		return 0, nil, err
	}
	if req.ErrorCode == "" {
		// error_code is optional, as in the v0.2 contract.
		req.ErrorCode = "unspecified"
	}
	payload, err := object("payload", req.Payload)
	if err != nil {
		return 0, nil, err
	}
	// A repeat under the same lease token gets the first answer.
	k, err := tokenKeyFor(c, "fail", ref, req)
	if err != nil {
		return 0, nil, err
	}
	if code, out, ok, err := s.recall(ctx, k); err != nil || ok {
		return code, out, err
	}
	before, err := s.leases.Get(ctx, ref.JobID)
	if err != nil {
		return 0, nil, err
	}
	j, err := s.leases.Fail(ctx, ref, lease.Failure{
		Code: req.ErrorCode, Message: req.Message, Payload: payload, Retryable: req.Retryable,
	})
	if err != nil {
		return 0, nil, err
	}
	r, err := attemptFailed(j, req.ErrorCode, j.LastError.Attempt, j.LastError.At)
	if err != nil {
		return 0, nil, err
	}
	outcome := r.Outcome
	if r.PayloadSHA256, err = payloadHash(payload); err != nil {
		return 0, nil, err
	}
	rid, j, err := s.settleFailure(ctx, c, j, r)
	if err != nil {
		return 0, nil, err
	}
	if err := s.jobChanged(ctx, c, before.State, j); err != nil {
		return 0, nil, err
	}
	out := wire.FailResponse{Job: wireJob(j), Requeued: outcome == receipts.OutcomeRequeued, ReceiptID: rid}
	if err := s.remember(ctx, c, k, http.StatusOK, out, s.answerExpiry()); err != nil {
		return 0, nil, err
	}
	return http.StatusOK, out, nil
}

// settleFailure mints a job_failed receipt and, when the job is back in
// the queue, wakes long-polls; when it ended, records the receipt on it.
func (s *Server) settleFailure(ctx context.Context, c *call, j *lease.Job, r receipts.Receipt) (string, *lease.Job, error) {
	snap, err := s.gate.Snapshot(ctx)
	if err != nil {
		return "", nil, err
	}
	st, err := s.mintFor(ctx, c, snap, r)
	if err != nil {
		return "", nil, err
	}
	if j.State == lease.StateQueued {
		return st.ID, j, s.st.Notifier.Notify(ctx)
	}
	j, err = s.leases.SetReceipt(ctx, j.ID, st.ID)
	return st.ID, j, err
}

// codeReleased is the error_code of the job_failed receipt of a release.
const codeReleased = "released"

// release: POST /workers/jobs/{id}/release. The job goes back to the
// queue at once, without using an attempt, and long-polls wake; a job
// whose cancel was requested ends canceled instead. Either way the lease's
// end mints a job_failed receipt (error_code "released", outcome requeued
// or canceled).
func (s *Server) release(ctx context.Context, c *call) (int, any, error) {
	var req wire.ReleaseRequest
	ref, err := c.decodeLeased(&req, &req.LeaseToken)
	if err != nil {
		return 0, nil, err
	}
	// A repeat under the same lease token gets the first answer.
	k, err := tokenKeyFor(c, "release", ref, req)
	if err != nil {
		return 0, nil, err
	}
	if code, out, ok, err := s.recall(ctx, k); err != nil || ok {
		return code, out, err
	}
	before, err := s.leases.Get(ctx, ref.JobID)
	if err != nil {
		return 0, nil, err
	}
	j, err := s.leases.Release(ctx, ref, req.Reason)
	if err != nil {
		return 0, nil, err
	}
	// Every lease's end is a receipt, a release's too (before accept as
	// after): job_failed, error_code "released", outcome requeued, or
	// canceled when the job's cancel was requested.
	ended := j.ScheduledAt
	if j.FinishedAt != nil {
		ended = *j.FinishedAt
	}
	r, err := attemptFailed(j, codeReleased, j.Attempt, ended)
	if err != nil {
		return 0, nil, err
	}
	if _, j, err = s.settleFailure(ctx, c, j, r); err != nil {
		return 0, nil, err
	}
	if err := s.jobChanged(ctx, c, before.State, j); err != nil {
		return 0, nil, err
	}
	out := wire.JobResponse{Job: wireJob(j)}
	if err := s.remember(ctx, c, k, http.StatusOK, out, s.answerExpiry()); err != nil {
		return 0, nil, err
	}
	return http.StatusOK, out, nil
}
