package lease

import (
	"cmp"
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"regexp"
	"slices"
	"sync/atomic"
	"time"
)

// Manager runs the lease state machine over a Store. It is
// safe for concurrent use, and several Managers (on several replicas) may
// share one Store: every write is conditional on the revision it read.
type Manager struct {
	store Store
	cfg   Config
	// swept is the clock's time, in Unix microseconds, of the last sweep
	// of due expiries that Lease ran.
	swept atomic.Int64
	// workers is the list Explain read last (explainWorkers), valid while
	// workersGen, which every worker change through m bumps, is its gen.
	workers    atomic.Pointer[workerList]
	workersGen atomic.Uint64
}

// MaxTypeLen bounds a job's type, in bytes (Enqueue refuses a longer one).
const MaxTypeLen = 128

const (
	maxAttempts = 100
	casTries    = 16
	expireBatch = 64
	maxListPage = 1000
)

// NewManager returns a Manager over s with cfg's settings, each zero one
// replaced by its default (Config.WithDefaults). cfg may be nil. It
// panics if cfg is invalid: a host checks its configuration with
// WithDefaults first (workerapi.New reports the same errors as values).
func NewManager(s Store, cfg *Config) *Manager {
	var c Config
	if cfg != nil {
		c = *cfg
	}
	c, err := c.WithDefaults()
	if err != nil {
		panic(err)
	}
	return &Manager{store: s, cfg: c}
}

// LeaseTTL returns the configured lease lifetime.
func (m *Manager) LeaseTTL() time.Duration { return m.cfg.LeaseTTL }

// MaxLeases returns how many live leases w may hold: its governor's
// max_jobs (0 meaning 1), capped at Config.MaxLeasesPerWorker.
func (m *Manager) MaxLeases(w *Worker) int {
	return min(max(w.Governor.MaxJobs, 1), m.cfg.MaxLeasesPerWorker)
}

// now is the Manager's clock in UTC, truncated to microseconds so that
// every store round-trips it exactly.
func (m *Manager) now() time.Time { return m.cfg.Now().UTC().Truncate(time.Microsecond) }

// NewJob describes a job to enqueue.
type NewJob struct {
	// ID is optional; the Manager assigns one when it is empty.
	ID   string
	Type string
	// Payload is any JSON value; empty means {}.
	Payload      json.RawMessage
	Requirements Requirements
	Priority     int
	// MaxAttempts defaults to Config.DefaultMaxAttempts; at most 100.
	MaxAttempts int
	// ScheduledAt, when later than now, delays the job.
	ScheduledAt time.Time
}

var sha256Hex = regexp.MustCompile(`^[0-9a-f]{64}$`)

// Enqueue adds a queued job. Its Requirements.Tags (at most MaxJobTags,
// each 1 to MaxTagLen bytes of UTF-8 without spaces or control
// characters) are stored sorted and deduplicated, nil when none.
// ErrInvalidArgument for requirements or attempts out of bounds.
func (m *Manager) Enqueue(ctx context.Context, nj NewJob) (*Job, error) {
	js, err := m.EnqueueAll(ctx, []NewJob{nj})
	if be := (*BatchError)(nil); errors.As(err, &be) {
		err = be.Err
	}
	if err != nil {
		return nil, err
	}
	return js[0], nil
}

// EnqueueAll adds queued jobs, each as Enqueue would, in one
// Store.CreateJobs call: all or none. A job it refuses is a *BatchError
// that names it.
func (m *Manager) EnqueueAll(ctx context.Context, njs []NewJob) ([]*Job, error) {
	js := make([]*Job, len(njs))
	for i, nj := range njs {
		j, err := m.newJob(nj)
		if err != nil {
			return nil, &BatchError{Index: i, Err: err}
		}
		js[i] = j
	}
	if err := m.store.CreateJobs(ctx, js); err != nil {
		return nil, err
	}
	return js, nil
}

// BatchError is the refusal of one item of a batch (EnqueueAll): nothing
// of the batch was done. Index is the item's, Err why.
type BatchError struct {
	Index int
	Err   error
}

func (e *BatchError) Error() string { return fmt.Sprintf("item %d: %v", e.Index, e.Err) }

// Unwrap returns Err.
func (e *BatchError) Unwrap() error { return e.Err }

// newJob is the queued job nj asks for, or ErrInvalidArgument.
func (m *Manager) newJob(nj NewJob) (*Job, error) {
	if nj.Type == "" || len(nj.Type) > MaxTypeLen {
		return nil, fmt.Errorf("%w: job type must be 1 to %d bytes", ErrInvalidArgument, MaxTypeLen)
	}
	r := nj.Requirements
	if r.GPUCount < 0 || r.MinVRAMMB < 0 || r.MaxRuntimeSeconds < 0 {
		return nil, fmt.Errorf("%w: requirements must not be negative", ErrInvalidArgument)
	}
	if limit := int64(MaxRuntimeLimit / time.Second); int64(r.MaxRuntimeSeconds) > limit {
		return nil, fmt.Errorf("%w: max_runtime_seconds must be at most %d (30 days)", ErrInvalidArgument, limit)
	}
	var err error
	if r.Tags, err = pins("requirements.tags", r.Tags); err != nil {
		return nil, err
	}
	if (r.GPUSKU != "" || r.MinVRAMMB > 0) && r.GPUCount == 0 {
		r.GPUCount = 1 // a SKU or a VRAM floor implies a GPU
	}
	nj.MaxAttempts = cmp.Or(nj.MaxAttempts, m.cfg.DefaultMaxAttempts)
	if nj.MaxAttempts < 1 || nj.MaxAttempts > maxAttempts {
		return nil, fmt.Errorf("%w: max_attempts must be 1 to %d", ErrInvalidArgument, maxAttempts)
	}
	if len(nj.Payload) == 0 {
		nj.Payload = json.RawMessage("{}")
	} else if !json.Valid(nj.Payload) {
		return nil, fmt.Errorf("%w: payload is not valid JSON", ErrInvalidArgument)
	}
	now := m.now()
	id := nj.ID
	if id == "" {
		if id, err = newID("job_", now, m.cfg.Rand); err != nil {
			return nil, err
		}
	}
	sched := now
	if nj.ScheduledAt.After(now) {
		sched = nj.ScheduledAt.UTC().Truncate(time.Microsecond)
	}
	return &Job{
		ID:           id,
		Type:         nj.Type,
		Payload:      nj.Payload,
		Requirements: r,
		Priority:     nj.Priority,
		MaxAttempts:  nj.MaxAttempts,
		State:        StateQueued,
		Attempt:      1,
		CreatedAt:    now,
		ScheduledAt:  sched,
		Rev:          1,
	}, nil
}

