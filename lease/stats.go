package lease

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"
)

// Stats counts the queue and the fleet at one instant, for a host's
// metrics (workerapi reads it when its metrics are scraped).
type Stats struct {
	// Jobs are the jobs in states queued, leased and running, by state
	// and job type, in state then type order; a pair with no job is
	// missing. Ended jobs are not counted: the queue's depth does not
	// grow with its history.
	Jobs []JobCount
	// Workers are the registered workers by liveness (LivenessOnline,
	// LivenessStale, LivenessOffline); each of the three is present.
	Workers map[Liveness]int
}

// JobCount is how many jobs are in one state and of one type.
type JobCount struct {
	State State
	Type  string
	N     int
}

// StatsCounter is a Store that counts its jobs and workers for Stats in
// a bounded number of statements, whatever the size of the tables.
// MemoryStore and bunstore implement it.
type StatsCounter interface {
	// CountJobs returns the jobs in states queued, leased and running,
	// by state and type, in any order (Stats sorts them).
	CountJobs(ctx context.Context) ([]JobCount, error)
	// CountWorkers counts the workers: offline those last seen at or
	// before offlineAt; online the others last seen at or after
	// onlineSince; stale the rest.
	CountWorkers(ctx context.Context, onlineSince, offlineAt time.Time) (online, stale, offline int, err error)
}

// ErrNoStats is returned by Stats when the Store does not implement
// StatsCounter.
var ErrNoStats = errors.New("lease: the store does not count jobs and workers (StatsCounter)")

// Stats counts the live and queued jobs by state and type, and the
// workers by liveness (as Liveness reads them now), through the Store's
// StatsCounter: two bounded statements on a SQL store. It returns an
// error wrapping ErrNoStats if the Store is no StatsCounter.
func (m *Manager) Stats(ctx context.Context) (*Stats, error) {
	sc, ok := m.store.(StatsCounter)
	if !ok {
		return nil, ErrNoStats
	}
	jobs, err := sc.CountJobs(ctx)
	if err != nil {
		return nil, fmt.Errorf("lease: stats: %w", err)
	}
	now := m.now()
	h := m.cfg.HeartbeatInterval
	online, stale, offline, err := sc.CountWorkers(ctx, now.Add(-(h + h/2)), now.Add(-m.cfg.OfflineAfter))
	if err != nil {
		return nil, fmt.Errorf("lease: stats: %w", err)
	}
	slices.SortFunc(jobs, func(a, b JobCount) int {
		return cmp.Or(cmp.Compare(stateRank(a.State), stateRank(b.State)), strings.Compare(a.Type, b.Type))
	})
	return &Stats{Jobs: jobs, Workers: map[Liveness]int{
		LivenessOnline: online, LivenessStale: stale, LivenessOffline: offline,
	}}, nil
}

// stateRank orders the counted states as Stats lists them.
func stateRank(s State) int {
	switch s {
	case StateQueued:
		return 0
	case StateLeased:
		return 1
	}
	return 2
}

var _ StatsCounter = (*MemoryStore)(nil)

// CountJobs implements StatsCounter.
func (s *MemoryStore) CountJobs(context.Context) ([]JobCount, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	n := map[JobCount]int{} // keyed by state and type, N zero
	for _, j := range s.jobs {
		if j.State == StateQueued || j.State.Live() {
			n[JobCount{State: j.State, Type: j.Type}]++
		}
	}
	out := make([]JobCount, 0, len(n))
	for k, v := range n {
		k.N = v
		out = append(out, k)
	}
	return out, nil
}

// CountWorkers implements StatsCounter.
func (s *MemoryStore) CountWorkers(_ context.Context, onlineSince, offlineAt time.Time) (online, stale, offline int, err error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, w := range s.workers {
		switch {
		case !w.LastSeenAt.After(offlineAt):
			offline++
		case !w.LastSeenAt.Before(onlineSince):
			online++
		default:
			stale++
		}
	}
	return online, stale, offline, nil
}
