package lease

import (
	"cmp"
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"slices"
	"strings"
	"sync"
	"time"
)

// MemoryStore is a Store in memory, for tests and single-process use.
// Every method runs under one mutex, so each is atomic. A write whose
// context is done stores nothing and returns the context's error, as a
// database's would.
type MemoryStore struct {
	mu        sync.Mutex
	jobs      map[string]*Job
	workers   map[string]*Worker
	events    []*Event
	lastEvent int64 // the last Event.ID given out
	logSeqs   map[jobSeq]bool
	artifacts map[string]*Artifact
	answers   map[string]*Answer
}

type jobSeq struct {
	job string
	seq int64
}

var _ Store = (*MemoryStore)(nil)
var _ HeartbeatStore = (*MemoryStore)(nil)

// NewMemoryStore returns an empty MemoryStore.
func NewMemoryStore() *MemoryStore {
	return &MemoryStore{
		jobs:      make(map[string]*Job),
		workers:   make(map[string]*Worker),
		logSeqs:   make(map[jobSeq]bool),
		artifacts: make(map[string]*Artifact),
		answers:   make(map[string]*Answer),
	}
}

// CreateJobs implements Store.
func (s *MemoryStore) CreateJobs(ctx context.Context, js []*Job) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := ctx.Err(); err != nil {
		return err
	}
	for i, j := range js {
		if _, ok := s.jobs[j.ID]; ok || slices.ContainsFunc(js[:i], func(o *Job) bool { return o.ID == j.ID }) {
			return ErrConflict
		}
	}
	for _, j := range js {
		s.jobs[j.ID] = cloneJob(j)
	}
	return nil
}

// GetJob implements Store.
func (s *MemoryStore) GetJob(_ context.Context, id string) (*Job, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	j, ok := s.jobs[id]
	if !ok {
		return nil, ErrNotFound
	}
	return cloneJob(j), nil
}

// ListJobs implements Store.
func (s *MemoryStore) ListJobs(_ context.Context, f JobFilter) ([]*Job, error) {
	return pageOrder(s, f.Limit, f.Desc, s.jobs, cloneJob, func(j *Job) bool {
		return (f.State == "" || j.State == f.State) && (f.Type == "" || j.Type == f.Type) && pastCursor(j.ID, f.After, f.Desc) &&
			(f.WorkerID == "" || j.State.Live() && j.Lease.WorkerID == f.WorkerID) &&
			(f.LastWorkerID == "" || j.Lease != nil && j.Lease.WorkerID == f.LastWorkerID) &&
			(f.Tag == "" || slices.Contains(j.Requirements.Tags, f.Tag))
	})
}

// pastCursor says whether id comes after the paging cursor after in the
// order (ascending, or descending when desc); an empty cursor is before
// every id.
func pastCursor(id, after string, desc bool) bool {
	if desc {
		return after == "" || id < after
	}
	return id > after
}

// page returns clones of the values of m that keep reports true for, in
// key (id) order, at most limit of them, under s's lock.
func page[T any](s *MemoryStore, limit int, m map[string]*T, clone func(*T) *T, keep func(*T) bool) ([]*T, error) {
	return pageOrder(s, limit, false, m, clone, keep)
}

// pageOrder is page in descending key order when desc.
func pageOrder[T any](s *MemoryStore, limit int, desc bool, m map[string]*T, clone func(*T) *T, keep func(*T) bool) ([]*T, error) {
	if limit <= 0 {
		return nil, errLimit(limit)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	var ids []string
	for id, v := range m {
		if keep(v) {
			ids = append(ids, id)
		}
	}
	slices.Sort(ids)
	if desc {
		slices.Reverse(ids)
	}
	var out []*T
	for _, id := range ids[:min(limit, len(ids))] {
		out = append(out, clone(m[id]))
	}
	return out, nil
}

// UpdateJob implements Store.
func (s *MemoryStore) UpdateJob(ctx context.Context, j *Job, rev int64) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := ctx.Err(); err != nil {
		return err
	}
	cur, ok := s.jobs[j.ID]
	if !ok {
		return ErrNotFound
	}
	if cur.Rev != rev {
		return ErrConflict
	}
	s.jobs[j.ID] = cloneJob(j)
	return nil
}