// RegisterWorker stores w, assigning its ID when empty, and returns it.
// Registering an existing worker replaces its record but keeps its
// RegisteredAt and its Approval (see Approve). A new worker is stored
// with w.Approval: a control plane that approves nodes sets Pending.
func (m *Manager) RegisterWorker(ctx context.Context, w *Worker) (*Worker, error) {
	if w.NodeID == "" {
		return nil, fmt.Errorf("%w: node_id is required", ErrInvalidArgument)
	}
	if w.Governor.MaxJobs < 0 || w.Governor.MaxVRAMMB < 0 {
		return nil, fmt.Errorf("%w: governor limits must not be negative", ErrInvalidArgument)
	}
	if slices.ContainsFunc(w.Capabilities.GPUs, func(g GPU) bool { return g.VRAMMB < 0 }) {
		return nil, fmt.Errorf("%w: vram_mb must not be negative", ErrInvalidArgument)
	}
	now := m.now()
	c := *w
	if c.ID == "" {
		var err error
		if c.ID, err = newID("wrk_", now, m.cfg.Rand); err != nil {
			return nil, err
		}
	}
	if old, err := m.store.GetWorker(ctx, c.ID); err == nil {
		c.RegisteredAt = old.RegisteredAt
		c.Approval = old.Approval
	} else if !errors.Is(err, ErrNotFound) {
		return nil, err
	}
	if c.RegisteredAt.IsZero() {
		c.RegisteredAt = now
	}
	c.LastSeenAt = now
	if err := m.store.PutWorker(ctx, &c); err != nil {
		return nil, err
	}
	m.forgetWorkers()
	return &c, nil
}

// Heartbeat records that a worker is alive, with its status and latest
// metrics (nil keeps the previous ones). A HeartbeatStore writes just
// that, in one statement; another Store gets the worker and puts it back.
func (m *Manager) Heartbeat(ctx context.Context, workerID, status string, metrics json.RawMessage) (*Worker, error) {
	if metrics != nil && !json.Valid(metrics) {
		return nil, fmt.Errorf("%w: metrics are not valid JSON", ErrInvalidArgument)
	}
	if hs, ok := m.store.(HeartbeatStore); ok {
		return hs.Heartbeat(ctx, workerID, status, metrics, m.now())
	}
	w, err := m.store.GetWorker(ctx, workerID)
	if err != nil {
		return nil, err
	}
	if metrics != nil {
		w.Metrics = metrics
	}
	if status != "" && w.Status != StatusRetired {
		w.Status = status
	}
	w.LastSeenAt = m.now()
	if err := m.store.PutWorker(ctx, w); err != nil {
		return nil, err
	}
	return w, nil
}

// LeaseRequest asks for jobs on behalf of one registered worker.
type LeaseRequest struct {
	WorkerID string
	// JobTypes the worker will run now; empty means its registered ones.
	// They narrow the worker's registered types (and its approval's pinned
	// ones), never widen them: a type it did not register is ignored.
	JobTypes []string
	// GPUSKUs the worker offers now; empty means its registered GPUs'. Only
	// SKUs of GPUs the worker registered count.
	GPUSKUs []string
	// MaxJobs caps how many jobs this call leases. Defaults to 1.
	MaxJobs int
	// Allow, when set, gates job types: a type it refuses is not leased.
	// It is how the envelope gates types without lease importing it.
	Allow func(jobType string) bool
	// PolicyVersion is stamped on each lease.
	PolicyVersion int64
	// Price, when set, gives the price per GPU-hour in micro-USD of a SKU;
	// it is snapshotted on each lease.
	Price func(sku string) int64
	// Accept claims the jobs straight into running, in the claim's one
	// write, as Accept would right after the lease: AcceptedAt is the
	// claim's time and the lease expires at the lesser of LeaseTTL and the
	// job's max runtime from then. Allow gates the types before the claim;
	// nothing is checked again between the lease and the accept.
	Accept bool
	// Planned, when set, is called with the claim Lease is about to make,
	// before it runs, and not when the worker may claim nothing. Two
	// claims with equal Types, Fits and Tags consider the same jobs.
	Planned func(ClaimQuery)
}

// Grant is one leased job and its token. The token is returned only here.
type Grant struct {
	Job   *Job
	Token string
	// Leased is, for a job claimed with LeaseRequest.Accept, the job as a
	// lease without accept would have left it (leased, not accepted, its
	// lease expiring LeaseTTL after the claim, Rev one below Job's): what
	// a caller that reports a lease then an accept reports first. It is
	// nil otherwise.
	Leased *Job
}

