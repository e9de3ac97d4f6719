package lease

import (
	"context"
	"errors"
	"fmt"
	"time"
)

// StatusRetired is the Worker.Status of a worker that Retire retired: it
// is never granted a job again, and a heartbeat does not change it.
const StatusRetired = "retired"

// CodeWorkerRetired is the LastError code of a job whose lease Retire
// ended because its worker was retired.
const CodeWorkerRetired = "worker_retired"

// EndedLease is a job whose live lease Retire ended: the state it was
// in, and the job as it is now.
type EndedLease struct {
	From State
	Job  *Job
}

// Retire retires a worker for good: its status becomes StatusRetired,
// which Lease never grants a job to and Heartbeat never changes, and
// every live lease it holds ends, its job going back to the queue
// without using an attempt (the worker did not fail it; an operator
// retired it) with LastError CodeWorkerRetired, or ending canceled when
// its cancel was requested. It returns the worker, whether it changed
// anything (false when the worker was retired already), and the jobs
// whose leases it ended, as they are now. Each lease's end goes through
// EndLease (Config.LeaseEnded). Run it in a transaction to make it
// atomic; without one, a lease granted while it runs may survive it.
func (m *Manager) Retire(ctx context.Context, workerID, reason string) (w *Worker, changed bool, ended []EndedLease, err error) {
	w, err = m.store.GetWorker(ctx, workerID)
	if err != nil {
		return nil, false, nil, err
	}
	if w.Status == StatusRetired {
		return w, false, nil, nil
	}
	w.Status = StatusRetired
	if err := m.store.PutWorker(ctx, w); err != nil {
		return nil, false, nil, err
	}
	m.forgetWorkers()
	msg := fmt.Sprintf("worker %s was retired", workerID)
	if reason != "" {
		msg += ": " + reason
	}
	err = m.eachLive(ctx, workerID, func(d *Job) error {
		var from State
		j, err := m.EndLease(ctx, d.ID, func(j *Job, now time.Time) (*Job, error) {
			from = j.State
			if !j.State.Live() || j.Lease == nil || j.Lease.WorkerID != workerID {
				return nil, nil
			}
			j.LastError = &JobError{Code: CodeWorkerRetired, Attempt: j.Attempt, At: now, Message: msg}
			if j.CancelRequested {
				finish(j, StateCanceled, now)
			} else {
				m.requeue(j, now, false)
			}
			j.Lease.ExpiresAt = minTime(j.Lease.ExpiresAt, now) // the lease ends here
			return j, nil
		})
		if err != nil && !errors.Is(err, ErrNotFound) {
			return err
		}
		if j != nil {
			ended = append(ended, EndedLease{From: from, Job: j})
		}
		return nil
	})
	if err != nil {
		return nil, false, nil, err
	}
	return w, true, ended, nil
}
