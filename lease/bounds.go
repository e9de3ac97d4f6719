package lease

import (
	"errors"
	"time"
)

// Every lease is bounded twice over, whatever its worker does: a cancel
// request leaves it at most Config.CancelGrace to live, and no extension
// carries a running lease past the job's max runtime. Both bounds are
// written into Lease.ExpiresAt, so every Store's ExpiredJobs finds the
// lease when a bound passes, and the Manager's lazy checks refuse it at
// once, as they refuse any lease past its expiry.

// MaxRuntimeLimit is the largest max runtime a job
// (Requirements.MaxRuntimeSeconds) or a Manager (Config.MaxRuntime) may
// set: 30 days.
const MaxRuntimeLimit = 30 * 24 * time.Hour

// CodeMaxRuntimeExceeded is the LastError code of a job whose lease ran
// into its max runtime: it ends failed, whatever attempts it has left.
const CodeMaxRuntimeExceeded = "max_runtime_exceeded"

// ErrCanceled is returned by Complete on a job whose cancel was requested, or that
// ended canceled. The job does not succeed: a job with a live cancel
// request ends canceled (see Complete).
var ErrCanceled = errors.New("lease: job canceled")

// runtimeOf is how long j may run under one lease, from accept: its
// Requirements.MaxRuntimeSeconds, or def (the Manager's
// Config.MaxRuntime) when it names none.
func runtimeOf(j *Job, def time.Duration) time.Duration {
	if s := j.Requirements.MaxRuntimeSeconds; s > 0 {
		return time.Duration(s) * time.Second
	}
	return def
}

// liveAt reports whether j holds a lease that is live at now: leased or
// running, before its expiry, before its accept deadline while not
// accepted, and, running, short of its max runtime (def when it names
// none). It is the liveness guard of every write under a lease.
func liveAt(j *Job, now time.Time, def time.Duration) bool {
	return j.State.Live() && j.Lease != nil && now.Before(j.Lease.ExpiresAt) &&
		(j.State != StateLeased || now.Before(j.Lease.AcceptBy)) &&
		(j.State != StateRunning || j.AcceptedAt == nil || now.Before(j.AcceptedAt.Add(runtimeOf(j, def))))
}

// runtimeEnd is when j's running lease reaches its max runtime; ok is
// false for a job that is not running.
func (m *Manager) runtimeEnd(j *Job) (end time.Time, ok bool) {
	if j.State != StateRunning || j.AcceptedAt == nil {
		return time.Time{}, false
	}
	return j.AcceptedAt.Add(runtimeOf(j, m.cfg.MaxRuntime)), true
}

// extend renews j's lease for LeaseTTL from now, but never past the end
// of its max runtime. A lease whose cancel was requested is not extended:
// Cancel set its last expiry.
func (m *Manager) extend(j *Job, now time.Time) {
	if j.CancelRequested {
		return
	}
	j.Lease.ExpiresAt = now.Add(m.cfg.LeaseTTL)
	if end, ok := m.runtimeEnd(j); ok {
		j.Lease.ExpiresAt = minTime(j.Lease.ExpiresAt, end)
	}
}

// revokedBefore reports whether j's lease ran out (expired, or was
// revoked by a cancel's grace or the max runtime) before the job ended:
// the Manager, not the worker, ended it. A job its worker ended has a
// FinishedAt before its lease's expiry.
func revokedBefore(j *Job) bool {
	return j.Lease != nil && j.FinishedAt != nil && !j.FinishedAt.Before(j.Lease.ExpiresAt)
}