// Lease claims up to MaxJobs queued jobs that the worker can run: the
// types it asks for among those it registered and its approval allows (as
// Allow allows), its GPUs and VRAM, its effective tags (a job's
// Requirements.Tags must all be among Worker.EffectiveTags), within its
// live-lease limit (MaxLeases), higher priority first, then oldest. A
// worker whose approval is pending is granted nothing. It returns no
// grants, and no error, when nothing is eligible (ExplainLease says why).
// Due lease expiries are swept first, at most once a second of the clock:
// a host that leases rarely, or needs expired jobs back sooner, calls
// Expire (workerapi's maintainer does).
func (m *Manager) Lease(ctx context.Context, req LeaseRequest) ([]Grant, error) {
	n := cmp.Or(req.MaxJobs, 1)
	if n < 0 {
		return nil, fmt.Errorf("%w: max_jobs must be positive", ErrInvalidArgument)
	}
	n = min(n, m.cfg.MaxJobsPerLease)
	var (
		tokens []string
		leases []Lease
	)
	// plan turns the worker into its claim, with n leases prepared, or
	// says it may claim nothing.
	plan := func(w *Worker) (ClaimQuery, LeaseClaim, bool, error) {
		if w.Approval.Pending || w.Status == StatusRetired || w.Drain != nil {
			return ClaimQuery{}, LeaseClaim{}, false, nil
		}
		allowed := w.leaseTypes(req.JobTypes)
		if req.Allow != nil {
			allowed = slices.DeleteFunc(allowed, func(t string) bool { return !req.Allow(t) })
		}
		if len(allowed) == 0 {
			return ClaimQuery{}, LeaseClaim{}, false, nil
		}
		now := m.now()
		tokens, leases = make([]string, n), make([]Lease, n)
		for i := range n {
			tok, hash, err := newToken(m.cfg.Rand)
			if err != nil {
				return ClaimQuery{}, LeaseClaim{}, false, err
			}
			id, err := newID("lse_", now, m.cfg.Rand)
			if err != nil {
				return ClaimQuery{}, LeaseClaim{}, false, err
			}
			tokens[i] = tok
			leases[i] = Lease{
				ID:            id,
				WorkerID:      w.ID,
				TokenHash:     hash,
				ExpiresAt:     now.Add(m.cfg.LeaseTTL),
				AcceptBy:      now.Add(m.cfg.AcceptTimeout),
				PolicyVersion: req.PolicyVersion,
			}
		}
		q := ClaimQuery{
			WorkerID:  w.ID,
			Types:     allowed,
			Fits:      w.Fits(req.GPUSKUs),
			Tags:      w.EffectiveTags(),
			MaxActive: m.MaxLeases(w),
			Limit:     n,
			Now:       now,
		}
		if req.Planned != nil {
			req.Planned(q)
		}
		return q, m.leaseClaim(w, q, leases, req), true, nil
	}
	if err := m.sweep(ctx); err != nil {
		return nil, err
	}
	jobs, err := m.store.ClaimLeases(ctx, req.WorkerID, plan)
	if err != nil {
		return nil, err
	}
	if len(jobs) > n {
		return nil, fmt.Errorf("lease: store claimed %d jobs, more than the %d asked for", len(jobs), n)
	}
	grants := make([]Grant, len(jobs))
	used := make([]bool, n)
	for i, j := range jobs {
		k := -1
		if j.Lease != nil {
			k = slices.IndexFunc(leases, func(l Lease) bool { return l.ID == j.Lease.ID })
		}
		if k < 0 || used[k] || j.Lease.JobID != j.ID || !tokenMatches(tokens[k], j.Lease.TokenHash) {
			return nil, fmt.Errorf("lease: store returned job %s with a lease it was not granted", j.ID)
		}
		used[k] = true
		grants[i] = Grant{Job: j, Token: tokens[k]}
		if req.Accept {
			grants[i].Leased = m.leasedView(j)
		}
	}
	return grants, nil
}

// leasedView is j, claimed with accept, as the claim would have left it
// without: leased, not accepted, its lease expiring LeaseTTL after the
// claim, one revision earlier.
func (m *Manager) leasedView(j *Job) *Job {
	v, l := *j, *j.Lease
	v.State, v.AcceptedAt, v.Rev = StateLeased, nil, j.Rev-1
	if j.LeasedAt != nil {
		l.ExpiresAt = j.LeasedAt.Add(m.cfg.LeaseTTL)
	}
	v.Lease = &l
	return &v
}

// leaseClaim is what the claim writes for the leases prepared for w, as
// req asks: the SKU of a job that names none is the worker's first GPU's,
// and prices are looked up for every SKU a claimed job can have (its own,
// which one of q.Fits names, or that default).
func (m *Manager) leaseClaim(w *Worker, q ClaimQuery, leases []Lease, req LeaseRequest) LeaseClaim {
	c := LeaseClaim{Leases: leases, Accept: req.Accept, MaxRuntime: m.cfg.MaxRuntime}
	if len(w.Capabilities.GPUs) > 0 {
		c.DefaultSKU = w.Capabilities.GPUs[0].SKU
	}
	if req.Price != nil {
		c.Prices = map[string]int64{c.DefaultSKU: req.Price(c.DefaultSKU)}
		for _, f := range q.Fits {
			if _, ok := c.Prices[f.SKU]; !ok {
				c.Prices[f.SKU] = req.Price(f.SKU)
			}
		}
	}
	return c
}

// sweepEvery is how often, at most, Lease sweeps due expiries itself. A
// lease past its expiry is dead at once to every check (the checks are
// lazy); the sweep only puts its job back in the queue, which a host's
// maintainer (Expire) does too. Sweeping on every Lease would cost every
// claim a statement.
const sweepEvery = time.Second

