package workerapi

import (
	"bytes"
	"context"
	"crypto/ed25519"
	"encoding/base64"
	"errors"
	"fmt"
	"net/http"
	"time"

	"github.com/nodelane/nodelane/credential"
	"github.com/nodelane/nodelane/lease"
	"github.com/nodelane/nodelane/receipts"
	"github.com/nodelane/nodelane/workerapi/wire"
)

// workerScopes are the scopes of a worker token.
var workerScopes = []credential.Scope{
	credential.ScopeNodeHeartbeat, credential.ScopeNodePoll,
	credential.ScopeNodeResultSubmit, credential.ScopeNodeAuditSubmit,
}

// register: POST /workers/register. The pipeline calls it once it has
// verified the provisioning credential (node:register) and the signature
// fields' shape, and read the body: the key the request is signed with
// is in the body, so the body is decoded before the signature is
// checked.
func (s *Server) register(ctx context.Context, c *call) (int, any, error) {
	var req wire.RegisterRequest
	if err := c.decode(&req); err != nil {
		return 0, nil, err
	}
	if req.PublicKey == "" {
		return 0, nil, invalid("public_key is required")
	}
	pub, err := base64.RawURLEncoding.Strict().DecodeString(req.PublicKey)
	if err != nil || len(pub) != ed25519.PublicKeySize {
		return 0, nil, invalid("public_key must be the %d raw bytes of an Ed25519 key in unpadded base64url", ed25519.PublicKeySize)
	}
	return s.signed(ctx, c, ed25519.PublicKey(pub), route{handle: func(ctx context.Context, c *call) (int, any, error) {
		return s.registerSigned(ctx, c, &req, pub)
	}})
}

func (s *Server) registerSigned(ctx context.Context, c *call, req *wire.RegisterRequest, pub ed25519.PublicKey) (int, any, error) {
	switch {
	case req.NodeID == "":
		return 0, nil, invalid("node_id is required")
	case req.GovernorLimits.MaxJobs < 0 || req.GovernorLimits.MaxVRAMMB < 0:
		return 0, nil, invalid("governor_limits must not be negative")
	case req.HeartbeatIntervalSeconds < 0:
		return 0, nil, invalid("heartbeat_interval_seconds must not be negative")
	}
	for _, g := range req.Capabilities.GPUs {
		if g.VRAMMB < 0 {
			return 0, nil, invalid("vram_mb must not be negative")
		}
	}
	// A banned key and a spent provisioning credential are refused before
	// anything is created (provisioning.go).
	if err := s.admitRegistration(ctx, c, pub); err != nil {
		return 0, nil, err
	}
	snap, err := s.gate.Snapshot(ctx)
	if err != nil {
		return 0, nil, err
	}
	w := &lease.Worker{
		NodeID:            req.NodeID,
		Name:              req.Name,
		Hostname:          req.Hostname,
		Role:              req.Role,
		Tags:              req.Tags,
		Version:           req.Version,
		HeartbeatInterval: req.HeartbeatIntervalSeconds,
		Capabilities:      leaseCapabilities(req.Capabilities),
		Governor:          lease.Governor(req.GovernorLimits),
		PolicyVersion:     snap.Version(),
		Status:            "registered",
		// A new node awaits an operator's approval when the control plane
		// requires one; a known node keeps its approval (RegisterWorker).
		Approval: lease.Approval{Pending: s.cfg.ApproveNodes},
	}
	if req.EndpointURL != nil {
		w.EndpointURL = *req.EndpointURL
	}
	code := http.StatusCreated
	var receiptID *string
	ended := []string{}
	old, err := s.leases.WorkerByNode(ctx, req.NodeID)
	switch {
	case errors.Is(err, lease.ErrNotFound):
		if w, err = s.leases.RegisterWorker(ctx, w); err != nil {
			return 0, nil, err
		}
		if _, err := s.issuer.CreatePrincipal(ctx, credential.Principal{
			ID: w.ID, Kind: credential.KindNode, Name: w.NodeID, PublicKey: pub,
		}); err != nil {
			return 0, nil, err
		}
	case err != nil:
		return 0, nil, err
	default:
		// A known node: only its own key may register it again, which
		// rotates its token.
		np, err := s.issuer.Principal(ctx, old.ID)
		if err != nil {
			return 0, nil, err
		}
		if !bytes.Equal(np.PublicKey, pub) {
			return 0, nil, nodeExists(req.NodeID)
		}
		if np.Banned {
			return 0, nil, fmt.Errorf("%w: node %q", credential.ErrBanned, req.NodeID)
		}
		w.ID, w.Status, w.Metrics = old.ID, old.Status, old.Metrics
		if w, err = s.leases.RegisterWorker(ctx, w); err != nil {
			return 0, nil, err
		}
		// The capabilities follow the box (start.go).
		if receiptID, err = s.recordUpdate(ctx, c, snap, old, w); err != nil {
			return 0, nil, err
		}
		if req.CurrentJobs != nil {
			if ended, err = s.reconcileHeld(ctx, c, w.ID, *req.CurrentJobs, time.Time{}, lease.CodeWorkerRestarted); err != nil {
				return 0, nil, err
			}
		}
		creds, err := s.issuer.Credentials(ctx, w.ID)
		if err != nil {
			return 0, nil, err
		}
		now := s.now()
		for _, cr := range creds {
			if cr.RevokedAt == nil && now.Before(cr.ExpiresAt) {
				if _, err := s.issuer.Revoke(ctx, cr.ID); err != nil {
					return 0, nil, err
				}
			}
		}
		code = http.StatusOK
	}
	tok, cred, err := s.issuer.Mint(ctx, w.ID, workerScopes, s.cfg.WorkerTokenTTL)
	if err != nil {
		return 0, nil, err
	}
	if _, err := s.mintFor(ctx, c, snap, receipts.Receipt{
		Kind: receipts.KindWorkerRegistered, WorkerID: w.ID, NodeID: w.NodeID,
		KeyID: credential.KeyID(pub), CredentialID: cred.ID, ProvisioningCredentialID: c.credentialID,
	}); err != nil {
		return 0, nil, err
	}
	s.logRegistration(c, w, pub, cred.ID)
	status := "registered"
	if w.Approval.Pending {
		status = wire.RegisterStatusPending
	}
	types, tags := w.PendingApproval()
	if receiptID != nil || len(ended) > 0 {
		wid := w.ID
		c.note(func() {
			s.log.Info("worker registered again", "request_id", c.reqID, "worker_id", wid,
				"changed", receiptID != nil, "pending_job_types", types, "pending_tags", tags, "ended_jobs", ended)
		})
	}
	return code, wire.RegisterResponse{
		WorkerID:             w.ID,
		WorkerToken:          tok,
		Status:               status,
		PolicyVersion:        snap.Version(),
		PollIntervalSeconds:  int(s.cfg.PollInterval / time.Second),
		NextHeartbeatSeconds: int(s.cfg.Lease.HeartbeatInterval / time.Second),
		ServerTime:           s.now(),
		TokenExpiresAt:       cred.ExpiresAt,
		EndedJobs:            ended,
		PendingJobTypes:      orEmpty(types),
		PendingTags:          orEmpty(tags),
	}, nil
}

