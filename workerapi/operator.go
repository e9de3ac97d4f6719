package workerapi

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/nodelane/nodelane/credential"
	"github.com/nodelane/nodelane/envelope"
	"github.com/nodelane/nodelane/lease"
	"github.com/nodelane/nodelane/receipts"
	"github.com/nodelane/nodelane/workerapi/wire"
)

// The operator routes of PROTOCOL.md. They carry a bearer credential only
// and run without a transaction of the pipeline's: each handler that
// changes state makes its change, its receipt and its wake-up in one
// InTx of its own, and queues its hook events with c.after.

// rawText is an answer written as text/plain rather than JSON.
type rawText []byte

func (s *Server) writeText(w http.ResponseWriter, code int, b rawText) {
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	w.Header().Set("Cache-Control", "no-store")
	w.WriteHeader(code)
	if _, err := w.Write(b); err != nil {
		s.log.Warn("writing a response", "err", err)
	}
}

// maxPage is the largest page a list route answers.
const maxPage = 1000

// Jobs.

// settleDispatch finds out the outcome of a dispatch whose COMMIT failed
// (commitErr; a connection lost during COMMIT leaves it unknown): the job
// it enqueued is there or not. Found, the dispatch committed and it
// returns nil; not found, it did not, and commitErr stands; when the
// store cannot tell either, ErrOutcomeUnknown.
func (s *Server) settleDispatch(ctx context.Context, jobID string, commitErr error) error {
	_, err := s.leases.Get(context.WithoutCancel(ctx), jobID)
	switch {
	case err == nil:
		s.log.Warn("the outcome of a dispatch's commit was unknown: it committed", "job_id", jobID, "err", commitErr)
		return nil
	case errors.Is(err, lease.ErrNotFound):
		return commitErr
	default:
		s.log.Error("the outcome of a dispatch's commit is unknown", "job_id", jobID, "err", commitErr, "get_err", err)
		return fmt.Errorf("%w: %w", ErrOutcomeUnknown, commitErr)
	}
}

// Dispatch enqueues a job and wakes long-polls, in one transaction, and
// then says whether a registered worker could lease it now; when not,
// reason says why (see lease.Manager.Explain, and the operator route POST
// /operator/jobs; a job a worker already leased is leasable). The Hooks
// hear of the new job once it committed. If ctx carries a transaction,
// the job joins it and the hook may run before that transaction commits.
//
// It returns an error only when the job was not enqueued. A store that
// fails while leasability is checked is logged and leaves leasable false
// with a reason that says so.
func (s *Server) Dispatch(ctx context.Context, nj lease.NewJob) (job *lease.Job, leasable bool, reason string, err error) {
	handled := false // only the commit was left
	err = s.st.Tx.InTx(ctx, func(ctx context.Context) error {
		handled = false
		var err error
		if job, err = s.leases.Enqueue(ctx, nj); err != nil {
			return err
		}
		if err := s.st.Notifier.Notify(ctx); err != nil {
			return err
		}
		handled = true
		return nil
	})
	if err != nil && handled {
		err = s.settleDispatch(ctx, job.ID, err)
	}
	if err != nil {
		return nil, false, "", err
	}
	j := *job
	s.logJob("dispatched", "", &j)
	s.hooks.emit([]hookEvent{func(ctx context.Context, h Hooks) { h.JobChanged(ctx, JobEvent{Job: j}) }})
	leasable, why, err := s.leasability(ctx, job)
	if err != nil {
		s.log.Error("checking whether a job is leasable", "job_id", job.ID, "err", err)
		return job, false, "unknown: a store did not answer while leasability was checked", nil
	}
	if !leasable {
		// A worker waiting in a long-poll may have leased the job since
		// the commit, even while Explain read it, and now counts it
		// against its max_jobs.
		if cur, err := s.leases.Get(ctx, job.ID); err == nil && cur.Lease != nil {
			return job, true, "", nil
		}
	}
	return job, leasable, why.Message, nil
}