// ClaimLeases implements Store. It calls plan under its lock.
func (s *MemoryStore) ClaimLeases(ctx context.Context, workerID string, plan func(*Worker) (ClaimQuery, LeaseClaim, bool, error)) ([]*Job, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	w, ok := s.workers[workerID]
	if !ok {
		return nil, fmt.Errorf("worker %s: %w", workerID, ErrNotFound)
	}
	q, c, ok, err := plan(cloneWorker(w))
	if err != nil || !ok {
		return nil, err
	}
	if q.Limit <= 0 {
		return nil, errLimit(q.Limit)
	}
	active := 0
	var cands []*Job
	for _, j := range s.jobs {
		if j.State.Live() && j.Lease.WorkerID == q.WorkerID {
			active++
		}
		if j.State == StateQueued && !j.ScheduledAt.After(q.Now) && slices.Contains(q.Types, j.Type) && j.Requirements.Matches(q.Fits) && j.Requirements.TagsMatch(q.Tags) {
			cands = append(cands, j)
		}
	}
	slices.SortFunc(cands, claimOrder)
	cands = cands[:max(0, min(q.Limit, len(c.Leases), q.MaxActive-active, len(cands)))]
	out := make([]*Job, len(cands))
	for k, j := range cands {
		out[k] = cloneJob(j)
		c.grant(out[k], k, q.Now)
	}
	// Nothing is stored until every grant is made, so that a claim whose
	// context ended meanwhile, like a rolled-back transaction, leaves no trace.
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	for _, j := range out {
		s.jobs[j.ID] = cloneJob(j)
	}
	return out, nil
}

// AcceptLeased implements Store.
func (s *MemoryStore) AcceptLeased(ctx context.Context, ws []AcceptWrite) ([]*Job, error) {
	return guarded(ctx, s, ws, func(w AcceptWrite, j *Job) bool {
		if !w.holds(j, StateLeased, w.MaxRuntime) {
			return false
		}
		now := w.Now
		j.State, j.AcceptedAt = StateRunning, &now
		if !j.CancelRequested {
			j.Lease.ExpiresAt = now.Add(min(w.TTL, runtimeOf(j, w.MaxRuntime)))
		}
		return true
	})
}

// CompleteRunning implements Store.
func (s *MemoryStore) CompleteRunning(ctx context.Context, ws []CompleteWrite) ([]*Job, error) {
	return guarded(ctx, s, ws, func(w CompleteWrite, j *Job) bool {
		if !w.holds(j, StateRunning, w.MaxRuntime) || j.CancelRequested {
			return false
		}
		finish(j, StateSucceeded, w.Now)
		if w.Result.ReceiptID != "" {
			j.ReceiptID = w.Result.ReceiptID
		}
		r := w.Result
		r.ReceiptID, r.Metrics = "", slices.Clone(r.Metrics)
		j.Result = &r
		return true
	})
}

// guarded applies each write of ws whose guard holds (write reports
// whether it did, after changing the job it is given) under s's lock,
// all or none, and returns the jobs written.
func guarded[W interface{ job() string }](ctx context.Context, s *MemoryStore, ws []W, write func(W, *Job) bool) ([]*Job, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	out := make([]*Job, len(ws))
	for i, w := range ws {
		j, ok := s.jobs[w.job()]
		if !ok {
			continue
		}
		if j = cloneJob(j); write(w, j) {
			j.Rev++
			s.jobs[j.ID], out[i] = j, cloneJob(j)
		}
	}
	return out, nil
}

// claimOrder orders jobs by priority, highest first, then oldest first.
func claimOrder(a, b *Job) int {
	return cmp.Or(cmp.Compare(b.Priority, a.Priority), a.CreatedAt.Compare(b.CreatedAt), strings.Compare(a.ID, b.ID))
}

// ExpiredJobs implements Store.
func (s *MemoryStore) ExpiredJobs(_ context.Context, now time.Time, limit int) ([]*Job, error) {
	return page(s, limit, s.jobs, cloneJob, func(j *Job) bool {
		return j.State.Live() && (!now.Before(j.Lease.ExpiresAt) || j.State == StateLeased && !now.Before(j.Lease.AcceptBy))
	})
}

