package workerapi

import (
	"encoding/json"
	"fmt"

	"github.com/nodelane/nodelane/lease"
	"github.com/nodelane/nodelane/receipts"
	"github.com/nodelane/nodelane/workerapi/wire"
)

// wireJob turns a lease.Job into its wire form.
func wireJob(j *lease.Job) wire.Job {
	w := wire.Job{
		ID:              j.ID,
		JobType:         j.Type,
		Payload:         j.Payload,
		Requirements:    wire.Requirements(j.Requirements),
		State:           string(j.State),
		Attempt:         j.Attempt,
		MaxAttempts:     j.MaxAttempts,
		Priority:        j.Priority,
		CreatedAt:       j.CreatedAt,
		ScheduledAt:     j.ScheduledAt,
		LeasedAt:        j.LeasedAt,
		AcceptedAt:      j.AcceptedAt,
		FinishedAt:      j.FinishedAt,
		CancelRequested: j.CancelRequested,
	}
	if w.Requirements.Tags == nil {
		w.Requirements.Tags = []string{}
	}
	if len(w.Payload) == 0 {
		w.Payload = json.RawMessage(`{}`)
	}
	if j.ReceiptID != "" {
		id := j.ReceiptID
		w.ReceiptID = &id
	}
	if e := j.LastError; e != nil {
		w.LastError = &wire.JobError{Code: e.Code, Message: e.Message, Attempt: e.Attempt, At: e.At, Payload: e.Payload}
	}
	if l := j.Lease; l != nil {
		id, pv := l.WorkerID, l.PolicyVersion
		w.WorkerID, w.PolicyVersion = &id, &pv
	}
	return w
}

// operatorJob is the operator view of j: the job and its charge. The
// charge is computed from the job row as settle computed it when the job
// completed (the accept and finish times, the GPUs and the price its
// lease snapshotted), so it equals the job's job_charged receipt without
// reading it; a job that is not charged (any but a succeeded job with a
// receipt) has none.
func operatorJob(j *lease.Job) wire.OperatorJob {
	out := wire.OperatorJob{Job: wireJob(j)}
	if j.State != lease.StateSucceeded || j.ReceiptID == "" {
		return out
	}
	ch, err := jobCharge(j)
	if err != nil {
		return out
	}
	ms, hours, usd, micros := ch.ActualMS, ch.ActualHours, ch.ActualCostUSD, ch.CostMicros
	out.ActualMS, out.ActualHours, out.ActualCostUSD, out.ActualCostMicroUSD = &ms, &hours, &usd, &micros
	return out
}

// jobCharge is the charge of a completed job: the time from accept to
// completion on the job's GPUs (its gpu_count, or 1 for a job with none
// that ran on a GPU SKU) at the price snapshotted on its lease.
func jobCharge(j *lease.Job) (*receipts.Charge, error) {
	if j.AcceptedAt == nil || j.FinishedAt == nil || j.Lease == nil {
		return nil, fmt.Errorf("workerapi: completed job %s lacks its accept or finish time", j.ID)
	}
	gpus := int64(j.Requirements.GPUCount)
	if gpus == 0 && j.Lease.SKU != "" {
		gpus = 1
	}
	return receipts.NewCharge(*j.AcceptedAt, *j.FinishedAt, gpus, j.Lease.PriceMicroUSD)
}
