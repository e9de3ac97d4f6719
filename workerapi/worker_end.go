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

// completeJob completes ref's job with res in the transaction of ctx, as
// completeJobs does, and returns its answer or its refusal.
func (s *Server) completeJob(ctx context.Context, c *call, ref lease.Ref, res lease.Result) (out *wire.CompleteResponse, refusal, err error) {
	cs := []lease.Completion{{Ref: ref, Result: res}}
	outs, err := s.completeJobs(ctx, c, cs)
	if err != nil {
		return nil, nil, err
	}
	return outs[0], cs[0].Err, nil
}

// completeJobs completes each of cs in the transaction of ctx
// (lease.Manager.CompleteAll: those whose lease holds in one write) and
// returns the answers, each with its receipts but without their proofs
// (proofs adds them after the commit); the receipts of all are minted in
// one store call. A repeat under the same lease token mints nothing and
// rebuilds the first answer. A job whose cancel was requested ends
// canceled (completeCanceled, which sets c.then to answer the refusal):
// its answer is nil and its Err the refusal (lease.ErrCanceled), to be
// committed with the job's end and answered. Any other refusal of any of
// cs is returned as err; any err is to be rolled back.
func (s *Server) completeJobs(ctx context.Context, c *call, cs []lease.Completion) ([]*wire.CompleteResponse, error) {
	for i := range cs {
		// The job_completed receipt's id goes in with the completion, so
		// the job records it in the same write.
		id, err := newReceiptID(s.now(), s.cfg.Rand)
		if err != nil {
			return nil, err
		}
		cs[i].Result.ReceiptID = id
	}
	if err := s.leases.CompleteAll(ctx, cs); err != nil {
		return nil, err
	}
	// minted[i] are the job_completed and job_charged receipts of cs[i],
	// as stored; fresh are the completions that mint them.
	minted := make([][]*receipts.Stored, len(cs))
	// charges[i] is the job_charged receipt of a fresh completion, as
	// minted: the answer's figures, without decoding what was encoded.
	charges := make([]*receipts.Receipt, len(cs))
	var (
		fresh []int
		mint  []receipts.Receipt
	)
	for i := range cs {
		cp := &cs[i]
		switch {
		case errors.Is(cp.Err, lease.ErrCanceled) && cp.Job != nil:
			if _, _, err := s.completeCanceled(ctx, c, cp.Job, cp.Err); err != nil {
				return nil, err
			}
		case cp.Err != nil:
			return nil, cp.Err
		case cp.Repeated:
			id := cp.Job.ReceiptID
			if id == "" {
				return nil, fmt.Errorf("workerapi: completed job %s has no receipt", cp.Job.ID)
			}
			for _, id := range []string{id, chargeID(id)} {
				st, err := s.receipts.Get(ctx, id)
				if err != nil {
					return nil, err
				}
				minted[i] = append(minted[i], st)
			}
		default:
			rs, err := settlement(cp.Job, cp.Result.ReceiptID)
			if err != nil {
				return nil, err
			}
			fresh, mint = append(fresh, i), append(mint, rs...)
		}
	}
	if len(mint) > 0 {
		snap, err := s.gate.Snapshot(ctx)
		if err != nil {
			return nil, err
		}
		ss, err := s.mintAllFor(ctx, c, snap, mint...)
		if err != nil {
			return nil, err
		}
		for k, i := range fresh {
			cp := &cs[i]
			minted[i], charges[i] = ss[2*k:2*k+2], &mint[2*k+1]
			if cp.Job.ReceiptID != minted[i][0].ID {
				// A lease.Store that does not write Result.ReceiptID.
				if cp.Job, err = s.leases.SetReceipt(ctx, cp.Job.ID, minted[i][0].ID); err != nil {
					return nil, err
				}
			}
			if err := s.jobChanged(ctx, c, lease.StateRunning, cp.Job); err != nil {
				return nil, err
			}
		}
	}
	outs := make([]*wire.CompleteResponse, len(cs))
	for i := range cs {
		if minted[i] == nil {
			continue
		}
		charge := charges[i]
		if charge == nil {
			var err error
			if charge, err = minted[i][1].Receipt(); err != nil {
				return nil, err
			}
		}
		outs[i] = &wire.CompleteResponse{
			Job:           wireJob(cs[i].Job),
			ActualMS:      charge.ActualMS,
			ActualHours:   receipts.Hours(charge.ActualMS),
			ActualCostUSD: receipts.FormatMicros(charge.CostMicros),
			ReceiptID:     minted[i][0].ID,
			Receipts:      []receipts.WireReceipt{minted[i][0].Wire(), minted[i][1].Wire()},
			Proofs:        []receipts.Proof{},
		}
	}
	return outs, nil
}

// settlement is the receipts of a completion, to be minted: job_completed,
// with id, and job_charged for the time from accept to completion on the
// job's GPUs (its gpu_count, or 1 for a job with none that ran on a GPU
// SKU) at the price snapshotted on its lease.
func settlement(j *lease.Job, id string) ([]receipts.Receipt, error) {
	ch, err := jobCharge(j)
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
	return []receipts.Receipt{done, cr}, nil
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
