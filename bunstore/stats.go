package bunstore

import (
	"context"
	"fmt"
	"time"

	"github.com/uptrace/bun"

	"github.com/nodelane/nodelane/lease"
)

var _ lease.StatsCounter = (*LeaseStore)(nil)

// CountJobs implements lease.StatsCounter in one statement: a GROUP BY
// over the jobs in states queued, leased and running, read through the
// index on (state, id), so that its cost follows the queue's depth, not
// the history the table keeps.
func (s *LeaseStore) CountJobs(ctx context.Context) ([]lease.JobCount, error) {
	var rows []struct {
		State string `bun:"state"`
		Type  string `bun:"type"`
		N     int    `bun:"n"`
	}
	err := s.db.idb(ctx).NewSelect().TableExpr("nodelane_jobs").
		ColumnExpr("state, type, COUNT(*) AS n").
		Where("state IN (?)", bun.List([]lease.State{lease.StateQueued, lease.StateLeased, lease.StateRunning})).
		GroupExpr("state, type").
		Scan(ctx, &rows)
	if err != nil {
		return nil, fmt.Errorf("bunstore: count jobs: %w", aborted(err))
	}
	out := make([]lease.JobCount, len(rows))
	for i, r := range rows {
		out[i] = lease.JobCount{State: lease.State(r.State), Type: r.Type, N: r.N}
	}
	return out, nil
}

// CountWorkers implements lease.StatsCounter in one statement.
func (s *LeaseStore) CountWorkers(ctx context.Context, onlineSince, offlineAt time.Time) (online, stale, offline int, err error) {
	var row struct {
		Online  int `bun:"online"`
		Offline int `bun:"offline"`
		N       int `bun:"n"`
	}
	on, off := micros(onlineSince), micros(offlineAt)
	err = s.db.idb(ctx).NewSelect().TableExpr("nodelane_workers").
		ColumnExpr("COALESCE(SUM(CASE WHEN last_seen_at <= ? THEN 1 ELSE 0 END), 0) AS offline", off).
		ColumnExpr("COALESCE(SUM(CASE WHEN last_seen_at > ? AND last_seen_at >= ? THEN 1 ELSE 0 END), 0) AS online", off, on).
		ColumnExpr("COUNT(*) AS n").
		Scan(ctx, &row)
	if err != nil {
		return 0, 0, 0, fmt.Errorf("bunstore: count workers: %w", aborted(err))
	}
	return row.Online, row.N - row.Online - row.Offline, row.Offline, nil
}
