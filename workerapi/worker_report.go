package workerapi

import (
	"context"
	"fmt"
	"net/http"

	"github.com/nodelane/nodelane/lease"
	"github.com/nodelane/nodelane/receipts"
	"github.com/nodelane/nodelane/workerapi/wire"
)

// status: POST /workers/jobs/{id}/status.
func (s *Server) status(ctx context.Context, c *call) (int, any, error) {
	var req wire.StatusRequest
	ref, err := c.decodeLeased(&req, &req.LeaseToken)
	if err != nil {
		return 0, nil, err
	}
	if req.EventType == "" {
		return 0, nil, invalid("event_type is required")
	}
	payload, err := object("payload", req.Payload)
	if err != nil {
		return 0, nil, err
	}
	k, err := keyFor(c, "status", ref.JobID, req.IdempotencyKey, req)
	if err != nil {
		return 0, nil, err
	}
	if code, out, ok, err := s.recall(ctx, k); err != nil || ok {
		return code, out, err
	}
	res, err := s.leases.RecordEvents(ctx, ref, lease.Event{
		Kind: lease.EventStatus, Type: req.EventType, Message: req.Message, Payload: payload,
	})
	if err != nil {
		return 0, nil, err
	}
	out := wire.StatusResponse{
		OK: true, ExpiresAt: res.Job.Lease.ExpiresAt, CancelRequested: res.Job.CancelRequested,
	}
	if err := s.remember(ctx, c, k, http.StatusOK, out, s.answerExpiry()); err != nil {
		return 0, nil, err
	}
	return http.StatusOK, out, nil
}

// logs: POST /workers/jobs/{id}/logs, one entry or a batch.
func (s *Server) logs(ctx context.Context, c *call) (int, any, error) {
	var req wire.LogsRequest
	ref, err := c.decodeLeased(&req, &req.LeaseToken)
	if err != nil {
		return 0, nil, err
	}
	payload, err := object("payload", req.Payload)
	if err != nil {
		return 0, nil, err
	}
	single := req.Seq != nil || req.Message != nil || payload != nil
	var evs []lease.Event
	switch {
	case single && req.Entries != nil:
		return 0, nil, invalid("send one entry (seq, message, payload) or entries, not both")
	case single:
		if req.Seq == nil {
			return 0, nil, invalid("seq is required")
		}
		msg := ""
		if req.Message != nil {
			msg = *req.Message
		}
		evs = append(evs, lease.Event{Seq: *req.Seq, Message: msg, Payload: payload})
	case len(req.Entries) == 0:
		return 0, nil, invalid("entries (or seq and message) are required")
	default:
		for _, e := range req.Entries {
			evs = append(evs, lease.Event{Seq: e.Seq, Message: e.Message, Payload: e.Payload})
		}
	}
	for i := range evs {
		if evs[i].Seq < 1 {
			return 0, nil, invalid("seq must be 1 or more")
		}
		p, err := object("payload", evs[i].Payload)
		if err != nil {
			return 0, nil, err
		}
		evs[i].Kind, evs[i].Payload = lease.EventLog, p
	}
	k, err := keyFor(c, "logs", ref.JobID, req.IdempotencyKey, req)
	if err != nil {
		return 0, nil, err
	}
	if code, out, ok, err := s.recall(ctx, k); err != nil || ok {
		return code, out, err
	}
	res, err := s.leases.RecordEvents(ctx, ref, evs...)
	if err != nil {
		return 0, nil, err
	}
	out := wire.LogsResponse{
		OK: true, Accepted: res.Accepted, Duplicates: res.Duplicates, ExpiresAt: res.Job.Lease.ExpiresAt,
	}
	if err := s.remember(ctx, c, k, http.StatusOK, out, s.answerExpiry()); err != nil {
		return 0, nil, err
	}
	return http.StatusOK, out, nil
}

