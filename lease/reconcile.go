package lease

import (
	"context"
	"errors"
	"fmt"
	"time"
)

// The LastError codes of a job whose lease Reconcile ended.
const (
	// CodeWorkerRestarted means the worker started (or registered) again and
	// did not list the job among those it holds.
	CodeWorkerRestarted = "worker_restarted"
	// CodeNotHeld means a heartbeat of the worker did not list the job,
	// although the lease was granted before the newest lease answer the
	// worker had processed.
	CodeNotHeld = "not_held"
)

// Reconciliation is what a worker says it holds, for Reconcile.
type Reconciliation struct {
	// WorkerID is the worker whose leases are reconciled.
	WorkerID string
	// Held are the jobs the worker holds: every live lease of the worker
	// on a job not listed here is ended (unless GrantedThrough spares it).
	Held []string
	// GrantedThrough, when not zero, spares every lease granted after it
	// (Job.LeasedAt later than GrantedThrough, in the Manager's clock):
	// the worker may not have heard of those yet. Zero ends every lease
	// not held, whenever it was granted.
	GrantedThrough time.Time
	// Code is the LastError code of each job whose lease ends:
	// CodeWorkerRestarted or CodeNotHeld (1 to 128 bytes).
	Code string
}

// Reconcile ends every live lease of worker r.WorkerID on a job that is
// not in r.Held (and, when r.GrantedThrough is set, that was granted at
// or before it), as ExpireOffline ends an offline worker's leases: the
// job goes back to the queue with LastError r.Code, using an attempt
// only if it had been accepted (with a backoff, and ending failed when
// none is left), and a job whose cancel was requested ends canceled. The
// old token is lost from then on. Each job is re-checked as it is
// written (still live, under the same lease of the same worker), through
// EndLease, so Config.LeaseEnded runs with each write. It returns the jobs whose
// leases it ended, as written, in id order. Run it in a transaction to
// make it atomic. ErrInvalidArgument for an empty worker id or code.
func (m *Manager) Reconcile(ctx context.Context, r Reconciliation) ([]*Job, error) {
	if r.WorkerID == "" || r.Code == "" || len(r.Code) > MaxTypeLen {
		return nil, fmt.Errorf("%w: a reconciliation needs a worker id and a code of 1 to %d bytes", ErrInvalidArgument, MaxTypeLen)
	}
	through := r.GrantedThrough.UTC()
	held := make(map[string]bool, len(r.Held))
	for _, id := range r.Held {
		held[id] = true
	}
	msg := fmt.Sprintf("worker %s restarted without the job", r.WorkerID)
	if r.Code == CodeNotHeld {
		msg = fmt.Sprintf("worker %s no longer holds the job", r.WorkerID)
	}
	var ended []*Job
	err := m.eachLive(ctx, r.WorkerID, func(d *Job) error {
		if held[d.ID] || d.Lease == nil {
			return nil
		}
		j, err := m.EndLease(ctx, d.ID, func(j *Job, now time.Time) (*Job, error) {
			if !j.State.Live() || j.Lease == nil || j.Lease.Epoch != d.Lease.Epoch || j.Lease.WorkerID != r.WorkerID {
				return nil, nil
			}
			if !through.IsZero() && (j.LeasedAt == nil || j.LeasedAt.After(through)) {
				return nil, nil // granted after the worker last heard: spared
			}
			j.LastError = &JobError{Code: r.Code, Attempt: j.Attempt, At: now, Message: msg}
			m.dropLease(j, now)
			return j, nil
		})
		if err != nil && !errors.Is(err, ErrNotFound) {
			return err
		}
		if j != nil {
			ended = append(ended, j)
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	return ended, nil
}