// sweep runs one bounded expiry sweep unless Lease ran one within
// sweepEvery of the clock's now, before or after (a clock set back sweeps
// too).
func (m *Manager) sweep(ctx context.Context) error {
	if m.cfg.HoldSweeps != nil && m.cfg.HoldSweeps() {
		return nil
	}
	now := m.now().UnixMicro()
	last := m.swept.Load()
	if d := now - last; d >= 0 && d < sweepEvery.Microseconds() || !m.swept.CompareAndSwap(last, now) {
		return nil
	}
	_, err := m.expire(ctx, expireBatch)
	return err
}

// Ref names the lease a worker acts under: the job, the worker, and the
// token it was given.
type Ref struct {
	JobID    string
	WorkerID string
	Token    string
}

// update reads the job, lets fn decide its next version, and writes it
// conditionally on the revision read, retrying when another writer got
// there first. fn returns the job to write, or nil to write nothing.
func (m *Manager) update(ctx context.Context, id string, fn func(j *Job, now time.Time) (*Job, error)) (*Job, error) {
	for range casTries {
		j, err := m.store.GetJob(ctx, id)
		if err != nil {
			return nil, err
		}
		rev := j.Rev
		next, err := fn(j, m.now())
		if err != nil || next == nil {
			return j, err
		}
		next.Rev = rev + 1
		err = m.store.UpdateJob(ctx, next, rev)
		if errors.Is(err, ErrConflict) {
			continue
		}
		if err != nil {
			return nil, err
		}
		return next, nil
	}
	return nil, fmt.Errorf("lease: job %s: %w: too many concurrent writers", id, ErrConflict)
}

// held checks that ref's token is the lease recorded on j for ref's
// worker. It does not check whether the lease is still live.
func held(j *Job, ref Ref) bool { return guard(ref, time.Time{}).names(j) }

// live checks that ref holds j's live lease at now, and otherwise says
// why not. On a finished job, the lease that ended it gets a
// *TransitionError, unless the lease ran out first (expired, or revoked
// by a cancel's grace or the max runtime): then the lease is lost.
func (m *Manager) live(j *Job, ref Ref, now time.Time, to State) error {
	if !held(j, ref) {
		return ErrLeaseLost
	}
	if j.State.Terminal() && !revokedBefore(j) {
		return &TransitionError{JobID: j.ID, From: j.State, To: to}
	}
	if !liveAt(j, now, m.cfg.MaxRuntime) {
		return ErrLeaseLost
	}
	return nil
}

func (m *Manager) withLease(ctx context.Context, ref Ref, to State, fn func(j *Job, now time.Time) (*Job, error)) (*Job, error) {
	if err := checkToken(ref.Token); err != nil {
		return nil, err
	}
	return m.update(ctx, ref.JobID, func(j *Job, now time.Time) (*Job, error) {
		if err := m.live(j, ref, now, to); err != nil {
			return nil, err
		}
		return fn(j, now)
	})
}

// Accept moves a leased job to running. Accepting a job already running
// under the same lease returns it unchanged.
func (m *Manager) Accept(ctx context.Context, ref Ref) (*Job, error) {
	if err := checkToken(ref.Token); err != nil {
		return nil, err
	}
	for range casTries {
		j, err := first(m.store.AcceptLeased(ctx, []AcceptWrite{{Guard: guard(ref, m.now()), TTL: m.cfg.LeaseTTL, MaxRuntime: m.cfg.MaxRuntime}}))
		if err != nil || j != nil {
			return j, err
		}
		// The guard did not hold: say why, or try again if it holds now.
		if j, err = m.store.GetJob(ctx, ref.JobID); err != nil {
			return nil, err
		}
		if err := m.live(j, ref, m.now(), StateRunning); err != nil {
			return nil, err
		}
		if j.State == StateRunning {
			return j, nil
		}
	}
	return nil, fmt.Errorf("lease: job %s: %w: too many concurrent writers", ref.JobID, ErrConflict)
}

// first is the one job, or nil, a guarded write of one returned.
func first(js []*Job, err error) (*Job, error) {
	if err == nil && len(js) != 1 {
		err = fmt.Errorf("lease: store answered %d guarded writes of 1", len(js))
	}
	if err != nil {
		return nil, err
	}
	return js[0], nil
}

// Extend renews the lease for another LeaseTTL from now, but never past
// the job's max runtime, and not at all once its cancel was requested.
func (m *Manager) Extend(ctx context.Context, ref Ref) (*Job, error) {
	return m.withLease(ctx, ref, StateRunning, func(j *Job, now time.Time) (*Job, error) {
		m.extend(j, now)
		return j, nil
	})
}

// Touched is what Touch did with the jobs a worker listed.
type Touched struct {
	// Leases are the listed jobs whose live lease the worker holds, with
	// their leases extended.
	Leases []*Job
	// Lost are the listed jobs whose live lease the worker does not hold.
	Lost []string
	// Cancel are the jobs among Leases whose cancel was requested.
	Cancel []string
}

// Touch extends the worker's live leases on the listed jobs, as a
// heartbeat does, and as Extend does (never past the max runtime, not
// after a cancel request): the worker is already authenticated, so it
// names jobs rather than presenting tokens. A listed job that is unknown,
// not live, past its TTL, accept deadline or max runtime, or leased to
// another worker is lost.
func (m *Manager) Touch(ctx context.Context, workerID string, jobIDs []string) (Touched, error) {
	var t Touched
	seen := map[string]bool{}
	for _, id := range jobIDs {
		if seen[id] {
			continue
		}
		seen[id] = true
		j, err := m.update(ctx, id, func(j *Job, now time.Time) (*Job, error) {
			if j.Lease == nil || j.Lease.WorkerID != workerID || !liveAt(j, now, m.cfg.MaxRuntime) {
				return nil, ErrLeaseLost
			}
			m.extend(j, now)
			return j, nil
		})
		switch {
		case errors.Is(err, ErrLeaseLost), errors.Is(err, ErrNotFound):
			t.Lost = append(t.Lost, id)
		case err != nil:
			return Touched{}, err
		default:
			t.Leases = append(t.Leases, j)
			if j.CancelRequested {
				t.Cancel = append(t.Cancel, id)
			}
		}
	}
	return t, nil
}

