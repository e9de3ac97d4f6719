package lease

import (
	"context"
	"errors"
	"fmt"
	"time"
)

// DefaultHeartbeatInterval is the default of Config.HeartbeatInterval.
const DefaultHeartbeatInterval = 30 * time.Second

// CodeWorkerOffline is the LastError code of a job whose lease
// ExpireOffline ended because its worker went offline.
const CodeWorkerOffline = "worker_offline"

// Liveness says whether a worker is heartbeating. It is derived from
// Worker.LastSeenAt when read, never stored: nothing writes a worker on a
// timer.
type Liveness string

// The liveness of a worker last seen (registered or heartbeating) d ago,
// with the heartbeat interval h and Config.OfflineAfter o.
const (
	// LivenessOnline means d is at most h + h/2 (and below o): its heartbeats
	// arrive.
	LivenessOnline Liveness = "online"
	// LivenessStale means d is over h + h/2, below o: it missed a heartbeat.
	LivenessStale Liveness = "stale"
	// LivenessOffline means d is o or more: ExpireOffline ends its leases, and
	// Explain counts it out.
	LivenessOffline Liveness = "offline"
)

// Liveness returns w's liveness now.
func (m *Manager) Liveness(w *Worker) Liveness { return m.livenessAt(w, m.now()) }

func (m *Manager) livenessAt(w *Worker, now time.Time) Liveness {
	d := now.Sub(w.LastSeenAt)
	switch {
	case d >= m.cfg.OfflineAfter:
		return LivenessOffline
	case d <= m.cfg.HeartbeatInterval+m.cfg.HeartbeatInterval/2:
		return LivenessOnline
	}
	return LivenessStale
}

// OfflineAt is when w goes offline unless it is seen again: the deadline
// by which its next heartbeat must arrive.
func (m *Manager) OfflineAt(w *Worker) time.Time { return w.LastSeenAt.Add(m.cfg.OfflineAfter) }

// OfflineAfter returns Config.OfflineAfter, with its default applied.
func (m *Manager) OfflineAfter() time.Duration { return m.cfg.OfflineAfter }

// ExpireOffline ends the live leases of offline workers: a leased or
// running job whose worker was last seen Config.OfflineAfter ago or more,
// and that it leased (or accepted) that long ago too, goes back to the
// queue with LastError CodeWorkerOffline. Only a job that had been
// accepted uses an attempt (with a backoff, and ends failed when none is
// left); one whose cancel was requested ends canceled. The old token is
// lost from then on: the job is no longer live, and its next lease has a
// new epoch.
//
// It works in batches of a bounded size (one Store.OfflineJobs each), and
// re-checks every job as it writes it (still live under the same lease,
// and its worker still offline as last read), so a worker that came back,
// or a job that moved on, keeps what it has; several replicas may run it
// at once. Each end goes through EndLease (Config.LeaseEnded). It returns
// how many leases it ended.
func (m *Manager) ExpireOffline(ctx context.Context) (int, error) {
	total := 0
	for {
		n, found, err := m.expireOffline(ctx, expireBatch)
		total += n
		if err != nil || found < expireBatch || n == 0 {
			return total, err
		}
	}
}

// expireOffline ends the leases of one batch of at most limit jobs, and
// says how many it ended and how many the store found.
func (m *Manager) expireOffline(ctx context.Context, limit int) (ended, found int, err error) {
	due, err := m.store.OfflineJobs(ctx, m.now().Add(-m.cfg.OfflineAfter), limit)
	if err != nil {
		return 0, 0, err
	}
	// The liveness of each worker, read once per batch: a heartbeat since
	// the query keeps the worker's leases.
	offline := map[string]bool{}
	for _, d := range due {
		wid := d.Lease.WorkerID
		off, ok := offline[wid]
		if !ok {
			w, err := m.store.GetWorker(ctx, wid)
			if err != nil && !errors.Is(err, ErrNotFound) {
				return ended, len(due), err
			}
			off = err == nil && m.livenessAt(w, m.now()) == LivenessOffline
			offline[wid] = off
		}
		if !off {
			continue
		}
		written, err := m.EndLease(ctx, d.ID, func(j *Job, now time.Time) (*Job, error) {
			if !j.State.Live() || j.Lease == nil || j.Lease.Epoch != d.Lease.Epoch || j.Lease.WorkerID != wid ||
				!seenBefore(j, now.Add(-m.cfg.OfflineAfter)) {
				return nil, nil
			}
			j.LastError = &JobError{Code: CodeWorkerOffline, Attempt: j.Attempt, At: now,
				Message: fmt.Sprintf("worker %s went offline (no heartbeat for %v)", wid, m.cfg.OfflineAfter)}
			m.dropLease(j, now)
			return j, nil
		})
		if err != nil && !errors.Is(err, ErrNotFound) {
			return ended, len(due), err
		}
		if written != nil {
			ended++
		}
	}
	return ended, len(due), nil
}

// seenBefore reports whether j's lease was granted, and accepted if it
// was, at or before cutoff: a worker that leased or accepted it later was
// alive then.
func seenBefore(j *Job, cutoff time.Time) bool {
	last := j.LeasedAt
	if j.AcceptedAt != nil {
		last = j.AcceptedAt
	}
	return last != nil && !last.After(cutoff)
}
