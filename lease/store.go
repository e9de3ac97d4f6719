package lease

import (
	"context"
	"errors"
	"fmt"
	"time"
)

// Errors returned by the Manager and by stores. Callers test them with errors.Is.
var (
	// ErrNotFound means there is no job, worker or artifact with that id.
	ErrNotFound = errors.New("lease: not found")
	// ErrConflict means a store write lost a race (the record changed since it
	// was read) or an id is already taken. The Manager retries or
	// translates it; callers of the Manager rarely see it.
	ErrConflict = errors.New("lease: conflict")
	// ErrLeaseLost means the lease token is not the job's live lease (another
	// epoch, expired, released, another worker's, or the job moved on).
	ErrLeaseLost = errors.New("lease: lease lost")
	// ErrMalformedToken means the lease token does not have the nll_ shape or
	// its checksum is wrong. No store was consulted.
	ErrMalformedToken = errors.New("lease: malformed lease token")
	// ErrInvalidArgument means an argument is out of range or missing.
	ErrInvalidArgument = errors.New("lease: invalid argument")
	// ErrInvalidTransition matches every *TransitionError.
	ErrInvalidTransition = errors.New("lease: invalid transition")
	// ErrAborted means the database aborted the transaction the context
	// carries (a deadlock, a serialization failure); nothing of it is
	// kept, and the whole transaction must be retried, by whoever began
	// it. Without a transaction in the context, it means the store's own
	// transaction kept being aborted through its bounded retries. The
	// Manager never retries it.
	ErrAborted = errors.New("lease: transaction aborted")
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
	// Tags are the worker's effective tags (Worker.EffectiveTags), sorted
	// and without duplicates: a job matches only if every one of its
	// Requirements.Tags is among them (Requirements.TagsMatch). A job
	// without tags matches whatever Tags holds.
	Tags []string
	// MaxActive caps the worker's live leases (leased or running jobs whose
	// lease is the worker's), counting those it already holds.
	MaxActive int
	// Limit caps how many jobs this claim takes; at least 1 (see Store).
	Limit int
	// Now makes only jobs scheduled at or before it eligible.
	Now time.Time
}

// JobFilter selects jobs for Store.ListJobs. Zero fields match everything.
type JobFilter struct {
	State State
	Type  string
	// WorkerID selects live jobs (leased or running) whose lease is this
	// worker's. A job whose lease ended (queued again, or finished) is not
	// selected, although its Lease still names the worker.
	WorkerID string
	// LastWorkerID selects jobs whose last lease, live or ended, is this
	// worker's: the jobs whose Lease names it, in any state (a job queued
	// again after an expired lease still names the worker of that lease).
	LastWorkerID string
	// Tag selects jobs whose Requirements.Tags include this tag, compared
	// as bytes.
	Tag string
	// After is the paging cursor, compared as bytes: an exclusive lower
	// bound on the job id, or with Desc an exclusive upper bound. Empty
	// starts at the first job of the order.
	After string
	// Limit caps the result. Manager.List reads zero or negative as its
	// default page size; a Store is always given at least 1 (see Store).
	Limit int
	// Desc lists in descending id order: newest first, since ids sort by
	// creation time. After then bounds the ids from above.
	Desc bool
}

// ArtifactFilter selects artifacts for Store.ListArtifacts.
type ArtifactFilter struct {
	JobID string
	Type  string
	// After is the paging cursor, compared as bytes: an exclusive lower
	// bound on the artifact id, or with Desc an exclusive upper bound.
	After string
	// Limit caps the result. Manager.Artifacts reads zero or negative as
	// its default page size; a Store is always given at least 1.
	Limit int
	// Desc lists in descending id order, newest first (see JobFilter.Desc).
	Desc bool
}

// WorkerFilter selects workers for Store.ListWorkers.
type WorkerFilter struct {
	// After is the paging cursor, compared as bytes: an exclusive lower
	// bound on the worker id, or with Desc an exclusive upper bound.
	After string
	// Limit caps the result. Manager.Workers reads zero or negative as its
	// default page size; a Store is always given at least 1.
	Limit int
	// Desc lists in descending id order, newest first (see JobFilter.Desc).
	Desc bool
}