// EventsResult says what RecordEvents stored.
type EventsResult struct {
	// Accepted counts new events; Duplicates counts log lines whose seq was
	// already stored.
	Accepted, Duplicates int
	// Job is the job after its lease was extended.
	Job *Job
}

// RecordEvents stores status events and log lines under a live lease and
// extends it. Log lines need a seq >= 1; a seq already stored for the job
// is counted as a duplicate and not stored again.
func (m *Manager) RecordEvents(ctx context.Context, ref Ref, evs ...Event) (EventsResult, error) {
	if len(evs) == 0 {
		return EventsResult{}, fmt.Errorf("%w: no events", ErrInvalidArgument)
	}
	for _, e := range evs {
		switch {
		case e.Kind == EventLog && e.Seq < 1:
			return EventsResult{}, fmt.Errorf("%w: a log line needs seq >= 1", ErrInvalidArgument)
		case e.Kind == EventStatus && e.Type == "":
			return EventsResult{}, fmt.Errorf("%w: a status event needs an event_type", ErrInvalidArgument)
		case e.Kind != EventLog && e.Kind != EventStatus:
			return EventsResult{}, fmt.Errorf("%w: unknown event kind %q", ErrInvalidArgument, e.Kind)
		case len(e.Payload) > 0 && !json.Valid(e.Payload):
			return EventsResult{}, fmt.Errorf("%w: event payload is not valid JSON", ErrInvalidArgument)
		}
	}
	j, err := m.Extend(ctx, ref)
	if err != nil {
		return EventsResult{}, err
	}
	now := m.now()
	ptrs := make([]*Event, len(evs))
	for i, e := range evs {
		e.ID, e.JobID, e.Epoch, e.CreatedAt = 0, j.ID, j.Lease.Epoch, now
		if e.Kind == EventStatus {
			e.Seq = 0
		}
		ptrs[i] = &e
	}
	n, err := m.store.AddEvents(ctx, ptrs)
	if err != nil {
		return EventsResult{}, err
	}
	return EventsResult{Accepted: n, Duplicates: len(evs) - n, Job: j}, nil
}

// Events returns a job's events with ID > after, in order.
func (m *Manager) Events(ctx context.Context, jobID string, after int64, limit int) ([]*Event, error) {
	return m.store.ListEvents(ctx, jobID, after, m.pageSize(limit))
}

// AddArtifact records an artifact under a live lease and extends it. The
// caller may set ReceiptID; the Manager sets ID, JobID, WorkerID, Epoch
// and CreatedAt.
func (m *Manager) AddArtifact(ctx context.Context, ref Ref, a Artifact) (*Artifact, error) {
	switch {
	case a.Type == "" || a.Name == "":
		return nil, fmt.Errorf("%w: artifact_type and name are required", ErrInvalidArgument)
	case a.SHA256 != "" && !sha256Hex.MatchString(a.SHA256):
		return nil, fmt.Errorf("%w: checksum_sha256 must be 64 lowercase hex digits", ErrInvalidArgument)
	case a.SizeBytes < 0:
		return nil, fmt.Errorf("%w: size_bytes must not be negative", ErrInvalidArgument)
	case len(a.Metadata) > 0 && !json.Valid(a.Metadata):
		return nil, fmt.Errorf("%w: metadata is not valid JSON", ErrInvalidArgument)
	}
	j, err := m.Extend(ctx, ref)
	if err != nil {
		return nil, err
	}
	now := m.now()
	id, err := newID("art_", now, m.cfg.Rand)
	if err != nil {
		return nil, err
	}
	a.ID, a.JobID, a.WorkerID, a.Epoch, a.CreatedAt = id, j.ID, ref.WorkerID, j.Lease.Epoch, now
	if err := m.store.AddArtifact(ctx, &a); err != nil {
		return nil, err
	}
	return &a, nil
}

// Artifact returns the artifact with id id, or ErrNotFound.
func (m *Manager) Artifact(ctx context.Context, id string) (*Artifact, error) {
	return m.store.GetArtifact(ctx, id)
}

// Artifacts lists artifacts matching f, in id order (newest first when
// f.Desc).
func (m *Manager) Artifacts(ctx context.Context, f ArtifactFilter) ([]*Artifact, error) {
	f.Limit = m.pageSize(f.Limit)
	return m.store.ListArtifacts(ctx, f)
}

// Complete moves a running job to succeeded with its result, and sets
// its ReceiptID to res.ReceiptID when that is not empty. Completing
// again with the same token returns the stored job and repeated = true,
// and changes nothing.
//
// A job whose cancel was requested never succeeds. Completing it under its
// lease (live, or run out but not yet swept) ends it canceled at once, as
// Release would, and returns the job so changed together with an error
// that matches ErrCanceled: the change is made, and a caller that runs
// Complete in a transaction must commit it although an error came back.
// Completing, with its last lease's token, a job that ended canceled
// returns nil and ErrCanceled, and changes nothing.
func (m *Manager) Complete(ctx context.Context, ref Ref, res Result) (job *Job, repeated bool, err error) {
	cs := []Completion{{Ref: ref, Result: res}}
	if err := m.CompleteAll(ctx, cs); err != nil {
		return nil, false, err
	}
	return cs[0].Job, cs[0].Repeated, cs[0].Err
}

// Completion is one completion of CompleteAll: Ref and Result in, and
// out what Complete returns for them.
type Completion struct {
	Ref    Ref
	Result Result

	Job      *Job
	Repeated bool
	Err      error
}