func (s *Server) opDispatch(ctx context.Context, c *call) (int, any, error) {
	var req wire.DispatchRequest
	if err := c.decode(&req); err != nil {
		return 0, nil, err
	}
	if req.JobType == "" {
		return 0, nil, fmt.Errorf("%w: job_type is required", ErrInvalidRequest)
	}
	payload := req.Payload
	switch p := strings.TrimSpace(string(payload)); {
	case p == "" || p == "null":
		payload = nil
	case !strings.HasPrefix(p, "{"):
		return 0, nil, fmt.Errorf("%w: payload must be a JSON object", ErrInvalidRequest)
	}
	j, ok, reason, err := s.Dispatch(ctx, lease.NewJob{
		Type:         req.JobType,
		Payload:      payload,
		Requirements: lease.Requirements(req.Requirements),
		Priority:     req.Priority,
		MaxAttempts:  req.MaxAttempts,
	})
	if err != nil {
		return 0, nil, err
	}
	return http.StatusCreated, wire.DispatchResponse{Job: operatorJob(j), Leasable: ok, Reason: reason}, nil
}

func (s *Server) opListJobs(ctx context.Context, c *call) (int, any, error) {
	q := c.r.URL.Query()
	state, err := qString(q, "state")
	if err != nil {
		return 0, nil, err
	}
	if state != "" && !lease.State(state).Valid() {
		return 0, nil, fmt.Errorf("%w: state must be queued, leased, running, succeeded, failed or canceled", ErrInvalidRequest)
	}
	jobType, err := qString(q, "job_type")
	if err != nil {
		return 0, nil, err
	}
	workerID, err := qString(q, "worker_id")
	if err != nil {
		return 0, nil, err
	}
	tag, err := qString(q, "tag")
	if err != nil {
		return 0, nil, err
	}
	after, err := qString(q, "after")
	if err != nil {
		return 0, nil, err
	}
	limit, err := qLimit(q)
	if err != nil {
		return 0, nil, err
	}
	jobs, next, err := s.leases.List(ctx, lease.JobFilter{
		State: lease.State(state), Type: jobType, LastWorkerID: workerID, Tag: tag, After: after, Limit: limit,
	})
	if err != nil {
		return 0, nil, err
	}
	if kept, cut := fitPage(jobs, jobBytes); cut {
		jobs, next = kept, kept[len(kept)-1].ID
	}
	out := wire.JobListResponse{Jobs: make([]wire.OperatorJob, len(jobs))}
	for i, j := range jobs {
		out.Jobs[i] = operatorJob(j)
	}
	if next != "" {
		out.Next = &next
	}
	return http.StatusOK, out, nil
}

func (s *Server) opGetJob(ctx context.Context, c *call) (int, any, error) {
	q := c.r.URL.Query()
	after, _, err := qInt(q, "events_after", 0, 1<<62)
	if err != nil {
		return 0, nil, err
	}
	j, err := s.leases.Get(ctx, c.pathID())
	if err != nil {
		return 0, nil, err
	}
	evs, err := s.leases.Events(ctx, j.ID, after, maxPage)
	if err != nil {
		return 0, nil, err
	}
	evs, evsCut := fitPage(evs, eventBytes)
	arts, err := s.leases.Artifacts(ctx, lease.ArtifactFilter{JobID: j.ID, Limit: wire.MaxJobArtifacts})
	if err != nil {
		return 0, nil, err
	}
	arts, artsCut := fitPage(arts, artifactBytes)
	ok, why, err := s.leasability(ctx, j)
	if err != nil {
		return 0, nil, err
	}
	out := wire.JobDetailResponse{
		Job:       operatorJob(j),
		Leasable:  ok,
		Reason:    why.Message,
		Events:    make([]wire.JobEventView, len(evs)),
		Artifacts: make([]wire.ArtifactView, len(arts)),
	}
	if r := j.Result; r != nil {
		out.Result = &wire.JobResult{OutputURI: nonEmpty(r.OutputURI), Metrics: orNull(r.Metrics), FinalMessage: nonEmpty(r.FinalMessage)}
	}
	for i, e := range evs {
		out.Events[i] = wireEvent(e)
	}
	if len(evs) == maxPage || evsCut {
		next := evs[len(evs)-1].ID
		out.EventsNext = &next
	}
	for i, a := range arts {
		out.Artifacts[i] = wireArtifact(a, j)
	}
	if len(arts) == wire.MaxJobArtifacts || artsCut {
		next := arts[len(arts)-1].ID
		out.ArtifactsNext = &next
	}
	return http.StatusOK, out, nil
}