// DeleteEnded implements Store. It deletes the oldest ended jobs first.
func (s *MemoryStore) DeleteEnded(ctx context.Context, before time.Time, limit int) (int, error) {
	if limit <= 0 {
		return 0, errLimit(limit)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := ctx.Err(); err != nil {
		return 0, err
	}
	var ended []*Job
	for _, j := range s.jobs {
		if j.State.Terminal() && j.FinishedAt != nil && j.FinishedAt.Before(before) {
			ended = append(ended, j)
		}
	}
	slices.SortFunc(ended, func(a, b *Job) int {
		return cmp.Or(a.FinishedAt.Compare(*b.FinishedAt), strings.Compare(a.ID, b.ID))
	})
	ended = ended[:min(limit, len(ended))]
	gone := make(map[string]bool, len(ended))
	for _, j := range ended {
		gone[j.ID] = true
		delete(s.jobs, j.ID)
	}
	s.events = slices.DeleteFunc(s.events, func(e *Event) bool {
		if gone[e.JobID] && e.Kind == EventLog {
			delete(s.logSeqs, jobSeq{e.JobID, e.Seq})
		}
		return gone[e.JobID]
	})
	maps.DeleteFunc(s.artifacts, func(_ string, a *Artifact) bool { return gone[a.JobID] })
	return len(ended), nil
}

// OfflineJobs implements Store.
func (s *MemoryStore) OfflineJobs(_ context.Context, cutoff time.Time, limit int) ([]*Job, error) {
	return page(s, limit, s.jobs, cloneJob, func(j *Job) bool {
		if !j.State.Live() || j.Lease == nil || !seenBefore(j, cutoff) {
			return false
		}
		w, ok := s.workers[j.Lease.WorkerID]
		return ok && !w.LastSeenAt.After(cutoff)
	})
}

// AddEvents implements Store.
func (s *MemoryStore) AddEvents(ctx context.Context, evs []*Event) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := ctx.Err(); err != nil {
		return 0, err
	}
	n := 0
	for _, e := range evs {
		if e.Kind == EventLog {
			k := jobSeq{e.JobID, e.Seq}
			if s.logSeqs[k] {
				continue
			}
			s.logSeqs[k] = true
		}
		s.lastEvent++
		e.ID = s.lastEvent
		c := *e
		c.Payload = slices.Clone(e.Payload)
		s.events = append(s.events, &c)
		n++
	}
	return n, nil
}

// ListEvents implements Store.
func (s *MemoryStore) ListEvents(_ context.Context, jobID string, after int64, limit int) ([]*Event, error) {
	if limit <= 0 {
		return nil, errLimit(limit)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []*Event
	for _, e := range s.events {
		if e.JobID == jobID && e.ID > after {
			c := *e
			c.Payload = slices.Clone(e.Payload)
			out = append(out, &c)
			if len(out) == limit {
				break
			}
		}
	}
	return out, nil
}

// AddArtifact implements Store.
func (s *MemoryStore) AddArtifact(ctx context.Context, a *Artifact) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := ctx.Err(); err != nil {
		return err
	}
	if _, ok := s.artifacts[a.ID]; ok {
		return ErrConflict
	}
	s.artifacts[a.ID] = cloneArtifact(a)
	return nil
}

// GetArtifact implements Store.
func (s *MemoryStore) GetArtifact(ctx context.Context, id string) (*Artifact, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	a, ok := s.artifacts[id]
	if !ok {
		return nil, ErrNotFound
	}
	return cloneArtifact(a), nil
}

// ListArtifacts implements Store.
func (s *MemoryStore) ListArtifacts(_ context.Context, f ArtifactFilter) ([]*Artifact, error) {
	return pageOrder(s, f.Limit, f.Desc, s.artifacts, cloneArtifact, func(a *Artifact) bool {
		return (f.JobID == "" || a.JobID == f.JobID) && (f.Type == "" || a.Type == f.Type) && pastCursor(a.ID, f.After, f.Desc)
	})
}

// PutWorker implements Store.
func (s *MemoryStore) PutWorker(ctx context.Context, w *Worker) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := ctx.Err(); err != nil {
		return err
	}
	for _, o := range s.workers {
		if o.NodeID == w.NodeID && o.ID != w.ID {
			return ErrConflict
		}
	}
	c := cloneWorker(w)
	if old, ok := s.workers[w.ID]; ok {
		c.Approval = cloneApproval(old.Approval)
		c.Drain = old.Drain
	}
	s.workers[w.ID] = c
	return nil
}