// CompleteAll completes each of cs as Complete would, and sets its Job,
// Repeated and Err: the completions whose lease holds in one
// Store.CompleteRunning call, the others (a repeat, a cancel, a lost
// lease) one by one. Its own error is that call's, and then no Err is
// set: nothing of cs is to be kept.
func (m *Manager) CompleteAll(ctx context.Context, cs []Completion) error {
	var (
		ws []CompleteWrite
		at []int
	)
	for i := range cs {
		c := &cs[i]
		c.Job, c.Repeated, c.Err = nil, false, checkToken(c.Ref.Token)
		if len(c.Result.Metrics) > 0 && !json.Valid(c.Result.Metrics) {
			c.Err = fmt.Errorf("%w: metrics are not valid JSON", ErrInvalidArgument)
		}
		if c.Err == nil {
			ws = append(ws, CompleteWrite{Guard: guard(c.Ref, m.now()), MaxRuntime: m.cfg.MaxRuntime, Result: c.Result})
			at = append(at, i)
		}
	}
	if len(ws) == 0 {
		return nil
	}
	js, err := m.store.CompleteRunning(ctx, ws)
	if err == nil && len(js) != len(ws) {
		err = fmt.Errorf("lease: store answered %d guarded writes of %d", len(js), len(ws))
	}
	if err != nil {
		return err
	}
	for k, i := range at {
		c := &cs[i]
		if c.Job = js[k]; c.Job == nil {
			c.Job, c.Repeated, c.Err = m.completeUnguarded(ctx, c.Ref, ws[k])
		}
	}
	return nil
}

// completeUnguarded is a completion whose guarded write w did not apply:
// it tells why (a repeat, a cancel, a lost lease), or writes it again if a
// write that raced it left its guard holding again.
func (m *Manager) completeUnguarded(ctx context.Context, ref Ref, w CompleteWrite) (job *Job, repeated bool, err error) {
	for range casTries {
		var canceled, again bool
		j, err := m.update(ctx, ref.JobID, func(j *Job, now time.Time) (*Job, error) {
			canceled, again, repeated = false, false, false
			switch {
			case held(j, ref) && j.State == StateSucceeded:
				repeated = true
				return nil, nil
			case held(j, ref) && j.State == StateCanceled:
				return nil, fmt.Errorf("%w: job %s ended canceled", ErrCanceled, j.ID)
			case held(j, ref) && j.State.Live() && j.CancelRequested:
				// Its lease may have run out unswept: the expiry would end it
				// canceled too.
				finish(j, StateCanceled, now)
				canceled = true
				return j, nil
			}
			if err := m.live(j, ref, now, StateSucceeded); err != nil {
				return nil, err
			}
			if j.State != StateRunning {
				return nil, &TransitionError{JobID: j.ID, From: j.State, To: StateSucceeded}
			}
			again = true
			return nil, nil
		})
		switch {
		case err != nil:
			return nil, false, err
		case canceled:
			return j, false, fmt.Errorf("%w: its cancel was requested; the job ended canceled", ErrCanceled)
		case !again:
			return j, repeated, nil
		}
		w.Now = m.now()
		if j, err = first(m.store.CompleteRunning(ctx, []CompleteWrite{w})); err != nil || j != nil {
			return j, false, err
		}
	}
	return nil, false, fmt.Errorf("lease: job %s: %w: too many concurrent writers", ref.JobID, ErrConflict)
}

// Failure is a worker's report that an attempt failed.
type Failure struct {
	Code    string
	Message string
	Payload json.RawMessage
	// Retryable asks for another attempt, if any is left.
	Retryable bool
}

// Fail ends the current attempt. A job whose cancel was requested ends
// canceled. Otherwise a retryable failure after accept uses an attempt and,
// if one is left, requeues the job after a backoff with jitter; before
// accept it requeues at once without using one. A job that is not
// retryable, or out of attempts, ends failed with the failure as its
// LastError.
func (m *Manager) Fail(ctx context.Context, ref Ref, f Failure) (*Job, error) {
	if len(f.Payload) > 0 && !json.Valid(f.Payload) {
		return nil, fmt.Errorf("%w: payload is not valid JSON", ErrInvalidArgument)
	}
	return m.withLease(ctx, ref, StateFailed, func(j *Job, now time.Time) (*Job, error) {
		j.LastError = &JobError{Code: f.Code, Message: f.Message, Payload: f.Payload, Attempt: j.Attempt, At: now}
		switch {
		case j.CancelRequested:
			finish(j, StateCanceled, now)
		case f.Retryable:
			m.requeue(j, now, j.State != StateLeased)
		default:
			finish(j, StateFailed, now)
		}
		return j, nil
	})
}

// Release hands a leased or running job back to the queue at once, without
// using an attempt; a job whose cancel was requested ends canceled instead.
func (m *Manager) Release(ctx context.Context, ref Ref, reason string) (*Job, error) {
	return m.withLease(ctx, ref, StateQueued, func(j *Job, now time.Time) (*Job, error) {
		if j.CancelRequested {
			finish(j, StateCanceled, now)
		} else {
			m.requeue(j, now, false)
		}
		return j, nil
	})
}

// Cancel cancels a job: a queued one at once; a leased or running one by
// requesting it, which its worker learns from heartbeat, status and accept
// answers and ends with Fail or Release. The request also bounds the
// lease: it is never extended again, and expires within CancelGrace, when
// expiry ends the job canceled (so a worker that goes silent, or ignores
// the cancel, holds it no longer); Complete ends it canceled too. Canceling
// a canceled job returns it unchanged; a succeeded or failed job gives a
// *TransitionError.
func (m *Manager) Cancel(ctx context.Context, jobID string) (*Job, error) {
	return m.update(ctx, jobID, func(j *Job, now time.Time) (*Job, error) {
		switch j.State {
		case StateQueued:
			finish(j, StateCanceled, now)
			return j, nil
		case StateLeased, StateRunning:
			if j.CancelRequested {
				return nil, nil
			}
			j.CancelRequested = true
			j.Lease.ExpiresAt = minTime(j.Lease.ExpiresAt, now.Add(m.cfg.CancelGrace))
			return j, nil
		case StateCanceled:
			return nil, nil
		}
		return nil, &TransitionError{JobID: j.ID, From: j.State, To: StateCanceled}
	})
}