func (s *Server) opCancelJob(ctx context.Context, c *call) (int, any, error) {
	if err := c.decodeOptional(&struct{}{}); err != nil {
		return 0, nil, err
	}
	var (
		prev, j *lease.Job
		arts    []*lease.Artifact
	)
	err := s.st.Tx.InTx(ctx, func(ctx context.Context) error {
		var err error
		if prev, err = s.leases.Get(ctx, c.pathID()); err != nil {
			return err
		}
		if j, err = s.leases.Cancel(ctx, prev.ID); err != nil {
			return err
		}
		if j.Rev != prev.Rev && j.State.Terminal() {
			arts, err = s.jobArtifacts(ctx, j.ID)
		}
		return err
	})
	if err != nil {
		return 0, nil, err
	}
	if l := prev.Lease; j.Rev != prev.Rev && prev.State.Live() && l != nil {
		// The worker that holds the job learns of the cancel in seconds
		// through its signals long-poll.
		s.signalWorkers(c, l.WorkerID)
	}
	if j.Rev != prev.Rev && j.State != prev.State {
		jc, from := *j, prev.State
		c.note(func() { s.logJob("canceled", from, &jc) })
	}
	if j.Rev != prev.Rev {
		ev := JobEvent{From: prev.State, Job: *j}
		for _, a := range arts {
			ev.Artifacts = append(ev.Artifacts, *a)
		}
		c.after(func(ctx context.Context, h Hooks) { h.JobChanged(ctx, ev) })
	}
	return http.StatusOK, wire.OperatorJobResponse{Job: operatorJob(j)}, nil
}

// jobArtifacts returns every artifact of a job, in id order.
func (s *Server) jobArtifacts(ctx context.Context, jobID string) ([]*lease.Artifact, error) {
	var out []*lease.Artifact
	after := ""
	for {
		page, err := s.leases.Artifacts(ctx, lease.ArtifactFilter{JobID: jobID, After: after, Limit: maxPage})
		if err != nil {
			return nil, err
		}
		out = append(out, page...)
		if len(page) < maxPage {
			return out, nil
		}
		after = page[len(page)-1].ID
	}
}

func (s *Server) opListArtifacts(ctx context.Context, c *call) (int, any, error) {
	q := c.r.URL.Query()
	jobID, err := qString(q, "job_id")
	if err != nil {
		return 0, nil, err
	}
	typ, err := qString(q, "artifact_type")
	if err != nil {
		return 0, nil, err
	}
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
	if jobID != "" {
		// An unknown job is a 404, not an empty list.
		if _, err := s.leases.Get(ctx, jobID); err != nil {
			return 0, nil, err
		}
	}
	arts, err := s.leases.Artifacts(ctx, lease.ArtifactFilter{JobID: jobID, Type: typ, After: after, Limit: limit})
	if err != nil {
		return 0, nil, err
	}
	arts, cut := fitPage(arts, artifactBytes)
	jobs := map[string]*lease.Job{}
	out := wire.ArtifactListResponse{Artifacts: make([]wire.ArtifactView, 0, len(arts))}
	for _, a := range arts {
		j, ok := jobs[a.JobID]
		if !ok {
			j, err = s.leases.Get(ctx, a.JobID)
			if errors.Is(err, lease.ErrNotFound) {
				// Retention deleted the job, and its artifacts with
				// it, since they were read: they are gone.
				jobs[a.JobID] = nil
				continue
			}
			if err != nil {
				return 0, nil, err
			}
			jobs[a.JobID] = j
		}
		if j == nil {
			continue
		}
		out.Artifacts = append(out.Artifacts, wireArtifact(a, j))
	}
	if len(arts) == limit || cut {
		next := arts[len(arts)-1].ID
		out.Next = &next
	}
	return http.StatusOK, out, nil
}

