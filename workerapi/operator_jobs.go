package workerapi

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strings"

	"github.com/nodelane/nodelane/envelope"
	"github.com/nodelane/nodelane/lease"
	"github.com/nodelane/nodelane/receipts"
	"github.com/nodelane/nodelane/workerapi/wire"
)

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
	ds, err := s.DispatchAll(ctx, []lease.NewJob{nj})
	if be := (*lease.BatchError)(nil); errors.As(err, &be) {
		err = be.Err
	}
	if err != nil {
		return nil, false, "", err
	}
	return ds[0].Job, ds[0].Leasable, ds[0].Reason, nil
}

// Dispatched is a job DispatchAll enqueued, and whether a registered
// worker could lease it now; when not, Reason says why (see Dispatch).
type Dispatched struct {
	Job      *lease.Job
	Leasable bool
	Reason   string
}

// DispatchAll is Dispatch for several jobs, enqueued all in one
// transaction or none, with one wake-up of the long-polls (POST
// /operator/jobs/batch). Jobs of one type with the same requirements
// share one leasability verdict, their first's: one Explain for each
// kind of job, not one for each job. A job that lease.Manager.EnqueueAll
// refuses is a *lease.BatchError naming it.
func (s *Server) DispatchAll(ctx context.Context, njs []lease.NewJob) ([]Dispatched, error) {
	if len(njs) == 0 {
		return nil, fmt.Errorf("%w: no job to dispatch", ErrInvalidRequest)
	}
	ds := make([]Dispatched, len(njs))
	handled := false // only the commit was left
	err := s.st.Tx.InTx(ctx, func(ctx context.Context) error {
		handled = false
		js, err := s.leases.EnqueueAll(ctx, njs)
		if err != nil {
			return err
		}
		for i, j := range js {
			ds[i].Job = j
		}
		if err := s.st.Notifier.Notify(ctx); err != nil {
			return err
		}
		handled = true
		return nil
	})
	if err != nil && handled {
		// All or none committed: the first job tells.
		err = s.settleDispatch(ctx, ds[0].Job.ID, err)
	}
	if err != nil {
		return nil, err
	}
	for _, d := range ds {
		j := *d.Job
		s.logJob("dispatched", "", &j)
		s.hooks.emit([]hookEvent{func(ctx context.Context, h Hooks) { h.JobChanged(ctx, JobEvent{Job: j}) }})
	}
	verdicts := map[string]*Dispatched{}
	for i := range ds {
		d := &ds[i]
		kind := fmt.Sprintf("%q %#v", d.Job.Type, d.Job.Requirements)
		if v, ok := verdicts[kind]; ok {
			d.Leasable, d.Reason = v.Leasable, v.Reason
			continue
		}
		verdicts[kind] = d
		d.Leasable, d.Reason = s.dispatchedLeasable(ctx, d.Job)
	}
	return ds, nil
}

// dispatchedLeasable says whether a worker could lease job, just
// enqueued, and if not why (see Dispatch).
func (s *Server) dispatchedLeasable(ctx context.Context, job *lease.Job) (bool, string) {
	leasable, why, err := s.leasability(ctx, job)
	if err != nil {
		s.log.Error("checking whether a job is leasable", "job_id", job.ID, "err", err)
		return false, "unknown: a store did not answer while leasability was checked"
	}
	if !leasable {
		// A worker waiting in a long-poll may have leased the job since
		// the commit, even while Explain read it, and now counts it
		// against its max_jobs.
		if cur, err := s.leases.Get(ctx, job.ID); err == nil && cur.Lease != nil {
			return true, ""
		}
	}
	return leasable, why.Message
}

func (s *Server) opDispatch(ctx context.Context, c *call) (int, any, error) {
	var req wire.DispatchRequest
	if err := c.decode(&req); err != nil {
		return 0, nil, err
	}
	nj, err := newJob(&req)
	if err != nil {
		return 0, nil, err
	}
	j, ok, reason, err := s.Dispatch(ctx, nj)
	if err != nil {
		return 0, nil, err
	}
	return http.StatusCreated, wire.DispatchResponse{Job: operatorJob(j), Leasable: ok, Reason: reason}, nil
}

