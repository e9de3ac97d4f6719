package workerapi

import (
	"context"
	"fmt"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/nodelane/nodelane/envelope"
	"github.com/nodelane/nodelane/lease"
	"github.com/nodelane/nodelane/receipts"
	"github.com/nodelane/nodelane/workerapi/wire"
)

// Restart reconciliation and capabilities that follow the box
// (PROTOCOL.md §5.17). A worker that starts with a token it already has
// calls POST /workers/start with what it runs now and the jobs it holds
// (none, for a process that just started): the server records the new
// capabilities (a worker_updated receipt when they changed), and ends at
// once every lease it thinks the worker holds but the worker does not,
// rather than at the lease's expiry. A registration again with the same
// key does the same when it carries current_jobs, and a heartbeat with
// leases_through ends what the worker does not hold among the leases
// granted before the newest lease answer it processed.

// start: POST /workers/start.
func (s *Server) start(ctx context.Context, c *call) (int, any, error) {
	var req wire.StartRequest
	if err := c.decode(&req); err != nil {
		return 0, nil, err
	}
	switch {
	case req.CurrentJobs == nil:
		return 0, nil, invalid("current_jobs is required: the jobs the worker holds, [] for a process that just started")
	case req.GovernorLimits.MaxJobs < 0 || req.GovernorLimits.MaxVRAMMB < 0:
		return 0, nil, invalid("governor_limits must not be negative")
	}
	for _, g := range req.Capabilities.GPUs {
		if g.VRAMMB < 0 {
			return 0, nil, invalid("vram_mb must not be negative")
		}
	}
	snap, err := s.gate.Snapshot(ctx)
	if err != nil {
		return 0, nil, err
	}
	id := c.principal.ID
	old, err := s.leases.Worker(ctx, id)
	if err != nil {
		return 0, nil, err
	}
	next := *old
	next.Name, next.Hostname, next.Role, next.Version = req.Name, req.Hostname, req.Role, req.Version
	next.Tags = req.Tags
	next.Capabilities = leaseCapabilities(req.Capabilities)
	next.Governor = lease.Governor(req.GovernorLimits)
	next.PolicyVersion = snap.Version()
	// RegisterWorker keeps the approval and counts the call as a sighting.
	w, err := s.leases.RegisterWorker(ctx, &next)
	if err != nil {
		return 0, nil, err
	}
	receiptID, err := s.recordUpdate(ctx, c, snap, old, w)
	if err != nil {
		return 0, nil, err
	}
	ended, err := s.reconcileHeld(ctx, c, id, *req.CurrentJobs, time.Time{}, lease.CodeWorkerRestarted)
	if err != nil {
		return 0, nil, err
	}
	types, tags := w.PendingApproval()
	status := "registered"
	if w.Approval.Pending {
		status = wire.RegisterStatusPending
	}
	out := wire.StartResponse{
		WorkerID:             id,
		Status:               status,
		Changed:              receiptID != nil,
		ReceiptID:            receiptID,
		PendingJobTypes:      orEmpty(types),
		PendingTags:          orEmpty(tags),
		EndedJobs:            ended,
		PolicyVersion:        snap.Version(),
		ServerTime:           s.now(),
		NextHeartbeatSeconds: int(s.cfg.Lease.HeartbeatInterval / time.Second),
		HeartbeatDeadline:    s.leases.OfflineAt(w),
	}
	c.note(func() {
		s.log.Info("worker started", "request_id", c.reqID, "worker_id", id, "node_id", w.NodeID,
			"changed", out.Changed, "pending_job_types", types, "pending_tags", tags, "ended_jobs", ended)
	})
	return http.StatusOK, out, nil
}

// reconcileHeld ends every live lease of the worker on a job not in held
// (granted at or before through, when set) with LastError code, queues
// the JobChanged hook of each job it ended, and wakes long-polls when a
// job went back to the queue. It returns the ids of the jobs ended,
// [] when none.
func (s *Server) reconcileHeld(ctx context.Context, c *call, workerID string, held []string, through time.Time, code string) ([]string, error) {
	ended, err := s.leases.Reconcile(ctx, lease.Reconciliation{WorkerID: workerID, Held: held, GrantedThrough: through, Code: code})
	if err != nil {
		return nil, err
	}
	ids := []string{}
	requeued := false
	for _, j := range ended {
		from := lease.StateLeased
		if j.AcceptedAt != nil {
			from = lease.StateRunning
		}
		if err := s.jobChanged(ctx, c, from, j); err != nil {
			return nil, err
		}
		ids = append(ids, j.ID)
		requeued = requeued || j.State == lease.StateQueued
	}
	if requeued {
		// The requeued jobs may be leasable now.
		if err := s.st.Notifier.Notify(ctx); err != nil {
			return nil, err
		}
	}
	return ids, nil
}

// recordUpdate mints the worker_updated receipt of a worker whose job
// types, tags, GPUs or governor limits changed from old to w, and
// returns its id; nil when nothing of them changed.
func (s *Server) recordUpdate(ctx context.Context, c *call, snap *envelope.Snapshot, old, w *lease.Worker) (*string, error) {
	r, changed := workerUpdate(old, w)
	if !changed {
		return nil, nil
	}
	st, err := s.mintFor(ctx, c, snap, r)
	if err != nil {
		return nil, err
	}
	id := st.ID
	return &id, nil
}

// workerUpdate is the worker_updated receipt of the change from old to
// w, and whether anything it records changed.
func workerUpdate(old, w *lease.Worker) (receipts.Receipt, bool) {
	r := receipts.Receipt{
		Kind: receipts.KindWorkerUpdated, WorkerID: w.ID, NodeID: w.NodeID,
		OldJobTypes: setString(old.Capabilities.JobTypes), JobTypes: setString(w.Capabilities.JobTypes),
		OldTags: setString(old.Tags), Tags: setString(w.Tags),
		OldGPUs: gpuString(old.Capabilities.GPUs), GPUs: gpuString(w.Capabilities.GPUs),
		OldMaxJobs: int64(old.Governor.MaxJobs), MaxJobs: int64(w.Governor.MaxJobs),
		OldMaxVRAMMB: int64(old.Governor.MaxVRAMMB), MaxVRAMMB: int64(w.Governor.MaxVRAMMB),
	}
	changed := r.OldJobTypes != r.JobTypes || r.OldTags != r.Tags || r.OldGPUs != r.GPUs ||
		r.OldMaxJobs != r.MaxJobs || r.OldMaxVRAMMB != r.MaxVRAMMB
	return r, changed
}

// setString is vs sorted, without duplicates, space-separated.
func setString(vs []string) string {
	out := slices.Clone(vs)
	slices.Sort(out)
	return strings.Join(slices.Compact(out), " ")
}

// gpuString is one "sku:vram_mb" entry per GPU, sorted, space-separated.
func gpuString(gs []lease.GPU) string {
	out := make([]string, len(gs))
	for i, g := range gs {
		out[i] = g.SKU + ":" + strconv.Itoa(g.VRAMMB)
	}
	slices.Sort(out)
	return strings.Join(out, " ")
}

// nodeExists is the 409 node_exists of a registration of a known node id
// under another key, with how to fix it.
func nodeExists(nodeID string) error {
	return fmt.Errorf("%w: node %q is registered with another key; a worker that lost its identity "+
		"(its key and token, kept in its state file) cannot take the node over: restore that identity, "+
		"or register under another node_id (an operator may retire the old worker)", ErrNodeExists, nodeID)
}
