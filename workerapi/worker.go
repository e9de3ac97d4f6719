package workerapi

import (
	"bytes"
	"context"
	"crypto/ed25519"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"time"

	"github.com/nodelane/nodelane/credential"
	"github.com/nodelane/nodelane/envelope"
	"github.com/nodelane/nodelane/lease"
	"github.com/nodelane/nodelane/receipts"
	"github.com/nodelane/nodelane/workerapi/wire"
)

// The worker routes of PROTOCOL.md. Each handler runs inside the
// request's transaction (the ctx it is given carries it), after the
// pipeline of http.go checked the framing, the credential, the scope and
// the signature and consumed the nonce; c.principal.ID is the worker id.

// Limits of the worker routes.
const (
	// A long-poll looks again without a notification, since a job whose
	// retry backoff ends becomes eligible without one: first pollTick
	// after its last look, then twice as long each time, up to
	// maxPollTick, so that a thousand idle long-polls do not cost a
	// thousand claim transactions a second (on SQLite, each takes the one
	// writer). A notification makes it look at once.
	pollTick    = time.Second
	maxPollTick = 5 * time.Second
)

// workerScopes are the scopes of a worker token.
var workerScopes = []credential.Scope{
	credential.ScopeNodeHeartbeat, credential.ScopeNodePoll,
	credential.ScopeNodeResultSubmit, credential.ScopeNodeAuditSubmit,
}

// Request validation helpers.

// invalid returns an ErrInvalidRequest with a message.
func invalid(format string, args ...any) error {
	return fmt.Errorf("%w: %s", ErrInvalidRequest, fmt.Sprintf(format, args...))
}

// object returns raw if it is a JSON object, nil if it is absent or
// null, and ErrInvalidRequest otherwise. The decoder has checked that
// raw is valid JSON.
func object(field string, raw json.RawMessage) (json.RawMessage, error) {
	t := bytes.TrimSpace(raw)
	switch {
	case len(t) == 0 || string(t) == "null":
		return nil, nil
	case t[0] != '{':
		return nil, invalid("%s must be a JSON object", field)
	}
	return t, nil
}

// payloadHash is the SHA-256 a receipt carries for a free-form payload
// (receipts.PayloadSHA256; an absent payload is hashed as null).
func payloadHash(raw json.RawMessage) (string, error) {
	h, err := receipts.PayloadSHA256(raw)
	if err != nil {
		return "", invalid("payload is not valid JSON")
	}
	return h, nil
}

// decodeLeased decodes the body into req and returns the lease named by
// *token, a field of req, as leaseRef checks it.
func (c *call) decodeLeased(req any, token *string) (lease.Ref, error) {
	if err := c.decode(req); err != nil {
		return lease.Ref{}, err
	}
	return leaseRef(c, *token)
}

// leaseRef checks that a lease token was given and has the shape of one
// (the lease.Manager checks its checksum), and names the job of the
// route's path under it.
func leaseRef(c *call, token string) (lease.Ref, error) {
	return jobRef(c, c.pathID(), token)
}

// jobRef is leaseRef for job jobID. The shape it checks is the OpenAPI
// document's pattern for a lease token.
func jobRef(c *call, jobID, token string) (lease.Ref, error) {
	if token == "" {
		return lease.Ref{}, invalid("lease_token is required")
	}
	if len(token) != lease.TokenLen || !strings.HasPrefix(token, lease.TokenPrefix) || !isBase62(token[len(lease.TokenPrefix):]) {
		return lease.Ref{}, fmt.Errorf("%w: %w", ErrInvalidRequest, lease.ErrMalformedToken)
	}
	return lease.Ref{JobID: jobID, WorkerID: c.principal.ID, Token: token}, nil
}

// isBase62 reports whether s holds only the digits of base 62.
func isBase62(s string) bool {
	for i := 0; i < len(s); i++ {
		if c := s[i]; !('0' <= c && c <= '9' || 'A' <= c && c <= 'Z' || 'a' <= c && c <= 'z') {
			return false
		}
	}
	return true
}

// Hooks and receipts.

