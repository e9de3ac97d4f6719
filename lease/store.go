package lease

import (
	"context"
	"errors"
	"fmt"
	"time"
)

// Errors returned by the Manager and by stores. Callers test them with errors.Is.
var (
	// ErrNotFound: no job, worker or artifact with that id.
	ErrNotFound = errors.New("lease: not found")
	// ErrConflict: a store write lost a race (the record changed since it
	// was read) or an id is already taken. The Manager retries or
	// translates it; callers of the Manager rarely see it.
	ErrConflict = errors.New("lease: conflict")
	// ErrLeaseLost: the lease token is not the job's live lease (another
	// epoch, expired, released, another worker's, or the job moved on).
	ErrLeaseLost = errors.New("lease: lease lost")
	// ErrMalformedToken: the lease token does not have the nll_ shape or
	// its checksum is wrong. No store was consulted.
	ErrMalformedToken = errors.New("lease: malformed lease token")
	// ErrInvalidArgument: an argument is out of range or missing.
	ErrInvalidArgument = errors.New("lease: invalid argument")
	// ErrInvalidTransition matches every *TransitionError.
	ErrInvalidTransition = errors.New("lease: invalid transition")
)

// TransitionError reports a state change the state machine forbids, such
// as completing a job that was never accepted.
type TransitionError struct {
	JobID string
	From  State
	To    State
}

func (e *TransitionError) Error() string {
	return fmt.Sprintf("lease: job %s cannot go from %s to %s", e.JobID, e.From, e.To)
}

// Is makes errors.Is(err, ErrInvalidTransition) hold for every TransitionError.
func (e *TransitionError) Is(target error) bool { return target == ErrInvalidTransition }

// Fit is one shape of job a worker can take: a job fits when its GPU SKU
// equals SKU ("" for jobs without one), it needs at most GPUs GPUs, and
// at most VRAMMB of VRAM on each.
type Fit struct {
	SKU    string
	GPUs   int
	VRAMMB int
}

// ClaimQuery selects the queued jobs one worker may lease.
type ClaimQuery struct {
	WorkerID string
	// Types are the job types to consider; empty matches nothing.
	Types []string
	// Fits are the job shapes the worker can take; a job must match one.
	Fits []Fit
	// MaxActive caps the worker's live leases (leased or running jobs whose
	// lease is the worker's), counting those it already holds.
	MaxActive int
	// Limit caps how many jobs this claim takes.
	Limit int
	// Now: only jobs scheduled at or before Now are eligible.
	Now time.Time
}

// JobFilter selects jobs for Store.ListJobs. Zero fields match everything.
type JobFilter struct {
	State State
	Type  string
	// WorkerID selects live jobs whose lease is this worker's.
	WorkerID string
	// After is an exclusive lower bound on the job id (the paging cursor).
	After string
	// Limit caps the result; zero or negative means the Manager's default.
	Limit int
}

// ArtifactFilter selects artifacts for Store.ListArtifacts.
type ArtifactFilter struct {
	JobID string
	Type  string
	After string
	Limit int
}

// Store keeps jobs, workers, events and artifacts. It makes no decisions:
// the Manager decides every transition and the Store applies it
// atomically. Every method takes the context first and, when the store
// supports transactions, joins the one the context carries.
//
// Times handed to a Store are UTC and truncated to microseconds; a Store
// must give them back exactly.
type Store interface {
	// CreateJob inserts a new job. ErrConflict if its id is taken.
	CreateJob(ctx context.Context, j *Job) error
	// GetJob returns the job with its current or last lease. ErrNotFound.
	GetJob(ctx context.Context, id string) (*Job, error)
	// ListJobs returns jobs matching f in ascending id order, at most f.Limit.
	ListJobs(ctx context.Context, f JobFilter) ([]*Job, error)
	// UpdateJob replaces the stored job j.ID with j, only if the stored
	// revision is rev (j.Rev holds the new one). ErrConflict if the
	// revision differs, ErrNotFound if there is no such job.
	UpdateJob(ctx context.Context, j *Job, rev int64) error
	// ClaimJobs atomically picks up to min(q.Limit, q.MaxActive - live
	// leases of q.WorkerID) queued jobs that match q, highest priority
	// first, then oldest (created_at, then id); calls grant on each, which
	// turns it into a leased job with a new revision; stores them and
	// returns them in that order. No job is returned by two claims, and two
	// claims by the same worker are serialised so that MaxActive holds.
	ClaimJobs(ctx context.Context, q ClaimQuery, grant func(*Job)) ([]*Job, error)
	// ExpiredJobs returns up to limit live jobs whose lease expired at or
	// before now, or that are still leased at or after their AcceptBy.
	ExpiredJobs(ctx context.Context, now time.Time, limit int) ([]*Job, error)

	// AddEvents stores events in order and sets their IDs. A log event whose
	// (JobID, Seq) is already stored, or repeats one earlier in evs, is
	// skipped and its ID left zero. It returns how many were stored.
	AddEvents(ctx context.Context, evs []*Event) (int, error)
	// ListEvents returns a job's events with ID > after, in ID order.
	ListEvents(ctx context.Context, jobID string, after int64, limit int) ([]*Event, error)

	// AddArtifact stores an artifact. ErrConflict if its id is taken.
	AddArtifact(ctx context.Context, a *Artifact) error
	// ListArtifacts returns artifacts matching f in ascending id order.
	ListArtifacts(ctx context.Context, f ArtifactFilter) ([]*Artifact, error)

	// PutWorker inserts or replaces the worker w.ID. ErrConflict if another
	// worker has the same NodeID.
	PutWorker(ctx context.Context, w *Worker) error
	// GetWorker returns a worker by id. ErrNotFound.
	GetWorker(ctx context.Context, id string) (*Worker, error)
	// WorkerByNode returns the worker registered under nodeID. ErrNotFound.
	WorkerByNode(ctx context.Context, nodeID string) (*Worker, error)
	// ListWorkers returns workers with id > after in ascending id order.
	ListWorkers(ctx context.Context, after string, limit int) ([]*Worker, error)
}
