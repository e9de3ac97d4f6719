package bunstore

import (
	"context"
	"encoding/json"
	"fmt"
	"time"

	"github.com/uptrace/bun"

	"github.com/nodelane/nodelane/lease"
)

// heartbeatSQL records a heartbeat in its worker's row, and nothing else
// of it: when it was seen, its status unless the heartbeat gives none or
// the worker retired, and its metrics unless the heartbeat gives none. It
// returns the row as written. A bound statement: one text for every
// heartbeat, prepared once per connection.
const heartbeatSQL = `UPDATE nodelane_workers SET last_seen_at = ?,
	status = CASE WHEN ? = '' OR status = ? THEN status ELSE ? END,
	metrics = COALESCE(?, metrics)
	WHERE id = ? RETURNING *`

// Heartbeat implements lease.HeartbeatStore: one narrow UPDATE of the
// worker id's row rather than a read and a write of all its columns.
func (s *LeaseStore) Heartbeat(ctx context.Context, id, status string, metrics json.RawMessage, at time.Time) (*lease.Worker, error) {
	var rows []workerRow
	err := s.write(ctx, func(ctx context.Context, idb bun.IDB) error {
		return s.db.scanBound(ctx, idb, heartbeatSQL,
			[]any{micros(at), status, lease.StatusRetired, status, text(metrics), id}, &rows)
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