// artifactStatus is what an artifact is worth given its job's state: see
// the Artifact* constants.
func artifactStatus(a *lease.Artifact, j *lease.Job) string {
	switch j.State {
	case lease.StateSucceeded:
		if j.Lease != nil && a.Epoch != j.Lease.Epoch {
			return wire.ArtifactSuperseded
		}
		if j.Type == "lora_train" && a.Type == "adapter" {
			return wire.ArtifactTrained
		}
		return wire.ArtifactSucceeded
	case lease.StateFailed:
		return wire.ArtifactFailed
	case lease.StateCanceled:
		return wire.ArtifactCanceled
	}
	return wire.ArtifactPending
}

func wireArtifact(a *lease.Artifact, j *lease.Job) wire.ArtifactView {
	return wire.ArtifactView{
		ArtifactID:     a.ID,
		ArtifactType:   a.Type,
		Name:           a.Name,
		URI:            a.URI,
		ChecksumSHA256: nonEmpty(a.SHA256),
		SizeBytes:      a.SizeBytes,
		Metadata:       orEmptyObject(a.Metadata),
		ReceiptID:      nonEmpty(a.ReceiptID),
		CreatedAt:      a.CreatedAt,
		WorkerID:       a.WorkerID,
		LeaseEpoch:     a.Epoch,
		JobID:          j.ID,
		JobType:        j.Type,
		JobState:       string(j.State),
		Status:         artifactStatus(a, j),
	}
}

func wireEvent(e *lease.Event) wire.JobEventView {
	v := wire.JobEventView{
		ID:         e.ID,
		Kind:       string(e.Kind),
		EventType:  nonEmpty(e.Type),
		Message:    e.Message,
		Payload:    orNull(e.Payload),
		LeaseEpoch: e.Epoch,
		CreatedAt:  e.CreatedAt,
	}
	if e.Kind == lease.EventLog {
		seq := e.Seq
		v.Seq = &seq
	}
	return v
}

// Leasability.