// jobChanged queues the JobChanged hook of a committed change of j from
// state from, with the job's artifacts when it reached a terminal state.
//
// It also notes the change's INFO log line (logJob), for when the
// request commits.
func (s *Server) jobChanged(ctx context.Context, c *call, from lease.State, j *lease.Job) error {
	if j.State == from {
		return nil
	}
	jc, event := *j, jobEvent(from, j, c.r.Pattern)
	c.note(func() { s.logJob(event, from, &jc) })
	if s.cfg.Hooks == nil {
		return nil
	}
	ev := JobEvent{From: from, Job: *j}
	if j.State.Terminal() {
		arts, err := s.jobArtifacts(ctx, j.ID)
		if err != nil {
			return err
		}
		for _, a := range arts {
			ev.Artifacts = append(ev.Artifacts, *a)
		}
	}
	c.after(func(ctx context.Context, h Hooks) { h.JobChanged(ctx, ev) })
	return nil
}

// mintFor mints r under the policy version of snap, in the request's
// transaction, and queues its ReceiptMinted hook.
func (s *Server) mintFor(ctx context.Context, c *call, snap *envelope.Snapshot, r receipts.Receipt) (*receipts.Stored, error) {
	ss, err := s.mintAllFor(ctx, c, snap, r)
	if err != nil {
		return nil, err
	}
	return ss[0], nil
}