// artifacts: POST /workers/jobs/{id}/artifacts. The artifact stores the
// id of its artifact_reported receipt, so that id is chosen first.
func (s *Server) artifacts(ctx context.Context, c *call) (int, any, error) {
	var req wire.ArtifactRequest
	ref, err := c.decodeLeased(&req, &req.LeaseToken)
	if err != nil {
		return 0, nil, err
	}
	switch {
	case req.ArtifactType == "":
		return 0, nil, invalid("artifact_type is required")
	case req.Name == "":
		return 0, nil, invalid("name is required")
	case req.URI == "" && req.UploadID == "":
		return 0, nil, invalid("uri is required")
	case req.ChecksumSHA256 != nil && !isSHA256Hex(*req.ChecksumSHA256):
		return 0, nil, invalid("checksum_sha256 must be 64 lowercase hex digits")
	case req.SizeBytes != nil && *req.SizeBytes < 0:
		return 0, nil, invalid("size_bytes must not be negative")
	}
	// checksum_sha256 and size_bytes are optional, as in the v0.2 contract.
	var sum string
	var size int64
	if req.ChecksumSHA256 != nil {
		sum = *req.ChecksumSHA256
	}
	if req.SizeBytes != nil {
		size = *req.SizeBytes
	}
	meta, err := object("metadata", req.Metadata)
	if err != nil {
		return 0, nil, err
	}
	k, err := keyFor(c, "artifacts", ref.JobID, req.IdempotencyKey, req)
	if err != nil {
		return 0, nil, err
	}
	if code, out, ok, err := s.recall(ctx, k); err != nil || ok {
		return code, out, err
	}
	rid, err := newReceiptID(s.now(), s.cfg.Rand)
	if err != nil {
		return 0, nil, err
	}
	if u := c.finished; u != nil && !s.now().Before(u.expiresAt()) {
		// The sweep deletes an upload only once its id expired: one that
		// expired while it was checked is not recorded.
		return 0, nil, fmt.Errorf("%w: the upload_id expired while its parts were checked: ask for a new upload", ErrUploadExpired)
	}
	if err := s.checkNewArtifact(ctx, ref.JobID, c.finished); err != nil {
		return 0, nil, err
	}
	na := lease.Artifact{
		Type: req.ArtifactType, Name: req.Name, URI: req.URI, SHA256: sum,
		SizeBytes: size, Metadata: meta, ReceiptID: rid,
	}
	if u := c.finished; u != nil {
		na.Object, na.PartSize = u.prefix(), u.PartSize
	}
	a, err := s.leases.AddArtifact(ctx, ref, na)
	if err != nil {
		return 0, nil, err
	}
	if u := c.finished; u != nil && a.Epoch != u.Epoch {
		return 0, nil, fmt.Errorf("%w: the upload_id is another lease's", ErrUploadInvalid)
	}
	j, err := s.leases.Get(ctx, ref.JobID)
	if err != nil {
		return 0, nil, err
	}
	snap, err := s.gate.Snapshot(ctx)
	if err != nil {
		return 0, nil, err
	}
	r := receipts.Receipt{
		ID: rid, Kind: receipts.KindArtifactReported,
		JobID: a.JobID, WorkerID: a.WorkerID, LeaseEpoch: a.Epoch, LeaseID: j.Lease.ID, ArtifactID: a.ID,
		ChecksumSHA256: a.SHA256, SizeBytes: a.SizeBytes, ArtifactType: a.Type, Name: a.Name, URI: a.URI,
	}
	if meta != nil {
		if r.MetadataSHA256, err = payloadHash(meta); err != nil {
			return 0, nil, err
		}
	}
	if _, err := s.mintFor(ctx, c, snap, r); err != nil {
		return 0, nil, err
	}
	out := wire.ArtifactResponse{ArtifactID: a.ID, ReceiptID: rid, Stored: a.Object != ""}
	if err := s.remember(ctx, c, k, http.StatusCreated, out, s.answerExpiry()); err != nil {
		return 0, nil, err
	}
	return http.StatusCreated, out, nil
}

func isSHA256Hex(s string) bool {
	if len(s) != 64 {
		return false
	}
	for i := 0; i < len(s); i++ {
		if c := s[i]; !('0' <= c && c <= '9' || 'a' <= c && c <= 'f') {
			return false
		}
	}
	return true
}

