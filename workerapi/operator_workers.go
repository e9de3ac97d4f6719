package workerapi

import (
	"context"
	"errors"
	"fmt"
	"net/http"

	"github.com/nodelane/nodelane/credential"
	"github.com/nodelane/nodelane/lease"
	"github.com/nodelane/nodelane/receipts"
	"github.com/nodelane/nodelane/workerapi/wire"
)

// Workers.

func (s *Server) opListWorkers(ctx context.Context, c *call) (int, any, error) {
	q := c.r.URL.Query()
	after, err := qString(q, "after")
	if err != nil {
		return 0, nil, err
	}
	limit, err := qLimit(q)
	if err != nil {
		return 0, nil, err
	}
	if limit == 0 {
		limit = maxPage
	}
	desc, err := qDesc(q)
	if err != nil {
		return 0, nil, err
	}
	ws, err := s.leases.Workers(ctx, lease.WorkerFilter{After: after, Limit: limit, Desc: desc})
	if err != nil {
		return 0, nil, err
	}
	ws, cut := fitPage(ws, workerBytes)
	out := wire.WorkerListResponse{Workers: make([]wire.WorkerView, len(ws))}
	for i, w := range ws {
		if out.Workers[i], err = s.workerView(ctx, w); err != nil {
			return 0, nil, err
		}
	}
	if len(ws) == limit || cut {
		next := ws[len(ws)-1].ID
		out.Next = &next
	}
	return http.StatusOK, out, nil
}

func (s *Server) opGetWorker(ctx context.Context, c *call) (int, any, error) {
	w, err := s.leases.Worker(ctx, c.pathID())
	if err != nil {
		return 0, nil, err
	}
	v, err := s.workerView(ctx, w)
	if err != nil {
		return 0, nil, err
	}
	jobs, _, err := s.leases.List(ctx, lease.JobFilter{WorkerID: w.ID, Limit: maxPage})
	if err != nil {
		return 0, nil, err
	}
	out := wire.WorkerDetailResponse{Worker: v, Metrics: orNull(w.Metrics), Leases: []wire.WorkerLease{}}
	for _, j := range jobs {
		l := j.Lease
		if !j.State.Live() || l == nil || l.WorkerID != w.ID {
			continue
		}
		out.Leases = append(out.Leases, wire.WorkerLease{
			JobID: j.ID, JobType: j.Type, State: string(j.State), LeaseID: l.ID, LeaseEpoch: l.Epoch,
			ExpiresAt: l.ExpiresAt, AcceptBy: l.AcceptBy, CancelRequested: j.CancelRequested,
		})
	}
	return http.StatusOK, out, nil
}

// workerView is w with its ban. A worker's principal has the worker's id;
// a worker without one (registered in Go) is not banned.
func (s *Server) workerView(ctx context.Context, w *lease.Worker) (wire.WorkerView, error) {
	v := wire.WorkerView{
		WorkerID:                 w.ID,
		NodeID:                   w.NodeID,
		Name:                     w.Name,
		Hostname:                 w.Hostname,
		EndpointURL:              nonEmpty(w.EndpointURL),
		Role:                     w.Role,
		Tags:                     orEmpty(w.Tags),
		Version:                  w.Version,
		HeartbeatIntervalSeconds: w.HeartbeatInterval,
		Capabilities:             wire.Capabilities{GPUs: []wire.GPU{}, JobTypes: orEmpty(w.Capabilities.JobTypes)},
		GovernorLimits:           wire.GovernorLimits{MaxJobs: w.Governor.MaxJobs, MaxVRAMMB: w.Governor.MaxVRAMMB},
		PolicyVersion:            w.PolicyVersion,
		Status:                   w.Status,
		Liveness:                 string(s.leases.Liveness(w)),
		RegisteredAt:             w.RegisteredAt,
		LastSeenAt:               w.LastSeenAt,
	}
	for _, g := range w.Capabilities.GPUs {
		v.Capabilities.GPUs = append(v.Capabilities.GPUs, wire.GPU{SKU: g.SKU, VRAMMB: g.VRAMMB})
	}
	s.approvalView(&v, w)
	if d := w.Drain; d != nil {
		at, by := d.At, d.By
		v.Drain, v.DrainRequestedAt, v.DrainRequestedBy = true, &at, &by
	}
	p, err := s.issuer.Principal(ctx, w.ID)
	switch {
	case errors.Is(err, credential.ErrNotFound):
		return v, nil
	case err != nil:
		return wire.WorkerView{}, err
	}
	v.Banned, v.BannedAt = p.Banned, p.BannedAt
	if p.Banned {
		reason := p.BanReason
		v.BanReason = &reason
	}
	return v, nil
}

func (s *Server) opBanWorker(ctx context.Context, c *call) (int, any, error) {
	return s.setBan(ctx, c, true)
}

func (s *Server) opUnbanWorker(ctx context.Context, c *call) (int, any, error) {
	return s.setBan(ctx, c, false)
}

func (s *Server) opDrainWorker(ctx context.Context, c *call) (int, any, error) {
	return s.setDrain(ctx, c, true)
}

func (s *Server) opResumeWorker(ctx context.Context, c *call) (int, any, error) {
	return s.setDrain(ctx, c, false)
}