// mintAllFor is mintFor for several receipts, minted in one store call
// where the store allows (receipts.Log.MintAll).
func (s *Server) mintAllFor(ctx context.Context, c *call, snap *envelope.Snapshot, rs ...receipts.Receipt) ([]*receipts.Stored, error) {
	for i := range rs {
		rs[i].PolicyVersion = snap.Version()
	}
	ss, err := s.receipts.MintAll(ctx, rs...)
	if err != nil {
		return nil, err
	}
	for _, st := range ss {
		cp := *st
		c.after(func(ctx context.Context, h Hooks) { h.ReceiptMinted(ctx, cp) })
	}
	return ss, nil
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
	return s.signed(ctx, c, ed25519.PublicKey(pub), func(ctx context.Context, c *call) (int, any, error) {
		return s.registerSigned(ctx, c, &req, pub)
	})
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
		NextHeartbeatSeconds: int(s.cfg.HeartbeatInterval / time.Second),
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
		NextHeartbeatSeconds: int(s.cfg.HeartbeatInterval / time.Second),
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

// leaseBody is LeaseRequest with presence: max_jobs 0 is refused, while
// an absent max_jobs means 1.
type leaseBody struct {
	SupportedJobTypes []string `json:"supported_job_types"`
	SupportedGPUSKUs  []string `json:"supported_gpu_skus"`
	MaxJobs           *int     `json:"max_jobs"`
	WaitSeconds       *int     `json:"wait_seconds"`
	Accept            bool     `json:"accept"`
	RequestID         string   `json:"request_id"`
}

// lease: POST /workers/jobs/lease. The first attempt runs in the
// request's transaction. If it grants nothing and the worker asked to
// wait, the wait runs after the commit and holds no transaction: each
// notification (or a tick, or the deadline) makes one more attempt in a
// transaction of its own. With accept, each attempt accepts what it
// grants in its own transaction (acceptGranted).
func (s *Server) lease(ctx context.Context, c *call) (int, any, error) {
	var req leaseBody
	if err := c.decode(&req); err != nil {
		return 0, nil, err
	}
	n, wait := 1, 0
	if req.MaxJobs != nil {
		if n = *req.MaxJobs; n < 1 || n > wire.MaxJobsPerLease {
			return 0, nil, invalid("max_jobs must be 1 to %d", wire.MaxJobsPerLease)
		}
	}
	if req.WaitSeconds != nil {
		if wait = *req.WaitSeconds; wait < 0 {
			return 0, nil, invalid("wait_seconds must not be negative")
		}
	}
	k, err := keyFor(c, "lease", "", req.RequestID, req)
	if err != nil {
		return 0, nil, err
	}
	if code, out, ok, err := s.recall(ctx, k); err != nil || ok {
		return code, out, err
	}
	lr := lease.LeaseRequest{
		WorkerID: c.principal.ID,
		JobTypes: req.SupportedJobTypes,
		GPUSKUs:  req.SupportedGPUSKUs,
		MaxJobs:  n,
	}
	d := min(time.Duration(wait)*time.Second, wire.MaxWaitSeconds*time.Second, s.cfg.MaxWait)
	var (
		wake, sig <-chan struct{}
		cancel    func()
	)
	if d > 0 {
		// Subscribe before the first attempt, so that a job dispatched
		// while it runs still wakes the wait. A ban or a retirement of the
		// worker wakes it too (its signals), and the next attempt refuses
		// it (checkGranted): with a Notifier that is not a SignalNotifier,
		// the ban's Notify wakes it through wake.
		wake, cancel = s.st.Notifier.Subscribe()
		c.cleanup(cancel)
		if sn, ok := s.st.Notifier.(SignalNotifier); ok {
			sig, cancel = sn.SubscribeWorker(lr.WorkerID)
			c.cleanup(cancel)
		}
	}
	// Why no job came is said only in an answer without one: not after
	// each attempt of a long-poll, which may wake for every job
	// dispatched anywhere.
	out, err := s.leaseOnce(ctx, c, lr, req.Accept, d <= 0)
	if err != nil {
		return 0, nil, err
	}
	if err := s.rememberLease(ctx, c, k, out); err != nil {
		return 0, nil, err
	}
	if len(out.Leases) > 0 || d <= 0 {
		return http.StatusOK, out, nil
	}
	deadline := time.Now().Add(d)
	c.then = func(ctx context.Context) (int, any, error) {
		timer := time.NewTimer(time.Until(deadline))
		defer timer.Stop()
		every := pollTick
		tick := time.NewTimer(every)
		defer tick.Stop()
		for {
			select {
			case <-ctx.Done():
				return 0, nil, context.Cause(ctx)
			case <-timer.C:
				snap, err := s.gate.Snapshot(ctx)
				if err != nil {
					return 0, nil, err
				}
				if out.Message, err = s.whyNoJob(ctx, snap, lr); err != nil {
					return 0, nil, err
				}
				return http.StatusOK, out, nil
			case <-wake:
				tick.Stop()
			case <-sig:
				tick.Stop()
			case <-tick.C:
				every = min(2*every, maxPollTick)
			}
			tick.Reset(every)
			var next *wire.LeaseResponse
			queued, noted, granted := len(c.hooks), len(c.notes), len(c.jobIDs)
			err := s.st.Tx.InTx(ctx, func(ctx context.Context) error {
				var err error
				if next, err = s.leaseOnce(ctx, c, lr, req.Accept, false); err != nil {
					return err
				}
				return s.rememberLease(ctx, c, k, next)
			})
			if err != nil {
				// They did not commit.
				c.hooks, c.notes, c.jobIDs = c.hooks[:queued], c.notes[:noted], c.jobIDs[:granted]
				return 0, nil, err
			}
			out = next
			if len(out.Leases) > 0 {
				return http.StatusOK, out, nil
			}
		}
	}
	return http.StatusOK, out, nil
}

// rememberLease remembers out, the answer to the lease request k, if it
// granted a job: until the last accept_by of its grants, after which a
// repeat leases anew.
func (s *Server) rememberLease(ctx context.Context, c *call, k *keyed, out *wire.LeaseResponse) error {
	if k == nil || len(out.Leases) == 0 {
		return nil
	}
	var until time.Time
	for _, g := range out.Leases {
		if g.AcceptBy.After(until) {
			until = g.AcceptBy
		}
	}
	return s.remember(ctx, c, k, http.StatusOK, out, until)
}

// leaseOnce makes one attempt to lease jobs under a fresh envelope
// snapshot, for a worker that is not banned (checkGranted), and, with explain, says why none was granted. With accept, it
// accepts each job granted (acceptGranted).
func (s *Server) leaseOnce(ctx context.Context, c *call, lr lease.LeaseRequest, accept, explain bool) (*wire.LeaseResponse, error) {
	// A ban or a retirement committed since the request's credential
	// was verified (during a long-poll's wait) is seen here, in the
	// claim's transaction: no job is granted to a banned worker.
	if err := s.checkGranted(ctx, lr.WorkerID); err != nil {
		return nil, err
	}
	snap, err := s.gate.Snapshot(ctx)
	if err != nil {
		return nil, err
	}
	prices := s.cfg.Prices
	lr.Allow = func(t string) bool { return snap.Allow(t) == nil }
	lr.PolicyVersion = snap.Version()
	lr.Price = prices.Rate
	grants, err := s.leases.Lease(ctx, lr)
	if err != nil {
		return nil, err
	}
	if len(grants) > 0 {
		// And again after the claim, in its transaction: a ban that
		// committed while this attempt ran (after the check above, before
		// the claim saw a job dispatched after the ban) rolls the grants
		// back. The claim read every job it grants after those jobs were
		// dispatched, so this read comes after any ban that preceded
		// their dispatch.
		if err := s.checkGranted(ctx, lr.WorkerID); err != nil {
			return nil, err
		}
	}
	if n := len(grants); n > 0 {
		if em := s.events(); em != nil {
			c.note(func() { em.ObserveLeases(LeaseGranted, n) })
		}
		for _, g := range grants {
			c.jobIDs = append(c.jobIDs, g.Job.ID)
		}
	}
	// Read after the claim: at or after every grant's time (leases_through).
	out := &wire.LeaseResponse{Leases: []wire.Grant{}, ServerTime: s.now()}
	var (
		asked    *envelope.Snapshot // the envelope at accept
		accepted int
		refused  []string // why grants were not accepted
	)
	if accept && len(grants) > 0 {
		if asked, err = s.gate.Snapshot(ctx); err != nil {
			return nil, err
		}
	}
	for _, g := range grants {
		if err := s.jobChanged(ctx, c, lease.StateQueued, g.Job); err != nil {
			return nil, err
		}
		j := g.Job
		if accept {
			var why error
			if j, why, err = s.acceptGranted(ctx, c, asked, g); err != nil {
				return nil, err
			}
			if why != nil {
				refused = append(refused, fmt.Sprintf("job %s: %s", j.ID, publicMessage(why.Error())))
			} else {
				accepted++
			}
		}
		out.Leases = append(out.Leases, wire.Grant{
			LeaseID: j.Lease.ID, LeaseToken: g.Token, Job: wireJob(j),
			ExpiresAt: j.Lease.ExpiresAt, AcceptBy: j.Lease.AcceptBy,
		})
	}
	if len(grants) > 0 {
		f := out.Leases[0]
		out.LeaseID, out.LeaseToken, out.Job, out.ExpiresAt, out.AcceptBy = &f.LeaseID, &f.LeaseToken, &f.Job, &f.ExpiresAt, &f.AcceptBy
		out.Message = "leased " + jobCount(len(grants))
		switch {
		case accept && len(refused) == 0:
			out.Message = "leased and accepted " + jobCount(len(grants))
		case accept:
			out.Message += fmt.Sprintf(", accepted %d; not accepted (accept them, or they lapse at accept_by): %s",
				accepted, strings.Join(refused, "; "))
		}
		return out, nil
	}
	if explain {
		out.Message, err = s.whyNoJob(ctx, snap, lr)
	}
	return out, err
}

// jobCount is "1 job" or "n jobs".
func jobCount(n int) string {
	if n == 1 {
		return "1 job"
	}
	return fmt.Sprintf("%d jobs", n)
}

// acceptGranted accepts a job the caller was just granted, in the
// lease's transaction, as accept would: the envelope as it is at accept
// (snap) must allow the job's type. A type it refuses is not accepted:
// the job is returned leased, with why, and the grant answers it so (its
// job.state leased), so the worker learns it as it would from accept,
// and nothing is lost: the job's lease lapses at accept_by, without
// using an attempt, as a lease never accepted does. Any other error fails
// the attempt, and its transaction takes the grants back.
func (s *Server) acceptGranted(ctx context.Context, c *call, snap *envelope.Snapshot, g lease.Grant) (j *lease.Job, why, err error) {
	if why := snap.Allow(g.Job.Type); why != nil {
		return g.Job, why, nil
	}
	j, err = s.leases.Accept(ctx, lease.Ref{JobID: g.Job.ID, WorkerID: c.principal.ID, Token: g.Token})
	if err != nil {
		return nil, nil, err
	}
	if err := s.jobChanged(ctx, c, lease.StateLeased, j); err != nil {
		return nil, nil, err
	}
	return j, nil, nil
}

// whyNoJob explains an empty lease with lease.Manager.ExplainLease: a
// worker awaiting approval, the types asked for that it did not register
// or its approval leaves out (ignored), the types the envelope blocks (in
// the envelope's words), the types with no queued, fitting or due job,
// and a worker already at its live-lease limit.
func (s *Server) whyNoJob(ctx context.Context, snap *envelope.Snapshot, lr lease.LeaseRequest) (string, error) {
	ex, err := s.leases.ExplainLease(ctx, lr, nil)
	if err != nil {
		return "", err
	}
	why := []string{"no eligible job"}
	// The types the request asked for beyond what the worker may serve
	// are named in one phrase per reason, where the first of them was.
	ignored := map[lease.ReasonCode][]string{}
	at := map[lease.ReasonCode]int{}
	for _, r := range ex.Reasons {
		var be *envelope.BlockedError
		switch {
		case r.Code == lease.ReasonNoJobTypes, r.Code == lease.ReasonPendingApproval, r.Code == lease.ReasonDraining:
			return "no eligible job: " + r.Message, nil
		case r.Code == lease.ReasonTypeNotRegistered, r.Code == lease.ReasonTypeNotApproved:
			if _, ok := at[r.Code]; !ok {
				at[r.Code] = len(why)
				why = append(why, "")
			}
			ignored[r.Code] = append(ignored[r.Code], fmt.Sprintf("%q", r.JobType))
		case r.Code == lease.ReasonTypeNotAllowed && errors.As(snap.Allow(r.JobType), &be):
			why = append(why, be.Reason)
		default:
			why = append(why, r.Message)
		}
	}
	if i, ok := at[lease.ReasonTypeNotRegistered]; ok {
		why[i] = "ignored job types the worker did not register: " + strings.Join(ignored[lease.ReasonTypeNotRegistered], ", ")
	}
	if i, ok := at[lease.ReasonTypeNotApproved]; ok {
		why[i] = "ignored job types the worker's approval does not include: " + strings.Join(ignored[lease.ReasonTypeNotApproved], ", ")
	}
	return strings.Join(why, "; "), nil
}

// accept: POST /workers/jobs/{id}/accept. The lease is checked first,
// then the envelope is asked again: a type blocked since the lease was
// granted is not accepted (403), and its lease runs out at the accept
// deadline.
func (s *Server) accept(ctx context.Context, c *call) (int, any, error) {
	var req wire.TokenRequest
	ref, err := c.decodeLeased(&req, &req.LeaseToken)
	if err != nil {
		return 0, nil, err
	}
	// Only a JobChanged hook needs the state before (an accept repeated
	// under the same lease changes nothing): a read no accept pays for
	// otherwise.
	from := lease.StateLeased
	if s.cfg.Hooks != nil {
		before, err := s.leases.Get(ctx, ref.JobID)
		if err != nil {
			return 0, nil, err
		}
		from = before.State
	}
	// The lease first: a caller without it learns nothing of the job,
	// not even its type's verdict. A blocked type then fails the
	// request, and its transaction takes the accept back.
	j, err := s.leases.Accept(ctx, ref)
	if err != nil {
		return 0, nil, err
	}
	snap, err := s.gate.Snapshot(ctx)
	if err != nil {
		return 0, nil, err
	}
	if err := snap.Allow(j.Type); err != nil {
		return 0, nil, err
	}
	if err := s.jobChanged(ctx, c, from, j); err != nil {
		return 0, nil, err
	}
	return http.StatusOK, wire.AcceptResponse{Job: wireJob(j), ExpiresAt: j.Lease.ExpiresAt}, nil
}

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
	case req.URI == "":
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
	a, err := s.leases.AddArtifact(ctx, ref, lease.Artifact{
		Type: req.ArtifactType, Name: req.Name, URI: req.URI, SHA256: sum,
		SizeBytes: size, Metadata: meta, ReceiptID: rid,
	})
	if err != nil {
		return 0, nil, err
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
	out := wire.ArtifactResponse{ArtifactID: a.ID, ReceiptID: rid}
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

// complete: POST /workers/jobs/{id}/complete. It mints the job_completed
// receipt and the job_charged receipt (id: the job_completed id and
// ".charge") with the state change; after the commit it sequences them and
// answers with their proofs. Completing again with the same lease token
// mints nothing and rebuilds the same answer from what was stored. A job
// whose cancel was requested ends canceled instead (completeCanceled).
// The batch complete (complete_batch.go) completes each of its jobs with
// the same completeJob.
func (s *Server) complete(ctx context.Context, c *call) (int, any, error) {
	var req wire.CompleteRequest
	ref, err := c.decodeLeased(&req, &req.LeaseToken)
	if err != nil {
		return 0, nil, err
	}
	res, err := completeResult(&req)
	if err != nil {
		return 0, nil, err
	}
	out, refusal, err := s.completeJob(ctx, c, ref, res)
	if err != nil || refusal != nil {
		// On a refusal, completeCanceled has set c.then to answer it once
		// the job's end commits.
		return 0, nil, err
	}
	c.then = func(ctx context.Context) (int, any, error) {
		s.proofs(ctx, out)
		return http.StatusOK, *out, nil
	}
	return http.StatusOK, *out, nil
}

// completeResult is the lease.Result a complete's body reports.
func completeResult(req *wire.CompleteRequest) (lease.Result, error) {
	metrics, err := object("metrics", req.Metrics)
	if err != nil {
		return lease.Result{}, err
	}
	res := lease.Result{Metrics: metrics}
	if req.OutputURI != nil {
		res.OutputURI = *req.OutputURI
	}
	if req.FinalMessage != nil {
		res.FinalMessage = *req.FinalMessage
	}
	return res, nil
}

// completeJob completes ref's job with res in the transaction of ctx, and
// returns the answer without its proofs (proofs adds them after the
// commit). A repeat under the same lease token mints nothing and rebuilds
// the first answer. A job whose cancel was requested ends canceled
// (completeCanceled, which sets c.then to answer the refusal): completeJob
// then returns that refusal (lease.ErrCanceled), to be committed with the
// job's end and answered. Any err is to be rolled back.
func (s *Server) completeJob(ctx context.Context, c *call, ref lease.Ref, res lease.Result) (out *wire.CompleteResponse, refusal, err error) {
	// The job_completed receipt's id goes in with the completion, so the
	// job records it in the same write.
	if res.ReceiptID, err = newReceiptID(s.now(), s.cfg.Rand); err != nil {
		return nil, nil, err
	}
	j, repeated, err := s.leases.Complete(ctx, ref, res)
	if errors.Is(err, lease.ErrCanceled) && j != nil {
		if _, _, serr := s.completeCanceled(ctx, c, j, err); serr != nil {
			return nil, nil, serr
		}
		return nil, err, nil
	}
	if err != nil {
		return nil, nil, err
	}
	var (
		completedID string
		charge      *receipts.Receipt
	)
	if repeated {
		if completedID = j.ReceiptID; completedID == "" {
			return nil, nil, fmt.Errorf("workerapi: completed job %s has no receipt", j.ID)
		}
		st, err := s.receipts.Get(ctx, chargeID(completedID))
		if err != nil {
			return nil, nil, err
		}
		if charge, err = st.Receipt(); err != nil {
			return nil, nil, err
		}
	} else {
		if completedID, charge, err = s.settle(ctx, c, j, res.ReceiptID); err != nil {
			return nil, nil, err
		}
		if j.ReceiptID != completedID {
			// A lease.Store that does not write Result.ReceiptID.
			if j, err = s.leases.SetReceipt(ctx, j.ID, completedID); err != nil {
				return nil, nil, err
			}
		}
		if err := s.jobChanged(ctx, c, lease.StateRunning, j); err != nil {
			return nil, nil, err
		}
	}
	return &wire.CompleteResponse{
		Job:           wireJob(j),
		ActualMS:      charge.ActualMS,
		ActualHours:   receipts.Hours(charge.ActualMS),
		ActualCostUSD: receipts.FormatMicros(charge.CostMicros),
		ReceiptID:     completedID,
		Receipts:      []receipts.WireReceipt{},
		Proofs:        []receipts.Proof{},
	}, nil, nil
}

// settle mints the receipts of a completion: job_completed, with id, and
// job_charged for the time from accept to completion on the job's GPUs
// (its gpu_count, or 1 for a job with none that ran on a GPU SKU) at the
// price snapshotted on its lease.
func (s *Server) settle(ctx context.Context, c *call, j *lease.Job, id string) (string, *receipts.Receipt, error) {
	ch, err := jobCharge(j)
	if err != nil {
		return "", nil, err
	}
	snap, err := s.gate.Snapshot(ctx)
	if err != nil {
		return "", nil, err
	}
	done := receipts.Receipt{
		ID: id, Kind: receipts.KindJobCompleted,
		JobID: j.ID, WorkerID: j.Lease.WorkerID, JobType: j.Type, LeaseEpoch: j.Lease.Epoch, LeaseID: j.Lease.ID,
		Attempt: int64(j.Attempt), StartedAt: *j.AcceptedAt, EndedAt: *j.FinishedAt,
		ActualMS: ch.ActualMS, GPUCount: ch.GPUCount, Charged: receipts.ChargedYes,
	}
	if r := j.Result; r != nil {
		done.OutputURI = r.OutputURI
		if len(r.Metrics) > 0 {
			if done.MetricsSHA256, err = payloadHash(r.Metrics); err != nil {
				return "", nil, err
			}
		}
	}
	cr := ch.Receipt(j.ID, j.Lease.WorkerID, j.Lease.SKU)
	cr.ID, cr.LeaseID = chargeID(id), j.Lease.ID
	if _, err := s.mintAllFor(ctx, c, snap, done, cr); err != nil {
		return "", nil, err
	}
	return id, &cr, nil
}

// proofs waits (awaitProofs: the background sequencer, woken, or this
// request itself without Start) up to Config.ProofWait for the proofs of
// the receipts of the completions outs against one signed checkpoint,
// which it adds to each. If the wait runs out the
// answers carry the receipts without index, proof or checkpoint: the
// completions committed, and repeating them returns them.
func (s *Server) proofs(ctx context.Context, outs ...*wire.CompleteResponse) {
	if len(outs) == 0 {
		return
	}
	ids := make([]string, 0, 2*len(outs))
	for _, out := range outs {
		ids = append(ids, out.ReceiptID, chargeID(out.ReceiptID))
	}
	ss, ps, cp, err := s.awaitProofs(ctx, ids)
	if err == nil {
		for i, out := range outs {
			for k := 2 * i; k < 2*i+2; k++ {
				out.Receipts = append(out.Receipts, ss[k].Wire())
				out.Proofs = append(out.Proofs, ps[k])
			}
			out.Checkpoint = string(cp.Note)
		}
		return
	}
	s.log.Warn("answering a completion without proofs", "receipts", ids, "err", err)
	for i, id := range ids {
		st, err := s.receipts.Get(context.WithoutCancel(ctx), id)
		if err != nil {
			s.log.Error("reading a minted receipt", "receipt", id, "err", err)
			continue
		}
		out := outs[i/2]
		out.Receipts = append(out.Receipts, st.Wire())
	}
}

// failJob: POST /workers/jobs/{id}/fail. No charge: a job_failed receipt
// says how the attempt ended (requeued, failed or canceled).
func (s *Server) failJob(ctx context.Context, c *call) (int, any, error) {
	var req wire.FailRequest
	ref, err := c.decodeLeased(&req, &req.LeaseToken)
	if err != nil {
		return 0, nil, err
	}
	if req.ErrorCode == "" {
		// error_code is optional, as in the v0.2 contract.
		req.ErrorCode = "unspecified"
	}
	payload, err := object("payload", req.Payload)
	if err != nil {
		return 0, nil, err
	}
	// A repeat under the same lease token gets the first answer.
	k, err := tokenKeyFor(c, "fail", ref, req)
	if err != nil {
		return 0, nil, err
	}
	if code, out, ok, err := s.recall(ctx, k); err != nil || ok {
		return code, out, err
	}
	before, err := s.leases.Get(ctx, ref.JobID)
	if err != nil {
		return 0, nil, err
	}
	j, err := s.leases.Fail(ctx, ref, lease.Failure{
		Code: req.ErrorCode, Message: req.Message, Payload: payload, Retryable: req.Retryable,
	})
	if err != nil {
		return 0, nil, err
	}
	r, err := attemptFailed(j, req.ErrorCode, j.LastError.Attempt, j.LastError.At)
	if err != nil {
		return 0, nil, err
	}
	outcome := r.Outcome
	if r.PayloadSHA256, err = payloadHash(payload); err != nil {
		return 0, nil, err
	}
	rid, j, err := s.settleFailure(ctx, c, j, r)
	if err != nil {
		return 0, nil, err
	}
	if err := s.jobChanged(ctx, c, before.State, j); err != nil {
		return 0, nil, err
	}
	out := wire.FailResponse{Job: wireJob(j), Requeued: outcome == receipts.OutcomeRequeued, ReceiptID: rid}
	if err := s.remember(ctx, c, k, http.StatusOK, out, s.answerExpiry()); err != nil {
		return 0, nil, err
	}
	return http.StatusOK, out, nil
}

// settleFailure mints a job_failed receipt and, when the job is back in
// the queue, wakes long-polls; when it ended, records the receipt on it.
func (s *Server) settleFailure(ctx context.Context, c *call, j *lease.Job, r receipts.Receipt) (string, *lease.Job, error) {
	snap, err := s.gate.Snapshot(ctx)
	if err != nil {
		return "", nil, err
	}
	st, err := s.mintFor(ctx, c, snap, r)
	if err != nil {
		return "", nil, err
	}
	if j.State == lease.StateQueued {
		return st.ID, j, s.st.Notifier.Notify(ctx)
	}
	j, err = s.leases.SetReceipt(ctx, j.ID, st.ID)
	return st.ID, j, err
}

// codeReleased is the error_code of the job_failed receipt of a release.
const codeReleased = "released"

// release: POST /workers/jobs/{id}/release. The job goes back to the
// queue at once, without using an attempt, and long-polls wake; a job
// whose cancel was requested ends canceled instead. Either way the lease's
// end mints a job_failed receipt (error_code "released", outcome requeued
// or canceled).
func (s *Server) release(ctx context.Context, c *call) (int, any, error) {
	var req wire.ReleaseRequest
	ref, err := c.decodeLeased(&req, &req.LeaseToken)
	if err != nil {
		return 0, nil, err
	}
	// A repeat under the same lease token gets the first answer.
	k, err := tokenKeyFor(c, "release", ref, req)
	if err != nil {
		return 0, nil, err
	}
	if code, out, ok, err := s.recall(ctx, k); err != nil || ok {
		return code, out, err
	}
	before, err := s.leases.Get(ctx, ref.JobID)
	if err != nil {
		return 0, nil, err
	}
	j, err := s.leases.Release(ctx, ref, req.Reason)
	if err != nil {
		return 0, nil, err
	}
	// Every lease's end is a receipt, a release's too (before accept as
	// after): job_failed, error_code "released", outcome requeued, or
	// canceled when the job's cancel was requested.
	ended := j.ScheduledAt
	if j.FinishedAt != nil {
		ended = *j.FinishedAt
	}
	r, err := attemptFailed(j, codeReleased, j.Attempt, ended)
	if err != nil {
		return 0, nil, err
	}
	if _, j, err = s.settleFailure(ctx, c, j, r); err != nil {
		return 0, nil, err
	}
	if err := s.jobChanged(ctx, c, before.State, j); err != nil {
		return 0, nil, err
	}
	out := wire.JobResponse{Job: wireJob(j)}
	if err := s.remember(ctx, c, k, http.StatusOK, out, s.answerExpiry()); err != nil {
		return 0, nil, err
	}
	return http.StatusOK, out, nil
}

// audit: POST /workers/audit. Each event becomes a node_audit receipt
// that carries its payload's SHA-256.
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
