package lease

import (
	"context"
	"encoding/json"
	"time"
)

// HeartbeatStore is a Store that records a heartbeat in one write of
// what it changes, rather than Manager.Heartbeat's read of the worker and
// PutWorker of all of it. bunstore's LeaseStore and the MemoryStore
// implement it.
type HeartbeatStore interface {
	// Heartbeat sets the stored worker id's LastSeenAt to at, its Status
	// to status unless status is "" or the worker is retired, and its
	// Metrics to metrics unless metrics is nil, and nothing else of it,
	// and returns the worker as stored then. ErrNotFound if there is no
	// such worker.
	Heartbeat(ctx context.Context, id, status string, metrics json.RawMessage, at time.Time) (*Worker, error)
}