// setDrain sets (drain) or withdraws the operator's request that a worker
// drain: while it stands the worker is granted no job, keeps the jobs it
// holds, and its heartbeat and signals answers carry drain: true; the
// change wakes its signals long-poll. It mints no receipt: it changes no
// job, charge or credential, and the worker's view records who asked and
// when (drain_requested_by, drain_requested_at). A retired worker cannot
// be drained (409); asking again changes nothing.
func (s *Server) setDrain(ctx context.Context, c *call, drain bool) (int, any, error) {
	if err := c.decodeOptional(&struct{}{}); err != nil {
		return 0, nil, err
	}
	var (
		w       *lease.Worker
		changed bool
	)
	err := s.st.Tx.InTx(ctx, func(ctx context.Context) error {
		var err error
		if w, err = s.leases.Worker(ctx, c.pathID()); err != nil {
			return err
		}
		if w.Status == lease.StatusRetired {
			return fmt.Errorf("%w: worker %s is retired", lease.ErrInvalidTransition, w.ID)
		}
		w, changed, err = s.leases.SetDrain(ctx, w.ID, drain, c.principal.ID)
		return err
	})
	if err != nil {
		return 0, nil, err
	}
	if changed {
		s.signalWorkers(c, w.ID)
		what := "resumed"
		if drain {
			what = "drained"
		}
		id, by := w.ID, c.principal.ID
		c.note(func() { s.log.Info("worker "+what, "worker", id, "by", by) })
	}
	return s.workerAnswer(ctx, c, w, nil)
}

// setBan bans or unbans a worker's principal and mints the receipt of the
// change, in one transaction. A ban follows the node's key: every other
// worker principal registered with the same key is banned (or unbanned)
// with it, each with a receipt of its own, so that no node id keeps
// working under a banned key. A call that changes nothing (banning again
// with the same reason, unbanning a worker that is not banned) mints
// nothing. A banned worker can no longer call any route, heartbeats
// included: its live leases run out at their TTL and go back to the queue.
func (s *Server) setBan(ctx context.Context, c *call, ban bool) (int, any, error) {
	var req wire.ReasonRequest
	if err := c.decodeOptional(&req); err != nil {
		return 0, nil, err
	}
	var (
		w        *lease.Worker
		minted   *receipts.Stored
		signaled []string // the principals banned or unbanned: their long-polls look again
	)
	err := s.st.Tx.InTx(ctx, func(ctx context.Context) error {
		var err error
		if w, err = s.leases.Worker(ctx, c.pathID()); err != nil {
			return err
		}
		if w.Status == lease.StatusRetired {
			// A retired worker stays banned, and is banned already.
			return fmt.Errorf("%w: worker %s is retired", lease.ErrInvalidTransition, w.ID)
		}
		p, err := s.issuer.Principal(ctx, w.ID)
		if errors.Is(err, credential.ErrNotFound) {
			return fmt.Errorf("%w: worker %s has no principal to ban", ErrNotFound, w.ID)
		}
		if err != nil {
			return err
		}
		sharers, err := s.issuer.KeySharers(ctx, p)
		if err != nil {
			return err
		}
		if minted, err = s.setPrincipalBan(ctx, c, p, w.NodeID, ban, req.Reason); err != nil {
			return err
		}
		signaled = append(signaled[:0], p.ID)
		for _, q := range sharers {
			nodeID := ""
			if qw, err := s.leases.Worker(ctx, q.ID); err == nil {
				nodeID = qw.NodeID
			} else if !errors.Is(err, lease.ErrNotFound) {
				return err
			}
			if _, err := s.setPrincipalBan(ctx, c, q, nodeID, ban, req.Reason); err != nil {
				return err
			}
			signaled = append(signaled, q.ID)
		}
		return nil
	})
	if err != nil {
		return 0, nil, err
	}
	if ban {
		// A ban ends the worker's open long-polls at once (403
		// worker_banned).
		s.signalWorkers(c, signaled...)
	}
	return s.workerAnswer(ctx, c, w, minted)
}

// workerAnswer is the answer of an operator action on worker w: its view,
// and the receipt the action minted (announced to the hooks), if any.
func (s *Server) workerAnswer(ctx context.Context, c *call, w *lease.Worker, minted *receipts.Stored) (int, any, error) {
	v, err := s.workerView(ctx, w)
	if err != nil {
		return 0, nil, err
	}
	out := wire.WorkerResponse{Worker: v}
	if minted != nil {
		out.ReceiptID = s.announce(c, minted)
	}
	return http.StatusOK, out, nil
}

// setPrincipalBan bans or unbans one worker principal and mints the
// receipt of the change; it mints nothing, and returns nil, when nothing
// changed.
func (s *Server) setPrincipalBan(ctx context.Context, c *call, p *credential.Principal, nodeID string, ban bool, reason string) (*receipts.Stored, error) {
	var (
		after *credential.Principal
		err   error
	)
	kind := receipts.KindWorkerUnbanned
	if ban {
		kind = receipts.KindWorkerBanned
		after, err = s.issuer.Ban(ctx, p.ID, reason)
	} else {
		after, err = s.issuer.Unban(ctx, p.ID)
	}
	if err != nil || after.Rev == p.Rev {
		return nil, err
	}
	return s.mint(ctx, receipts.Receipt{
		Kind: kind, WorkerID: p.ID, NodeID: nodeID, Actor: c.principal.ID, Reason: reason,
	})
}

// banned reports whether worker id is banned. A worker's principal has
// the worker's id; a worker without one (registered in Go) is not banned.
func (s *Server) banned(ctx context.Context, id string) (bool, error) {
	p, err := s.issuer.Principal(ctx, id)
	switch {
	case errors.Is(err, credential.ErrNotFound):
		return false, nil
	case err != nil:
		return false, err
	}
	return p.Banned, nil
}