// Heartbeat implements HeartbeatStore.
func (s *MemoryStore) Heartbeat(ctx context.Context, id, status string, metrics json.RawMessage, at time.Time) (*Worker, error) {
	var out *Worker
	err := s.writeWorker(ctx, id, func(w *Worker) error {
		w.LastSeenAt = at
		if status != "" && w.Status != StatusRetired {
			w.Status = status
		}
		if metrics != nil {
			w.Metrics = slices.Clone(metrics)
		}
		out = cloneWorker(w)
		return nil
	})
	return out, err
}

// SetDrain implements DrainStore.
func (s *MemoryStore) SetDrain(ctx context.Context, id string, d *DrainRequest) error {
	return s.writeWorker(ctx, id, func(w *Worker) error {
		w.Drain = clonePtr(d)
		return nil
	})
}

// SetApproval implements Store.
func (s *MemoryStore) SetApproval(ctx context.Context, id string, prevAt *time.Time, a Approval) error {
	return s.writeWorker(ctx, id, func(w *Worker) error {
		if at := w.Approval.At; (at == nil) != (prevAt == nil) || at != nil && !at.Equal(*prevAt) {
			return ErrConflict
		}
		w.Approval = cloneApproval(a)
		return nil
	})
}

// writeWorker calls write on the stored worker id under s's lock, unless
// ctx is done. ErrNotFound.
func (s *MemoryStore) writeWorker(ctx context.Context, id string, write func(*Worker) error) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := ctx.Err(); err != nil {
		return err
	}
	w, ok := s.workers[id]
	if !ok {
		return ErrNotFound
	}
	return write(w)
}

// GetWorker implements Store.
func (s *MemoryStore) GetWorker(_ context.Context, id string) (*Worker, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	w, ok := s.workers[id]
	if !ok {
		return nil, ErrNotFound
	}
	return cloneWorker(w), nil
}

// WorkerByNode implements Store.
func (s *MemoryStore) WorkerByNode(_ context.Context, nodeID string) (*Worker, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, w := range s.workers {
		if w.NodeID == nodeID {
			return cloneWorker(w), nil
		}
	}
	return nil, ErrNotFound
}

// ListWorkers implements Store.
func (s *MemoryStore) ListWorkers(_ context.Context, f WorkerFilter) ([]*Worker, error) {
	return pageOrder(s, f.Limit, f.Desc, s.workers, cloneWorker, func(w *Worker) bool { return pastCursor(w.ID, f.After, f.Desc) })
}

func errLimit(limit int) error {
	return fmt.Errorf("%w: limit %d, want at least 1", ErrInvalidArgument, limit)
}

func cloneJob(j *Job) *Job {
	c := *j
	c.Payload = slices.Clone(j.Payload)
	c.Requirements.Tags = slices.Clone(j.Requirements.Tags)
	c.LeasedAt, c.AcceptedAt, c.FinishedAt = clonePtr(j.LeasedAt), clonePtr(j.AcceptedAt), clonePtr(j.FinishedAt)
	if j.LastError != nil {
		e := *j.LastError
		e.Payload = slices.Clone(e.Payload)
		c.LastError = &e
	}
	if j.Result != nil {
		r := *j.Result
		r.Metrics = slices.Clone(r.Metrics)
		c.Result = &r
	}
	if j.Lease != nil {
		l := *j.Lease
		l.TokenHash = slices.Clone(l.TokenHash)
		c.Lease = &l
	}
	return &c
}

func cloneArtifact(a *Artifact) *Artifact {
	c := *a
	c.Metadata = slices.Clone(a.Metadata)
	return &c
}

// clonePtr returns a shallow copy of *p, nil for nil.
func clonePtr[T any](p *T) *T {
	if p == nil {
		return nil
	}
	c := *p
	return &c
}

func cloneWorker(w *Worker) *Worker {
	c := *w
	c.Tags = slices.Clone(w.Tags)
	c.Capabilities.GPUs = slices.Clone(w.Capabilities.GPUs)
	c.Capabilities.JobTypes = slices.Clone(w.Capabilities.JobTypes)
	c.Metrics = slices.Clone(w.Metrics)
	c.Approval = cloneApproval(w.Approval)
	c.Drain = clonePtr(w.Drain)
	return &c
}

func cloneApproval(a Approval) Approval {
	a.At = clonePtr(a.At)
	a.JobTypes = slices.Clone(a.JobTypes)
	a.Tags = slices.Clone(a.Tags)
	return a
}