// opDispatchBatch: POST /operator/jobs/batch. Every job is checked
// before any is enqueued, and one that breaks a rule (newJob's, or
// lease.Manager.Enqueue's) refuses the whole request, naming it.
func (s *Server) opDispatchBatch(ctx context.Context, c *call) (int, any, error) {
	var req wire.DispatchBatchRequest
	if err := c.decode(&req); err != nil {
		return 0, nil, err
	}
	if n := len(req.Jobs); n == 0 || n > wire.MaxBatchDispatch {
		return 0, nil, invalid("jobs holds %d jobs; it must hold 1 to %d", n, wire.MaxBatchDispatch)
	}
	njs := make([]lease.NewJob, len(req.Jobs))
	for i := range req.Jobs {
		var err error
		if njs[i], err = newJob(&req.Jobs[i]); err != nil {
			return 0, nil, itemInvalid("jobs", i, err)
		}
	}
	ds, err := s.DispatchAll(ctx, njs)
	if be := (*lease.BatchError)(nil); errors.As(err, &be) && errors.Is(err, lease.ErrInvalidArgument) {
		return 0, nil, itemInvalid("jobs", be.Index, be.Err)
	}
	if err != nil {
		return 0, nil, err
	}
	out := wire.DispatchBatchResponse{Jobs: make([]wire.DispatchResponse, len(ds))}
	for i, d := range ds {
		out.Jobs[i] = wire.DispatchResponse{Job: operatorJob(d.Job), Leasable: d.Leasable, Reason: d.Reason}
	}
	return http.StatusCreated, out, nil
}

// newJob is the job a dispatch's body asks for, checked as far as the
// wire goes (lease.Manager.Enqueue checks the rest).
func newJob(req *wire.DispatchRequest) (lease.NewJob, error) {
	if req.JobType == "" {
		return lease.NewJob{}, fmt.Errorf("%w: job_type is required", ErrInvalidRequest)
	}
	payload := req.Payload
	switch p := strings.TrimSpace(string(payload)); {
	case p == "" || p == "null":
		payload = nil
	case !strings.HasPrefix(p, "{"):
		return lease.NewJob{}, fmt.Errorf("%w: payload must be a JSON object", ErrInvalidRequest)
	}
	return lease.NewJob{
		Type:         req.JobType,
		Payload:      payload,
		Requirements: lease.Requirements(req.Requirements),
		Priority:     req.Priority,
		MaxAttempts:  req.MaxAttempts,
	}, nil
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
	desc, err := qDesc(q)
	if err != nil {
		return 0, nil, err
	}
	jobs, next, err := s.leases.List(ctx, lease.JobFilter{
		State: lease.State(state), Type: jobType, LastWorkerID: workerID, Tag: tag, After: after, Limit: limit, Desc: desc,
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

// opRetryJob: POST /operator/jobs/{id}/retry. A failed or canceled job
// goes back to the queue with a fresh attempt budget (lease.Manager.Retry),
// its job_retried receipt and a wake-up of the long-polls in the same
// transaction; any other state is 409 invalid_transition, and nothing
// changes.
func (s *Server) opRetryJob(ctx context.Context, c *call) (int, any, error) {
	var req wire.ReasonRequest
	if err := c.decodeOptional(&req); err != nil {
		return 0, nil, err
	}
	var (
		prev, j *lease.Job
		minted  *receipts.Stored
	)
	err := s.st.Tx.InTx(ctx, func(ctx context.Context) error {
		var err error
		if prev, err = s.leases.Get(ctx, c.pathID()); err != nil {
			return err
		}
		if j, err = s.leases.Retry(ctx, prev.ID); err != nil {
			return err
		}
		r := receipts.Receipt{Kind: receipts.KindJobRetried, JobID: j.ID, JobType: j.Type, Actor: c.principal.ID, Reason: req.Reason}
		if e := prev.LastError; e != nil {
			r.ErrorCode = e.Code
		}
		if minted, err = s.mint(ctx, r); err != nil {
			return err
		}
		return s.st.Notifier.Notify(ctx)
	})
	if err != nil {
		return 0, nil, err
	}
	jc, from := *j, prev.State
	c.note(func() { s.logJob("retried", from, &jc) })
	ev := JobEvent{From: prev.State, Job: *j}
	c.after(func(ctx context.Context, h Hooks) { h.JobChanged(ctx, ev) })
	return http.StatusOK, wire.OperatorJobResponse{Job: operatorJob(j), ReceiptID: s.announce(c, minted)}, nil
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
	desc, err := qDesc(q)
	if err != nil {
		return 0, nil, err
	}
	if jobID != "" {
		// An unknown job is a 404, not an empty list.
		if _, err := s.leases.Get(ctx, jobID); err != nil {
			return 0, nil, err
		}
	}
	arts, err := s.leases.Artifacts(ctx, lease.ArtifactFilter{JobID: jobID, Type: typ, After: after, Limit: limit, Desc: desc})
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
	var content *string
	if a.Object != "" {
		u := wire.OperatorArtifactContentPath(a.ID)
		content = &u
	}
	return wire.ArtifactView{
		Stored:         a.Object != "",
		ContentURL:     content,
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