// Retry puts a failed or canceled job back in the queue at once, with a
// fresh attempt budget: Attempt 1 of its MaxAttempts, no cancel request,
// no result or settling receipt. Its LastError and its last Lease stay,
// as history (the next lease's epoch follows that one's). A job in any
// other state is a *TransitionError (ErrInvalidTransition), and nothing
// changes; an unknown job is ErrNotFound.
func (m *Manager) Retry(ctx context.Context, jobID string) (*Job, error) {
	return m.update(ctx, jobID, func(j *Job, now time.Time) (*Job, error) {
		if j.State != StateFailed && j.State != StateCanceled {
			return nil, &TransitionError{JobID: j.ID, From: j.State, To: StateQueued}
		}
		j.State = StateQueued
		j.Attempt = 1
		j.ScheduledAt = now
		j.FinishedAt = nil
		j.CancelRequested = false
		j.ReceiptID = ""
		j.Result = nil
		return j, nil
	})
}

// SetReceipt records the receipt that settled a finished job.
func (m *Manager) SetReceipt(ctx context.Context, jobID, receiptID string) (*Job, error) {
	return m.update(ctx, jobID, func(j *Job, now time.Time) (*Job, error) {
		if !j.State.Terminal() {
			return nil, &TransitionError{JobID: j.ID, From: j.State, To: j.State}
		}
		j.ReceiptID = receiptID
		return j, nil
	})
}

// Expire returns jobs whose leases are due to the queue: a lease past its
// TTL or accept deadline. Only a TTL expiry after accept uses an attempt;
// a job out of attempts ends failed, and one whose cancel was requested
// ends canceled. A running lease that reached the job's max runtime ends
// the job failed (CodeMaxRuntimeExceeded), with no retry. Each expiry
// re-checks its predicate on the job it writes, so a lease extended
// meanwhile survives. Each expiry goes through EndLease (one transaction
// of Config.InTx with its Config.LeaseEnded call). It returns how many
// expired.
func (m *Manager) Expire(ctx context.Context) (int, error) {
	total := 0
	for {
		n, err := m.expire(ctx, expireBatch)
		total += n
		if err != nil || n < expireBatch {
			return total, err
		}
	}
}

func (m *Manager) expire(ctx context.Context, limit int) (int, error) {
	due, err := m.store.ExpiredJobs(ctx, m.now(), limit)
	if err != nil {
		return 0, err
	}
	n := 0
	for _, d := range due {
		written, err := m.EndLease(ctx, d.ID, func(j *Job, now time.Time) (*Job, error) {
			if !j.State.Live() || j.Lease.Epoch != d.Lease.Epoch {
				return nil, nil
			}
			ttl := !now.Before(j.Lease.ExpiresAt)
			acc := j.State == StateLeased && !now.Before(j.Lease.AcceptBy)
			end, running := m.runtimeEnd(j)
			over := running && !now.Before(end)
			if !ttl && !acc && !over {
				return nil, nil
			}
			code, msg := "lease_expired", "the lease expired"
			switch {
			case acc:
				code, msg = "accept_timeout", "the lease was not accepted in time"
			case over && !j.CancelRequested:
				code, msg = CodeMaxRuntimeExceeded, fmt.Sprintf("the job ran for its max runtime of %v", runtimeOf(j, m.cfg.MaxRuntime))
			}
			j.LastError = &JobError{Code: code, Message: msg, Attempt: j.Attempt, At: now}
			if code != CodeMaxRuntimeExceeded {
				m.dropLease(j, now)
				return j, nil
			}
			finish(j, StateFailed, now) // no retry
			j.Lease.ExpiresAt = minTime(j.Lease.ExpiresAt, now)
			return j, nil
		})
		if err != nil && !errors.Is(err, ErrNotFound) {
			return n, err
		}
		if written != nil {
			n++
		}
	}
	return n, nil
}

// EndLease is the one path of a server-side end of a lease (expiry,
// offline, retire, and any other end the Manager makes without the
// worker's request): it reads job id, lets decide end its lease (decide
// returns the job to write, with its LastError saying why, or nil to
// write nothing, as for a lease that moved on meanwhile), writes it
// conditionally on the revision read, retrying as every write does, and
// then calls Config.LeaseEnded with the job as written, the write and
// the hook in one transaction of Config.InTx when it is set. It returns
// the job as written, or nil when decide wrote nothing; an error means
// nothing was written (with InTx). decide may be called more than once.
func (m *Manager) EndLease(ctx context.Context, id string, decide func(j *Job, now time.Time) (*Job, error)) (*Job, error) {
	var written *Job
	run := func(ctx context.Context) error {
		written = nil
		wrote := false
		j, err := m.update(ctx, id, func(j *Job, now time.Time) (*Job, error) {
			next, err := decide(j, now)
			wrote = next != nil && err == nil
			return next, err
		})
		if err != nil || !wrote {
			return err
		}
		if m.cfg.LeaseEnded != nil {
			if err := m.cfg.LeaseEnded(ctx, j); err != nil {
				return err
			}
		}
		written = j
		return nil
	}
	inTx := m.cfg.InTx
	if inTx == nil {
		inTx = func(ctx context.Context, fn func(context.Context) error) error { return fn(ctx) }
	}
	if err := inTx(ctx, run); err != nil {
		return nil, err
	}
	return written, nil
}