func leaseCapabilities(c wire.Capabilities) lease.Capabilities {
	out := lease.Capabilities{JobTypes: c.JobTypes}
	for _, g := range c.GPUs {
		out.GPUs = append(out.GPUs, lease.GPU(g))
	}
	return out
}

// heartbeat: POST /workers/heartbeat.
func (s *Server) heartbeat(ctx context.Context, c *call) (int, any, error) {
	var req wire.HeartbeatRequest
	if err := c.decode(&req); err != nil {
		return 0, nil, err
	}
	switch req.Status {
	case "idle", "busy", "draining":
	case "":
		return 0, nil, invalid("status is required")
	default:
		return 0, nil, invalid("status must be idle, busy or draining")
	}
	metrics, err := object("metrics", req.Metrics)
	if err != nil {
		return 0, nil, err
	}
	if len(metrics) > wire.MaxMetricsBytes {
		return 0, nil, invalid("metrics are %d bytes, over the limit of %d", len(metrics), wire.MaxMetricsBytes)
	}
	if req.Capabilities != nil {
		for _, g := range req.Capabilities.GPUs {
			if g.VRAMMB < 0 {
				return 0, nil, invalid("vram_mb must not be negative")
			}
		}
	}
	snap, err := s.gate.Snapshot(ctx)
	if err != nil {
		return 0, nil, err
	}
	id := c.principal.ID
	if req.Capabilities != nil {
		w, err := s.leases.Worker(ctx, id)
		if err != nil {
			return 0, nil, err
		}
		w.Capabilities = leaseCapabilities(*req.Capabilities)
		if _, err := s.leases.RegisterWorker(ctx, w); err != nil {
			return 0, nil, err
		}
	}
	w, err := s.leases.Heartbeat(ctx, id, req.Status, metrics)
	if err != nil {
		return 0, nil, err
	}
	t, err := s.leases.Touch(ctx, id, req.CurrentJobs)
	if err != nil {
		return 0, nil, err
	}
	ended := []string{}
	if req.LeasesThrough != nil {
		// A lease granted after the newest lease answer the worker
		// processed is spared: it may not have heard of it yet.
		if ended, err = s.reconcileHeld(ctx, c, id, req.CurrentJobs, *req.LeasesThrough, lease.CodeNotHeld); err != nil {
			return 0, nil, err
		}
	}
	out := wire.HeartbeatResponse{
		OK:                   true,
		WorkerID:             id,
		ServerTime:           s.now(),
		NextHeartbeatSeconds: int(s.cfg.Lease.HeartbeatInterval / time.Second),
		HeartbeatDeadline:    s.leases.OfflineAt(w),
		PolicyVersion:        snap.Version(),
		Leases:               []wire.LeaseExpiry{},
		LostJobs:             append([]string{}, t.Lost...),
		CancelJobs:           append([]string{}, t.Cancel...),
		EndedJobs:            ended,
		Drain:                w.Drain != nil,
	}
	for _, j := range t.Leases {
		out.Leases = append(out.Leases, wire.LeaseExpiry{JobID: j.ID, ExpiresAt: j.Lease.ExpiresAt})
	}
	return http.StatusOK, out, nil
}
