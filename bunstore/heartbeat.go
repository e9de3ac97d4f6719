package bunstore

import (
	"context"
	"encoding/json"
	"fmt"
	"time"

	"github.com/uptrace/bun"

	"github.com/nodelane/nodelane/lease"
)

// Heartbeat implements lease.HeartbeatStore: one narrow UPDATE of the
// worker id's row (sql/*/heartbeat.sql) rather than a read and a write
// of all its columns.
func (s *LeaseStore) Heartbeat(ctx context.Context, id, status string, metrics json.RawMessage, at time.Time) (*lease.Worker, error) {
	var rows []workerRow
	err := s.write(ctx, func(ctx context.Context, idb bun.IDB) error {
		return s.db.scanBound(ctx, idb, s.db.sql.heartbeat,
			[]any{micros(at), status, lease.StatusRetired, text(metrics), id}, &rows)
	})
	if err != nil {
		return nil, fmt.Errorf("bunstore: heartbeat of worker %s: %w", id, aborted(err))
	}
	if len(rows) == 0 {
		return nil, fmt.Errorf("bunstore: heartbeat of worker %s: %w", id, lease.ErrNotFound)
	}
	return rows[0].worker()
}

var _ lease.HeartbeatStore = (*LeaseStore)(nil)