// PruneBatch is how many jobs one Store.DeleteEnded of Prune deletes at
// most, and PruneMaxBatches how many batches one Prune runs at most.
const (
	PruneBatch      = 500
	PruneMaxBatches = 20
)

// Prune deletes the jobs that ended (succeeded, failed or canceled) more
// than Config.Retention ago, with their events and artifacts, in batches
// of PruneBatch jobs, each atomic, until a batch comes back short or
// PruneMaxBatches ran: one call deletes at most PruneBatch *
// PruneMaxBatches jobs, and the next call goes on. A live or queued job is
// never deleted, whatever its age, and nothing outside the Store is
// (receipts stay). Without Retention it deletes nothing. It is safe to run
// on every replica at once: each job is deleted once. It returns how many
// jobs it deleted.
func (m *Manager) Prune(ctx context.Context) (int, error) {
	if m.cfg.Retention <= 0 {
		return 0, nil
	}
	before := m.now().Add(-m.cfg.Retention)
	total := 0
	for range PruneMaxBatches {
		n, err := m.store.DeleteEnded(ctx, before, PruneBatch)
		total += n
		if err != nil || n < PruneBatch {
			return total, err
		}
	}
	return total, nil
}

// requeue puts j back in the queue; when the attempt is used, after a
// backoff, or into failed if no attempt is left.
func (m *Manager) requeue(j *Job, now time.Time, used bool) {
	if !used {
		j.State = StateQueued
		j.ScheduledAt = now
		return
	}
	if j.Attempt >= j.MaxAttempts {
		finish(j, StateFailed, now)
		return
	}
	j.State = StateQueued
	j.ScheduledAt = now.Add(m.backoff(j.Attempt))
	j.Attempt++
}

// dropLease ends j's lease at now on the control plane's initiative
// (it expired, its worker went offline, or no longer holds it): a job
// whose cancel was requested ends canceled; any other goes back to the
// queue, using an attempt only if it had been accepted. A lease that ends
// with its job ends now, so its token is lost at once, as any lease that
// ran out (see live).
func (m *Manager) dropLease(j *Job, now time.Time) {
	if j.CancelRequested {
		finish(j, StateCanceled, now)
	} else {
		m.requeue(j, now, j.State == StateRunning)
	}
	if j.State.Terminal() {
		j.Lease.ExpiresAt = minTime(j.Lease.ExpiresAt, now)
	}
}

func finish(j *Job, s State, now time.Time) {
	if j.AcceptedAt != nil && now.Before(*j.AcceptedAt) {
		// A clock moved back (a replica that came into step with the
		// database's) never makes a job end before it started: its
		// receipts' ended_at may not precede started_at.
		now = *j.AcceptedAt
	}
	j.State = s
	j.FinishedAt = &now
}

// backoff is the delay after the given attempt failed: RetryBase doubled
// per earlier attempt, capped at RetryMax, less a random part of up to half.
func (m *Manager) backoff(attempt int) time.Duration {
	d := m.cfg.RetryBase
	for i := 1; i < attempt && d < m.cfg.RetryMax; i++ {
		d *= 2
	}
	d = min(d, m.cfg.RetryMax)
	var b [8]byte
	if _, err := io.ReadFull(m.cfg.Rand, b[:]); err != nil {
		return d // no jitter is still a valid backoff
	}
	half := int64(d / 2)
	if half <= 0 {
		return d
	}
	return (d - time.Duration(binary.BigEndian.Uint64(b[:])%uint64(half))).Truncate(time.Microsecond)
}

// eachLive calls fn with each live job whose lease is worker workerID's,
// in id order, listing them a page at a time.
func (m *Manager) eachLive(ctx context.Context, workerID string, fn func(*Job) error) error {
	for after := ""; ; {
		live, err := m.store.ListJobs(ctx, JobFilter{WorkerID: workerID, After: after, Limit: maxListPage})
		if err != nil {
			return err
		}
		for _, d := range live {
			if err := fn(d); err != nil {
				return err
			}
		}
		if len(live) < maxListPage {
			return nil
		}
		after = live[len(live)-1].ID
	}
}

// Get returns a job.
func (m *Manager) Get(ctx context.Context, id string) (*Job, error) {
	return m.store.GetJob(ctx, id)
}

// List returns a page of jobs matching f in id order (newest first when
// f.Desc), and the cursor of the next page ("" after the last).
func (m *Manager) List(ctx context.Context, f JobFilter) ([]*Job, string, error) {
	if f.State != "" && !f.State.Valid() {
		return nil, "", fmt.Errorf("%w: unknown state %q", ErrInvalidArgument, f.State)
	}
	f.Limit = m.pageSize(f.Limit)
	jobs, err := m.store.ListJobs(ctx, f)
	if err != nil {
		return nil, "", err
	}
	next := ""
	if len(jobs) == f.Limit {
		next = jobs[len(jobs)-1].ID
	}
	return jobs, next, nil
}

func (m *Manager) pageSize(limit int) int {
	if limit <= 0 {
		return m.cfg.ListLimit
	}
	return min(limit, maxListPage)
}

// Worker returns a registered worker.
func (m *Manager) Worker(ctx context.Context, id string) (*Worker, error) {
	return m.store.GetWorker(ctx, id)
}

// WorkerByNode returns the worker registered under a node id.
func (m *Manager) WorkerByNode(ctx context.Context, nodeID string) (*Worker, error) {
	return m.store.WorkerByNode(ctx, nodeID)
}

// Workers returns a page of workers past the cursor f.After, in id order
// (newest first when f.Desc).
func (m *Manager) Workers(ctx context.Context, f WorkerFilter) ([]*Worker, error) {
	f.Limit = m.pageSize(f.Limit)
	return m.store.ListWorkers(ctx, f)
}