// Store keeps jobs, workers, events and artifacts. It makes no decisions:
// the Manager decides every transition and the Store applies it. The
// MemoryStore here and bunstore's LeaseStore implement it; an adapter of
// one's own must pass leasetest.Run, and keep this contract, which the
// suite checks wherever a test can.
//
// Transactions and isolation. Each method is atomic: it stores all of its
// writes or, when it returns an error, none; a method whose context is done
// before it commits returns an error and stores nothing. When the context
// carries a transaction (how is the adapter's business: bunstore uses
// bunstore.WithTx), every method joins it, sees the writes made in it
// before, and leaves commit and rollback to whoever began it. READ
// COMMITTED isolation, or anything stronger, is enough: the Manager never
// relies on a read staying true, only on two guarantees.
//   - UpdateJob is a compare-and-set on the revision: the check and the
//     write are one step (UPDATE ... WHERE id = ? AND rev = ?, with the
//     row count telling whether it wrote), so of two writers of one
//     revision exactly one wins and the other gets ErrConflict. The count
//     is of the rows matched, not changed: MySQL and MariaDB report
//     changed rows unless the connection sets CLIENT_FOUND_ROWS
//     (go-sql-driver/mysql: clientFoundRows=true).
//   - ClaimLeases never gives one job to two claims, and serialises claims
//     by one worker so that MaxActive holds: a SQL store locks the rows it
//     claims and skips rows another claim holds (SELECT ... FOR UPDATE
//     SKIP LOCKED; waiting for them and reading them again is correct
//     too, only slower), and takes a lock per worker before it counts the
//     worker's live leases. It locks only the rows it takes: a claim
//     that locks a page of candidates and takes fewer starves the
//     concurrent claims that skip them.
//
// Ids. Job, worker, node, lease and artifact ids are compared and ordered
// as bytes, as Go compares strings: case-sensitive, with no Unicode
// folding or normalisation, trailing spaces significant, and any UTF-8
// text without NUL is an id ("Job-A" and "job-a" are two jobs, and "JOB" <
// "Job" < "job" < "jöb"). A SQL store gives its id columns, and those of
// job types and tags, a binary collation that does not pad: COLLATE "C" on
// PostgreSQL; VARBINARY, or utf8mb4_0900_bin on MySQL 8 and
// utf8mb4_nopad_bin on MariaDB, on MySQL and MariaDB (never utf8mb4_bin,
// which ignores trailing spaces); SQLite's default, BINARY, already is
// one.
//
// Payloads. Every json.RawMessage (Job.Payload, JobError.Payload,
// Result.Metrics, Event.Payload, Artifact.Metadata, Worker.Metrics) comes
// back byte for byte as it was given: not compacted, re-indented,
// re-escaped, re-ordered or re-numbered. Store it as text or bytes, not in
// a JSON type that re-encodes it (PostgreSQL jsonb, MySQL JSON). Times
// handed to a Store are UTC and truncated to microseconds; a Store gives
// them back exactly.
//
// Limits. Every limit (JobFilter.Limit, ArtifactFilter.Limit,
// ClaimQuery.Limit and the limit arguments) caps how many records a call
// returns or claims, and is at least 1: the Manager always passes one, and
// a Store returns ErrInvalidArgument for a limit <= 0 rather than guess
// whether it means none or all.
//
// Errors and retries. Besides the sentinels each method names, any method
// may return ErrAborted when the database aborted its transaction (a
// deadlock, a serialization failure: SQLSTATE 40P01 or 40001). When the
// context carries no transaction, a Store may retry a method internally, a
// bounded number of times, each time in a new transaction. Inside a
// transaction the context carries it never retries, since that transaction
// is lost and only the caller that began it can run it again: it returns
// ErrAborted. The Manager retries only UpdateJob's ErrConflict, never
// ErrAborted, which it passes up. Once a call has returned ErrAborted,
// nothing more of that transaction commits: every later call with its
// context fails (workerapi.Transactor says why this takes care on MySQL
// and MariaDB).
type Store interface {
	// CreateJobs inserts new jobs, all or none. ErrConflict if an id is
	// taken, or named twice.
	CreateJobs(ctx context.Context, js []*Job) error
	// GetJob returns the job with its current or last lease. ErrNotFound.
	GetJob(ctx context.Context, id string) (*Job, error)
	// ListJobs returns jobs matching f in ascending id order (descending
	// when f.Desc), at most f.Limit. ErrInvalidArgument if f.Limit <= 0.
	ListJobs(ctx context.Context, f JobFilter) ([]*Job, error)
	// UpdateJob replaces the stored job j.ID with j, only if the stored
	// revision is rev (j.Rev holds the new one). ErrConflict if the
	// revision differs, ErrNotFound if there is no such job.
	UpdateJob(ctx context.Context, j *Job, rev int64) error
	// ClaimLeases reads worker workerID (ErrNotFound if there is none)
	// and calls plan with it: plan returns the claim's query and the
	// leases the Manager prepared (see LeaseClaim), or false (or an error)
	// when the worker may claim nothing, and then nothing is claimed
	// (ErrInvalidArgument if q.Limit <= 0). It then atomically picks up to
	// min(q.Limit, len(c.Leases), q.MaxActive - live leases of q.WorkerID)
	// queued jobs that match q, highest priority first, then oldest
	// (created_at, then id as bytes); writes on each what LeaseClaim says,
	// the k-th job getting c.Leases[k]; and returns them as written, in
	// that order. No job is returned by two claims, and two claims by the
	// same worker are serialised so that MaxActive holds. A Store that
	// retries (see above) calls plan again in the new attempt, and writes
	// only the leases of the plan of the attempt that commits.
	ClaimLeases(ctx context.Context, workerID string, plan func(*Worker) (ClaimQuery, LeaseClaim, bool, error)) ([]*Job, error)
	// AcceptLeased makes the guarded accepts ws (see AcceptWrite) and
	// CompleteRunning the guarded completions (see CompleteWrite). Each
	// applies every write whose guard holds and returns, in the order of
	// ws, the job as written, or nil where the guard did not hold (nothing
	// is written for it); when several writes name one job, only the first
	// may apply. An error means nothing was written. A Store may gather
	// the writes of concurrent callers into one statement and one commit.
	AcceptLeased(ctx context.Context, ws []AcceptWrite) ([]*Job, error)
	CompleteRunning(ctx context.Context, ws []CompleteWrite) ([]*Job, error)
	// ExpiredJobs returns up to limit live jobs whose lease expired at or
	// before now, or that are still leased at or after their AcceptBy, in
	// ascending id order. ErrInvalidArgument if limit <= 0.
	ExpiredJobs(ctx context.Context, now time.Time, limit int) ([]*Job, error)
	// DeleteEnded deletes up to limit ended jobs (succeeded, failed or
	// canceled) whose FinishedAt is before before, together with their
	// events and artifacts, and returns how many jobs it deleted. Each
	// job goes with its records or not at all. It never deletes a job that
	// is not ended, nor one that ended at or after before, nor anything
	// outside the lease store (receipts stay). Calls may run at once, on
	// any replica: each job is deleted by one of them, and each counts
	// only its own; a SQL store skips the rows another call holds (FOR
	// UPDATE SKIP LOCKED) rather than wait for them. A SQL store reads the
	// candidates through an index on finished_at, so that a call costs
	// about limit rows however many jobs the table keeps.
	// ErrInvalidArgument if limit <= 0.
	DeleteEnded(ctx context.Context, before time.Time, limit int) (int, error)
	// OfflineJobs returns up to limit live jobs, in ascending id order,
	// whose lease's worker is stored and was last seen at or before
	// cutoff, and whose lease was granted, and accepted if it was
	// (AcceptedAt, else LeasedAt), at or before cutoff.
	// ErrInvalidArgument if limit <= 0.
	OfflineJobs(ctx context.Context, cutoff time.Time, limit int) ([]*Job, error)

	// AddEvents stores events in order and sets their IDs. A log event whose
	// (JobID, Seq) is already stored, or repeats one earlier in evs, is
	// skipped and its ID left zero. It returns how many were stored.
	AddEvents(ctx context.Context, evs []*Event) (int, error)
	// ListEvents returns up to limit of a job's events with ID > after, in
	// ID order. ErrInvalidArgument if limit <= 0.
	ListEvents(ctx context.Context, jobID string, after int64, limit int) ([]*Event, error)

	// AddArtifact stores an artifact. ErrConflict if its id is taken.
	AddArtifact(ctx context.Context, a *Artifact) error
	// GetArtifact returns the artifact with id id, or ErrNotFound.
	GetArtifact(ctx context.Context, id string) (*Artifact, error)
	// ListArtifacts returns artifacts matching f in ascending id order
	// (descending when f.Desc), at most f.Limit. ErrInvalidArgument if
	// f.Limit <= 0.
	ListArtifacts(ctx context.Context, f ArtifactFilter) ([]*Artifact, error)

	// PutWorker inserts or replaces the worker w.ID. ErrConflict if another
	// worker has the same NodeID. Replacing a stored worker keeps its
	// stored Approval, whatever w.Approval holds: only SetApproval changes
	// it, so a write of a record read before an approval cannot undo it.
	PutWorker(ctx context.Context, w *Worker) error
	// SetApproval replaces the Approval of the stored worker id, and
	// nothing else of it, provided the stored Approval's At is still
	// prevAt (both nil, or the same instant): ErrConflict otherwise, so
	// that of two concurrent approvals the second sees the first.
	// ErrNotFound if there is no such worker.
	SetApproval(ctx context.Context, id string, prevAt *time.Time, a Approval) error
	// GetWorker returns a worker by id. ErrNotFound.
	GetWorker(ctx context.Context, id string) (*Worker, error)
	// WorkerByNode returns the worker registered under nodeID. ErrNotFound.
	WorkerByNode(ctx context.Context, nodeID string) (*Worker, error)
	// ListWorkers returns up to f.Limit workers past the cursor f.After in
	// ascending id order (descending when f.Desc). ErrInvalidArgument if
	// f.Limit <= 0.
	ListWorkers(ctx context.Context, f WorkerFilter) ([]*Worker, error)

	// PutAnswer stores a. ErrConflict if an answer under a.Key is stored
	// that expires after a.CreatedAt; one that expired at or before it is
	// replaced.
	PutAnswer(ctx context.Context, a *Answer) error
	// GetAnswer returns the answer stored under key, unless it expires at
	// or before now. ErrNotFound.
	GetAnswer(ctx context.Context, key []byte, now time.Time) (*Answer, error)
	// DeleteAnswers deletes up to limit answers that expire at or before
	// now and returns how many it deleted. ErrInvalidArgument if limit <= 0.
	DeleteAnswers(ctx context.Context, now time.Time, limit int) (int, error)
}
