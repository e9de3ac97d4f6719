package workerapi

import (
	"context"

	"github.com/nodelane/nodelane/lease"
)

// completedAfterCancel is the error_code of the job_failed receipt of a
// job that its worker completed after its cancel was requested, as
// "released" is that of a release after a cancel.
const completedAfterCancel = "completed"

// completeCanceled settles a complete whose job's cancel was requested:
// lease.Manager.Complete ended the job canceled instead of succeeded, and
// refused with err (lease.ErrCanceled). It is the one refusal that
// changes state. The job's end commits with the request, with a
// job_failed receipt (outcome canceled, error_code "completed") and no
// charge, as a release after a cancel does; then the answer is 409
// job_canceled. Were it rolled back as other refusals are, a worker that
// ignores the cancel would keep the lease until its grace ran out and
// could complete again; ended now, the job is never charged, its slot is
// free, and any later complete with the token gets job_canceled again.
func (s *Server) completeCanceled(ctx context.Context, c *call, j *lease.Job, err error) (int, any, error) {
	from := lease.StateLeased
	if j.AcceptedAt != nil {
		// A lease grant clears AcceptedAt: this lease's worker accepted it.
		from = lease.StateRunning
	}
	r, serr := attemptFailed(j, completedAfterCancel, j.Attempt, *j.FinishedAt)
	if serr != nil {
		return 0, nil, serr
	}
	_, j, serr = s.settleFailure(ctx, c, j, r)
	if serr != nil {
		return 0, nil, serr
	}
	if serr := s.jobChanged(ctx, c, from, j); serr != nil {
		return 0, nil, serr
	}
	c.then = func(context.Context) (int, any, error) { return 0, nil, err }
	return 0, nil, nil
}
