package lease

import (
	"context"
	"fmt"
)

// DrainStore is a Store that keeps operators' drain requests
// (Worker.Drain). bunstore's LeaseStore and the MemoryStore implement it.
// Its PutWorker keeps the Drain of a stored worker, whatever w.Drain
// holds, as it keeps the Approval: only SetDrain changes it.
type DrainStore interface {
	// SetDrain replaces the Drain of the stored worker id, and nothing
	// else of it (nil clears it). ErrNotFound if there is no such worker.
	SetDrain(ctx context.Context, id string, d *DrainRequest) error
}

// ReasonDraining means an operator asked the worker to drain (Worker.Drain),
// so it is granted nothing until the request is withdrawn.
const ReasonDraining ReasonCode = "draining"

// SetDrain sets (drain true) or withdraws (false) the operator's request
// that worker workerID drain, made by by: while it stands, Lease grants
// the worker nothing, and it keeps the jobs it holds. It returns the
// worker and whether anything changed (requesting a drain of a worker
// that drains already changes nothing, and keeps the first request's
// time). ErrNotFound for an unknown worker; ErrInvalidArgument when the
// Manager's store is not a DrainStore.
func (m *Manager) SetDrain(ctx context.Context, workerID string, drain bool, by string) (*Worker, bool, error) {
	ds, ok := m.store.(DrainStore)
	if !ok {
		return nil, false, fmt.Errorf("%w: this control plane's storage keeps no drain requests", ErrInvalidArgument)
	}
	w, err := m.store.GetWorker(ctx, workerID)
	if err != nil {
		return nil, false, err
	}
	if (w.Drain != nil) == drain {
		return w, false, nil
	}
	var d *DrainRequest
	if drain {
		d = &DrainRequest{At: m.now(), By: by}
	}
	if err := ds.SetDrain(ctx, w.ID, d); err != nil {
		return nil, false, err
	}
	w.Drain = d
	m.forgetWorkers()
	return w, true, nil
}
