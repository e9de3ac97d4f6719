package workerapi

import (
	"encoding/json"

	"github.com/nodelane/nodelane/lease"
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