// leasability says whether a registered worker could lease the queued job
// j now and, if not, why: the envelope first (a blocked type gives the
// envelope's reason), then lease.Manager.Explain, which matches as Lease
// does (type, SKU, GPU count, VRAM within the governor's max_vram_mb,
// backoff, bans, governor max_jobs) and gives the most decisive reason
// first. For a job in any other state it reports false and no reason; the
// reason's code tells a caller that the job was leased since j was read.
func (s *Server) leasability(ctx context.Context, j *lease.Job) (bool, lease.Reason, error) {
	if j.State != lease.StateQueued {
		return false, lease.Reason{}, nil
	}
	snap, err := s.gate.Snapshot(ctx)
	if err != nil {
		return false, lease.Reason{}, err
	}
	if err := snap.Allow(j.Type); err != nil {
		var be *envelope.BlockedError
		if errors.As(err, &be) {
			return false, lease.Reason{Code: lease.ReasonTypeNotAllowed, Message: be.Reason, JobType: j.Type}, nil
		}
		return false, lease.Reason{}, err
	}
	ex, err := s.leases.Explain(ctx, j.ID, &lease.ExplainOptions{Banned: s.banned, Job: j})
	if err != nil || ex.Leasable || len(ex.Reasons) == 0 {
		return err == nil && ex.Leasable, lease.Reason{}, err
	}
	r := ex.Reasons[0]
	if r.Code == lease.ReasonJobLeased || r.Code == lease.ReasonJobFinished {
		r.Message = ""
	}
	return false, r, nil
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
	ws, err := s.leases.Workers(ctx, after, limit)
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

// Credentials.

// maxCredentialTTL bounds ttl_seconds: ten years.
const maxCredentialTTL = 10 * 366 * 24 * 3600

// opMintCredential mints a credential for an existing principal (404 for
// an unknown one: a typo must not create an identity; principals are
// created by registration, Bootstrap, POST /operator/principals, or in Go
// with Server.Issuer), with scopes the caller's credential holds itself
// (403 otherwise). A node principal may not be given operator scopes: a
// worker machine's token must never open the operator routes.
func (s *Server) opMintCredential(ctx context.Context, c *call) (int, any, error) {
	var req wire.MintCredentialRequest
	if err := c.decode(&req); err != nil {
		return 0, nil, err
	}
	switch {
	case req.Principal == "":
		return 0, nil, fmt.Errorf("%w: principal is required", ErrInvalidRequest)
	case len(req.Scopes) == 0:
		return 0, nil, fmt.Errorf("%w: scopes must name at least one scope", ErrInvalidRequest)
	case req.TTLSeconds < 0 || req.TTLSeconds > maxCredentialTTL:
		return 0, nil, fmt.Errorf("%w: ttl_seconds must be 0 (30 days) to %d", ErrInvalidRequest, maxCredentialTTL)
	}
	scopes := make([]credential.Scope, len(req.Scopes))
	operatorScope := false
	for i, sc := range req.Scopes {
		p, err := credential.ParseScope(sc)
		if err != nil {
			return 0, nil, err
		}
		scopes[i] = p
		operatorScope = operatorScope || strings.HasPrefix(sc, "operator:")
	}
	maxUses, err := maxRegistrations(req.MaxRegistrations, scopes)
	if err != nil {
		return 0, nil, err
	}
	var (
		token  string
		cred   *credential.Credential
		minted *receipts.Stored
	)
	err = s.st.Tx.InTx(ctx, func(ctx context.Context) error {
		p, err := s.issuer.Principal(ctx, req.Principal)
		if err != nil {
			return err
		}
		if p.Kind == credential.KindNode && operatorScope {
			return fmt.Errorf("%w: a node principal may not hold operator scopes", ErrInvalidRequest)
		}
		// MintAs refuses scopes the caller's own credential lacks (403):
		// no credential mints one more powerful than itself.
		opt := credential.MintOptions{TTL: time.Duration(req.TTLSeconds) * time.Second, MaxUses: maxUses}
		if token, cred, err = s.issuer.MintAs(ctx, c.credentialID, p.ID, scopes, opt); err != nil {
			return err
		}
		minted, err = s.mint(ctx, mintedReceipt(cred, c.principal.ID))
		return err
	})
	if err != nil {
		return 0, nil, err
	}
	out := wire.MintCredentialResponse{
		CredentialID: cred.ID,
		Token:        token,
		Principal:    cred.PrincipalID,
		Scopes:       scopeStrings(cred.Scopes),
		ExpiresAt:    cred.ExpiresAt,
		ReceiptID:    *s.announce(c, minted),
	}
	out.MaxRegistrations = registrationLimit(cred)
	return http.StatusCreated, out, nil
}

func mintedReceipt(cred *credential.Credential, actor string) receipts.Receipt {
	return receipts.Receipt{
		Kind:         receipts.KindCredentialMinted,
		CredentialID: cred.ID,
		PrincipalID:  cred.PrincipalID,
		Scopes:       strings.Join(scopeStrings(cred.Scopes), " "),
		Actor:        actor,
		ExpiresAt:    cred.ExpiresAt,
	}
}

func scopeStrings(sc []credential.Scope) []string {
	out := make([]string, len(sc))
	for i, s := range sc {
		out[i] = string(s)
	}
	return out
}

func (s *Server) opRevokeCredential(ctx context.Context, c *call) (int, any, error) {
	var req wire.ReasonRequest
	if err := c.decodeOptional(&req); err != nil {
		return 0, nil, err
	}
	var (
		cred   *credential.Credential
		minted *receipts.Stored
	)
	err := s.st.Tx.InTx(ctx, func(ctx context.Context) error {
		before, err := s.issuer.Credential(ctx, c.pathID())
		if err != nil {
			return err
		}
		if cred, err = s.issuer.Revoke(ctx, before.ID); err != nil || cred.Rev == before.Rev {
			return err
		}
		minted, err = s.mint(ctx, receipts.Receipt{
			Kind: receipts.KindCredentialRevoked, CredentialID: cred.ID, PrincipalID: cred.PrincipalID,
			Actor: c.principal.ID, Reason: req.Reason,
		})
		return err
	})
	if err != nil {
		return 0, nil, err
	}
	out := wire.RevokeCredentialResponse{CredentialID: cred.ID, Principal: cred.PrincipalID, RevokedAt: *cred.RevokedAt}
	if minted != nil {
		out.ReceiptID = s.announce(c, minted)
	}
	return http.StatusOK, out, nil
}

// Envelope.

func (s *Server) opGetEnvelope(ctx context.Context, c *call) (int, any, error) {
	snap, err := s.gate.Snapshot(ctx)
	if err != nil {
		return 0, nil, err
	}
	return http.StatusOK, s.envelopeView(snap.State(), snap.Active()), nil
}

func (s *Server) envelopeView(st envelope.State, active bool) wire.EnvelopeResponse {
	p := s.gate.Policy()
	v := wire.EnvelopeResponse{
		Active:        active,
		PolicyVersion: st.Version,
		By:            st.By,
		Reason:        st.Reason,
		Until:         st.Until,
		SafeTypes:     p.SafeTypes(),
		BlockedTypes:  p.BlockedTypes(),
	}
	if !st.ChangedAt.IsZero() {
		t := st.ChangedAt
		v.ChangedAt = &t
	}
	return v
}

// opActivate activates the runtime, mints envelope_activated under the new
// policy version, and wakes long-polls (queued blocked jobs may be
// leasable now), in one transaction.
func (s *Server) opActivate(ctx context.Context, c *call) (int, any, error) {
	var req wire.ActivateRequest
	if err := c.decode(&req); err != nil {
		return 0, nil, err
	}
	var (
		st     envelope.State
		minted *receipts.Stored
	)
	err := s.st.Tx.InTx(ctx, func(ctx context.Context) error {
		var err error
		if st, err = s.gate.Activate(ctx, c.principal.ID, req.Reason, req.Until); err != nil {
			return err
		}
		r := receipts.Receipt{Kind: receipts.KindEnvelopeActivated, PolicyVersion: st.Version, Actor: c.principal.ID, Reason: req.Reason}
		if st.Until != nil {
			r.Until = *st.Until
		}
		if minted, err = s.receipts.Mint(ctx, r); err != nil {
			return err
		}
		return s.st.Notifier.Notify(ctx)
	})
	if err != nil {
		return 0, nil, err
	}
	v := s.envelopeView(st, st.Active && (st.Until == nil || s.now().Before(*st.Until)))
	v.ReceiptID = *s.announce(c, minted)
	return http.StatusOK, v, nil
}

// opDeactivate deactivates the runtime and mints envelope_deactivated
// under the new policy version, in one transaction. reason is required.
func (s *Server) opDeactivate(ctx context.Context, c *call) (int, any, error) {
	var req wire.ReasonRequest
	if err := c.decode(&req); err != nil {
		return 0, nil, err
	}
	var (
		st     envelope.State
		minted *receipts.Stored
	)
	err := s.st.Tx.InTx(ctx, func(ctx context.Context) error {
		var err error
		if st, err = s.gate.Deactivate(ctx, c.principal.ID, req.Reason); err != nil {
			return err
		}
		minted, err = s.receipts.Mint(ctx, receipts.Receipt{
			Kind: receipts.KindEnvelopeDeactivated, PolicyVersion: st.Version, Actor: c.principal.ID, Reason: req.Reason,
		})
		return err
	})
	if err != nil {
		return 0, nil, err
	}
	v := s.envelopeView(st, false)
	v.ReceiptID = *s.announce(c, minted)
	return http.StatusOK, v, nil
}

// Receipts.

// maxKindScan bounds how many receipts one page of GET
// /operator/receipts?kind= reads: a page ends early, with next set to the
// last index read, once it has read this many (wire.MaxReceiptKindScan).
const maxKindScan = wire.MaxReceiptKindScan

func (s *Server) opListReceipts(ctx context.Context, c *call) (int, any, error) {
	q := c.r.URL.Query()
	after, set, err := qInt(q, "after", 0, receipts.MaxInt-1)
	if err != nil {
		return 0, nil, err
	}
	limit, err := qLimit(q)
	if err != nil {
		return 0, nil, err
	}
	kind, err := qString(q, "kind")
	if err != nil {
		return 0, nil, err
	}
	if _, given := q["kind"]; given && !receipts.Kind(kind).Valid() {
		return 0, nil, fmt.Errorf("%w: kind %q is not a receipt kind", ErrInvalidRequest, kind)
	}
	from := int64(0)
	if set {
		from = after + 1
	}
	page := limit
	if page == 0 {
		page = 100
	}
	if kind == "" {
		rs, err := s.receipts.List(ctx, from, page)
		if err != nil {
			return 0, nil, err
		}
		out := wire.ReceiptListResponse{Receipts: make([]receipts.WireReceipt, len(rs))}
		for i, r := range rs {
			out.Receipts[i] = r.Wire()
		}
		if len(rs) == page {
			next := rs[len(rs)-1].Index
			out.Next = &next
		}
		return http.StatusOK, out, nil
	}
	// The receipts of one kind: read the log in index order and keep
	// those, until the page is full, the log ends, or maxKindScan
	// receipts were read (next is then the last index read).
	out := wire.ReceiptListResponse{Receipts: []receipts.WireReceipt{}}
	scanned, last, ended := 0, int64(-1), false
	for !ended && len(out.Receipts) < page && scanned < maxKindScan {
		want := min(maxPage, maxKindScan-scanned)
		rs, err := s.receipts.List(ctx, from, want)
		if err != nil {
			return 0, nil, err
		}
		ended = len(rs) < want
		for _, r := range rs {
			scanned++
			last = r.Index
			if r.Kind != receipts.Kind(kind) {
				continue
			}
			if out.Receipts = append(out.Receipts, r.Wire()); len(out.Receipts) == page {
				ended = false // a full page has a next one
				break
			}
		}
		from = last + 1
	}
	if !ended && last >= 0 {
		out.Next = &last
	}
	return http.StatusOK, out, nil
}

// opGetReceipt answers a receipt with its inclusion proof. It sequences
// pending receipts first (bounded by Config.ProofWait), so that a receipt
// minted a moment ago comes with its proof; if sequencing fails or takes
// too long, the receipt comes without one.
func (s *Server) opGetReceipt(ctx context.Context, c *call) (int, any, error) {
	r, err := s.receipts.Get(ctx, c.pathID())
	if err != nil {
		return 0, nil, err
	}
	if !r.Sequenced {
		sctx, cancel := context.WithTimeout(ctx, s.cfg.ProofWait)
		_, err := s.Sequence(sctx)
		cancel()
		if err != nil {
			s.log.Warn("sequencing receipts for a proof", "request_id", c.reqID, "err", err)
		}
	}
	out := wire.ReceiptResponse{Receipt: r.Wire()}
	got, proof, cp, err := s.receipts.Prove(ctx, r.ID)
	switch {
	case errors.Is(err, receipts.ErrNotSequenced):
	case err != nil:
		return 0, nil, err
	default:
		note := string(cp.Note)
		out.Receipt, out.Proof, out.Checkpoint = got.Wire(), &proof, &note
	}
	return http.StatusOK, out, nil
}

// opCheckpoint answers the latest signed checkpoint as text. On a log
// that has none yet it publishes the first.
func (s *Server) opCheckpoint(ctx context.Context, c *call) (int, any, error) {
	cp, err := s.receipts.Checkpoint(ctx)
	if errors.Is(err, receipts.ErrNotFound) {
		cp, err = s.Sequence(ctx)
	}
	if err != nil {
		return 0, nil, err
	}
	return http.StatusOK, rawText(cp.Note), nil
}

func (s *Server) opConsistency(ctx context.Context, c *call) (int, any, error) {
	q := c.r.URL.Query()
	oldSize, oldSet, err := qInt(q, "old", 0, receipts.MaxInt)
	if err != nil {
		return 0, nil, err
	}
	newSize, newSet, err := qInt(q, "new", 0, receipts.MaxInt)
	if err != nil {
		return 0, nil, err
	}
	if !oldSet || !newSet {
		return 0, nil, fmt.Errorf("%w: old and new are required", ErrInvalidRequest)
	}
	if oldSize > newSize {
		return 0, nil, fmt.Errorf("%w: old %d is greater than new %d", ErrInvalidRequest, oldSize, newSize)
	}
	hs, err := s.receipts.ConsistencyProof(ctx, oldSize, newSize)
	if err != nil {
		return 0, nil, err
	}
	return http.StatusOK, wire.ConsistencyResponse{Hashes: hs}, nil
}

// mint mints r under the policy version in force, in ctx's transaction.
func (s *Server) mint(ctx context.Context, r receipts.Receipt) (*receipts.Stored, error) {
	snap, err := s.gate.Snapshot(ctx)
	if err != nil {
		return nil, err
	}
	r.PolicyVersion = snap.Version()
	return s.receipts.Mint(ctx, r)
}

// announce queues the ReceiptMinted hook of a committed receipt and
// returns its id.
func (s *Server) announce(c *call, r *receipts.Stored) *string {
	st := *r
	c.after(func(ctx context.Context, h Hooks) { h.ReceiptMinted(ctx, st) })
	id := r.ID
	return &id
}

// Request helpers.

// decodeOptional is decode for bodies that may be empty.
func (c *call) decodeOptional(v any) error {
	if strings.TrimSpace(string(c.body)) == "" {
		return nil
	}
	return c.decode(v)
}

// qString returns a query parameter given at most once; "" when absent.
func qString(q url.Values, name string) (string, error) {
	switch vs := q[name]; len(vs) {
	case 0:
		return "", nil
	case 1:
		return vs[0], nil
	default:
		return "", fmt.Errorf("%w: query parameter %s is given %d times", ErrInvalidRequest, name, len(vs))
	}
}

// qInt returns an integer query parameter in [lo, hi], and whether it was
// given.
func qInt(q url.Values, name string, lo, hi int64) (int64, bool, error) {
	if _, ok := q[name]; !ok {
		return 0, false, nil
	}
	s, err := qString(q, name)
	if err != nil {
		return 0, false, err
	}
	n, err := strconv.ParseInt(s, 10, 64)
	if err != nil || n < lo || n > hi {
		return 0, false, fmt.Errorf("%w: %s must be an integer from %d to %d", ErrInvalidRequest, name, lo, hi)
	}
	return n, true, nil
}

// qLimit returns ?limit= (1 to 1000), or 0 when absent.
func qLimit(q url.Values) (int, error) {
	n, _, err := qInt(q, "limit", 1, maxPage)
	return int(n), err
}

func nonEmpty(s string) *string {
	if s == "" {
		return nil
	}
	return &s
}

func orNull(raw json.RawMessage) json.RawMessage {
	if len(raw) == 0 {
		return json.RawMessage("null")
	}
	return raw
}

func orEmptyObject(raw json.RawMessage) json.RawMessage {
	if len(raw) == 0 {
		return json.RawMessage("{}")
	}
	return raw
}

func orEmpty[T any](s []T) []T {
	if s == nil {
		return []T{}
	}
	return s
}