// audit: POST /workers/audit. Each event becomes a node_audit receipt
// that carries its payload's SHA-256. Receipts are never deleted, so a
// node mints them within a quota per hour, and none while it awaits
// approval (quota.go); a repeat of an answered request still gets its
// first answer.
func (s *Server) audit(ctx context.Context, c *call) (int, any, error) {
	var req wire.AuditRequest
	if err := c.decode(&req); err != nil {
		return 0, nil, err
	}
	if len(req.Events) == 0 || len(req.Events) > wire.MaxAuditEvents {
		return 0, nil, invalid("events must hold 1 to %d events", wire.MaxAuditEvents)
	}
	rs := make([]receipts.Receipt, len(req.Events))
	for i, e := range req.Events {
		switch {
		case e.EventType == "":
			return 0, nil, invalid("events[%d]: event_type is required", i)
		case e.OccurredAt == nil:
			return 0, nil, invalid("events[%d]: occurred_at is required", i)
		}
		p, err := object(fmt.Sprintf("events[%d].payload", i), e.Payload)
		if err != nil {
			return 0, nil, err
		}
		h, err := payloadHash(p)
		if err != nil {
			return 0, nil, err
		}
		rs[i] = receipts.Receipt{
			Kind: receipts.KindNodeAudit, EventType: e.EventType, OccurredAt: *e.OccurredAt, PayloadSHA256: h,
		}
	}
	k, err := keyFor(c, "audit", "", req.IdempotencyKey, req)
	if err != nil {
		return 0, nil, err
	}
	if code, out, ok, err := s.recall(ctx, k); err != nil || ok {
		return code, out, err
	}
	w, err := s.leases.Worker(ctx, c.principal.ID)
	if err != nil {
		return 0, nil, err
	}
	if err := s.chargeAudit(ctx, w, len(rs)); err != nil {
		return 0, nil, err
	}
	snap, err := s.gate.Snapshot(ctx)
	if err != nil {
		return 0, nil, err
	}
	out := wire.AuditResponse{ReceiptIDs: make([]string, 0, len(rs))}
	for _, r := range rs {
		r.WorkerID, r.NodeID = w.ID, w.NodeID
		st, err := s.mintFor(ctx, c, snap, r)
		if err != nil {
			return 0, nil, err
		}
		out.ReceiptIDs = append(out.ReceiptIDs, st.ID)
	}
	if err := s.remember(ctx, c, k, http.StatusCreated, out, s.answerExpiry()); err != nil {
		return 0, nil, err
	}
	return http.StatusCreated, out, nil
}

// prepareArtifact, the prepare of POST /workers/jobs/{id}/artifacts,
// checks the bytes of the upload a report finishes, outside any
// transaction (verifyUpload), and keeps the upload for the handler.
func (s *Server) prepareArtifact(ctx context.Context, c *call) error {
	var req wire.ArtifactRequest
	if err := c.decode(&req); err != nil || req.UploadID == "" {
		return err
	}
	switch {
	case req.ChecksumSHA256 == nil || !isSHA256Hex(*req.ChecksumSHA256):
		return invalid("checksum_sha256 is required with upload_id: 64 lowercase hex digits")
	case req.SizeBytes == nil:
		return invalid("size_bytes is required with upload_id")
	}
	u, err := s.verifyUpload(ctx, c.pathID(), req.UploadID, *req.SizeBytes, *req.ChecksumSHA256)
	if err != nil {
		return err
	}
	c.finished = u
	return nil
}

// checkNewArtifact refuses an artifact of a job that has
// Config.Artifacts.MaxPerJob already, and the finish of an upload that
// an artifact records already. Without a store no limit applies: every
// artifact is metadata only, as before storage existed.
func (s *Server) checkNewArtifact(ctx context.Context, jobID string, u *upload) error {
	if s.cfg.Artifacts.Store == nil {
		return nil
	}
	max := s.cfg.Artifacts.MaxPerJob
	as, err := s.leases.Artifacts(ctx, lease.ArtifactFilter{JobID: jobID, Limit: max})
	if err != nil {
		return err
	}
	if u != nil {
		for _, a := range as {
			if a.Object == u.prefix() {
				return fmt.Errorf("%w: the upload is finished already (artifact %s)", ErrUploadInvalid, a.ID)
			}
		}
	}
	if len(as) >= max {
		return fmt.Errorf("%w: the job has %d artifacts, the limit per job", ErrTooManyArtifacts, max)
	}
	return nil
}
