package wire

import (
	"encoding/json"
	"time"

	"github.com/nodelane/nodelane/receipts"
)

// The bodies and answers of the worker routes.

// GPU is one GPU of a worker.
type GPU struct {
	SKU    string `json:"sku"`
	VRAMMB int    `json:"vram_mb"`
}

// Capabilities are what a worker can run.
type Capabilities struct {
	GPUs     []GPU    `json:"gpus"`
	JobTypes []string `json:"job_types"`
}

// GovernorLimits limit how much of a worker the control plane may use.
type GovernorLimits struct {
	MaxJobs   int `json:"max_jobs"`
	MaxVRAMMB int `json:"max_vram_mb"`
}

// RegisterRequest is the body of POST /workers/register.
type RegisterRequest struct {
	NodeID                   string         `json:"node_id"`
	Name                     string         `json:"name"`
	Hostname                 string         `json:"hostname"`
	EndpointURL              *string        `json:"endpoint_url"`
	Role                     string         `json:"role"`
	Capabilities             Capabilities   `json:"capabilities"`
	GovernorLimits           GovernorLimits `json:"governor_limits"`
	Tags                     []string       `json:"tags"`
	Version                  string         `json:"version"`
	HeartbeatIntervalSeconds int            `json:"heartbeat_interval_seconds"`
	// PublicKey is the node's Ed25519 public key, the 32 raw bytes in
	// unpadded base64url. The request is signed with its private key.
	PublicKey string `json:"public_key"`
	// CurrentJobs, when present (even []), are the jobs the node holds:
	// every live lease the server thinks it holds on a job not listed is
	// ended at once (the job requeued, last_error.code
	// CodeWorkerRestarted) and named in the answer's ended_jobs. Absent
	// (nil) reconciles nothing. At most MaxCurrentJobs ids.
	CurrentJobs *[]string `json:"current_jobs,omitempty"`
}

// RegisterResponse answers a registration.
type RegisterResponse struct {
	WorkerID    string `json:"worker_id"`
	WorkerToken string `json:"worker_token"`
	// Status is "registered", or RegisterStatusPending for a node that
	// awaits an operator's approval (it is granted no job until then).
	Status               string    `json:"status"`
	PolicyVersion        int64     `json:"policy_version"`
	PollIntervalSeconds  int       `json:"poll_interval_seconds"`
	NextHeartbeatSeconds int       `json:"next_heartbeat_seconds"`
	ServerTime           time.Time `json:"server_time"`
	TokenExpiresAt       time.Time `json:"token_expires_at"`
	// EndedJobs are the jobs whose leases current_jobs ended; [] when
	// none (or current_jobs was absent).
	EndedJobs []string `json:"ended_jobs"`
	// PendingJobTypes and PendingTags are the registered job types and
	// tags that await an operator's approval (all of them while Status is
	// pending; afterwards a widening since the approval), [] when none.
	PendingJobTypes []string `json:"pending_job_types"`
	PendingTags     []string `json:"pending_tags"`
}

// The last_error codes of a job whose lease reconciliation ended.
const (
	// CodeWorkerRestarted means the worker started or registered again without
	// the job in current_jobs.
	CodeWorkerRestarted = "worker_restarted"
	// CodeNotHeld means a heartbeat's current_jobs did not list the job,
	// although it was granted at or before the heartbeat's leases_through.
	CodeNotHeld = "not_held"
)

// StartRequest is the body of POST /workers/start: what a worker that
// already has a token sends each time it starts. Its fields are those of
// RegisterRequest (under the same limits) and replace what the server
// recorded; CurrentJobs is required (a process that just started holds
// nothing: []), and reconciles as a registration's does.
type StartRequest struct {
	Name           string         `json:"name"`
	Hostname       string         `json:"hostname"`
	Role           string         `json:"role"`
	Version        string         `json:"version"`
	Capabilities   Capabilities   `json:"capabilities"`
	GovernorLimits GovernorLimits `json:"governor_limits"`
	Tags           []string       `json:"tags"`
	CurrentJobs    *[]string      `json:"current_jobs"`
}

// StartResponse answers POST /workers/start.
type StartResponse struct {
	WorkerID string `json:"worker_id"`
	// Status is "registered", or RegisterStatusPending while the node
	// awaits an operator's approval.
	Status string `json:"status"`
	// Changed reports that the job types, tags, GPUs or governor limits
	// differ from what the server had; ReceiptID is then the
	// worker_updated receipt that records them, old and new (null when
	// nothing changed).
	Changed   bool    `json:"changed"`
	ReceiptID *string `json:"receipt_id"`
	// PendingJobTypes and PendingTags await an operator's approval, as in
	// RegisterResponse; [] when none.
	PendingJobTypes []string `json:"pending_job_types"`
	PendingTags     []string `json:"pending_tags"`
	// EndedJobs are the jobs whose leases current_jobs ended; [] when none.
	EndedJobs            []string  `json:"ended_jobs"`
	PolicyVersion        int64     `json:"policy_version"`
	ServerTime           time.Time `json:"server_time"`
	NextHeartbeatSeconds int       `json:"next_heartbeat_seconds"`
	HeartbeatDeadline    time.Time `json:"heartbeat_deadline"`
}

// HeartbeatRequest is the body of POST /workers/heartbeat.
type HeartbeatRequest struct {
	// Status is idle, busy or draining.
	Status       string          `json:"status"`
	Capabilities *Capabilities   `json:"capabilities"`
	CurrentJobs  []string        `json:"current_jobs"`
	Metrics      json.RawMessage `json:"metrics"`
	// LeasesThrough, when present, is the server_time of the newest lease
	// answer (or register or start answer) the worker processed: every
	// live lease of the worker on a job not in CurrentJobs that was
	// granted at or before it is ended (last_error.code CodeNotHeld) and
	// named in the answer's ended_jobs. A lease granted later is kept: the
	// worker may not have heard of it yet. Absent reconciles nothing.
	LeasesThrough *time.Time `json:"leases_through,omitempty"`
}

// LeaseExpiry is a live lease's deadline.
type LeaseExpiry struct {
	JobID     string    `json:"job_id"`
	ExpiresAt time.Time `json:"expires_at"`
}

// HeartbeatResponse answers a heartbeat.
type HeartbeatResponse struct {
	OK                   bool      `json:"ok"`
	WorkerID             string    `json:"worker_id"`
	ServerTime           time.Time `json:"server_time"`
	NextHeartbeatSeconds int       `json:"next_heartbeat_seconds"`
	// HeartbeatDeadline is when the worker goes offline unless another
	// heartbeat arrives first: this heartbeat's time plus the control
	// plane's offline_after. Then its live leases end (their jobs go back
	// to the queue, worker_offline) and their tokens get 409 lease_lost;
	// a worker stops every job it could not heartbeat for by then. Zero
	// from a server older than the field.
	HeartbeatDeadline time.Time     `json:"heartbeat_deadline"`
	PolicyVersion     int64         `json:"policy_version"`
	Leases            []LeaseExpiry `json:"leases"`
	LostJobs          []string      `json:"lost_jobs"`
	CancelJobs        []string      `json:"cancel_jobs"`
	// EndedJobs are the jobs whose leases leases_through ended; [] when
	// none.
	EndedJobs []string `json:"ended_jobs"`
	// Drain reports that an operator asked the worker to drain (POST
	// /operator/workers/{id}/drain): it is granted no job until the
	// request is withdrawn (resume), and should finish what it runs and
	// lease nothing. False from a server older than the field.
	Drain bool `json:"drain"`
}

// SignalsRequest is the body of POST /workers/signals, the control
// long-poll a worker keeps open so that signals reach it in seconds.
type SignalsRequest struct {
	// WaitSeconds is how long to wait for a signal, 0 to
	// MaxSignalsWaitSeconds; omitted means 0 (answer at once).
	WaitSeconds *int `json:"wait_seconds"`
	// CurrentJobs are the jobs the worker holds (at most MaxCurrentJobs
	// ids): the ones whose cancel or loss it is told of.
	CurrentJobs []string `json:"current_jobs"`
	// KnownCancels are the jobs whose cancel the worker already knows of
	// (at most MaxCurrentJobs ids): their cancel does not end the wait.
	KnownCancels []string `json:"known_cancels"`
	// Draining is whether the worker already knows of the operator's
	// drain request: a request that differs ends the wait.
	Draining bool `json:"draining"`
}

// SignalsResponse answers a signals request: at once when a signal is
// due, as soon as one arrives during the wait, or at its end.
type SignalsResponse struct {
	// CancelJobs are the jobs of current_jobs whose cancel was requested
	// (known_cancels included): stop them, and report their end.
	CancelJobs []string `json:"cancel_jobs"`
	// LostJobs are the jobs of current_jobs the worker no longer holds:
	// stop them, and report nothing of them.
	LostJobs []string `json:"lost_jobs"`
	// Drain reports whether an operator asked the worker to drain.
	Drain      bool      `json:"drain"`
	ServerTime time.Time `json:"server_time"`
}

// LeaseRequest is the body of POST /workers/jobs/lease.
type LeaseRequest struct {
	SupportedJobTypes []string `json:"supported_job_types"`
	SupportedGPUSKUs  []string `json:"supported_gpu_skus"`
	// MaxJobs is how many jobs to lease at most, 1 to 32; omitted (zero)
	// means 1. An explicit 0 is refused.
	MaxJobs int `json:"max_jobs,omitempty"`
	// WaitSeconds long-polls up to this many seconds, 0 to
	// MaxWaitSeconds, for a job; omitted (zero) means no wait. Outside
	// that range the request is refused (400 invalid_request); a host may
	// end the wait sooner (workerapi.Config.MaxWait).
	WaitSeconds int `json:"wait_seconds,omitempty"`
	// Accept, when true, accepts every job granted in the same request,
	// saving an accept call per job: such a grant's job.state is
	// JobStateRunning and its expires_at the accepted lease's expiry.
	// The lease and the accept are one transition, under one reading of
	// the envelope. A server older than this field ignores it (and one
	// of issue 27 could grant a job leased with it), so a client checks
	// each grant's job.state and accepts the leased ones. Omitted (false) leases
	// without accepting.
	Accept bool `json:"accept,omitempty"`
	// RequestID, when set, makes the lease repeatable: a repeat with the
	// same request_id and body, until the accept_by of its grants, gets
	// the first answer, the same grants and lease tokens, rather than
	// new ones (PROTOCOL.md "Retries"). MinIdempotencyKeyBytes to
	// MaxIdempotencyKeyBytes of [A-Za-z0-9._~-]; make it random.
	RequestID string `json:"request_id,omitempty"`
}

// The job states a worker acts on (Job.State); PROTOCOL.md lists them
// all.
const (
	JobStateLeased    = "leased"
	JobStateRunning   = "running"
	JobStateSucceeded = "succeeded"
)

// Requirements constrain which workers may lease a job (GPUs and tags),
// and how long it may run.
type Requirements struct {
	GPUSKU    string `json:"gpu_sku"`
	GPUCount  int    `json:"gpu_count"`
	MinVRAMMB int    `json:"min_vram_mb"`
	// MaxRuntimeSeconds bounds one lease's run, from accept: the lease is
	// revoked when it is reached and the job ends failed, its last_error
	// CodeMaxRuntimeExceeded. 0 (or absent at dispatch) means the control
	// plane's default (24 h unless configured); at most MaxRuntimeSeconds.
	MaxRuntimeSeconds int `json:"max_runtime_seconds"`
	// Tags restrict the job to a pool: only a worker that has every one
	// of them among its registered tags (and, when its operator's
	// approval pins tags, among those pinned) may lease it. At dispatch
	// at most MaxTags, each 1 to MaxTagBytes bytes of UTF-8 without
	// whitespace or control characters; absent, null or [] means none,
	// which every worker matches. A job answers them sorted and
	// deduplicated, [] when none.
	Tags []string `json:"tags"`
}

// MaxRuntimeSeconds is the largest requirements.max_runtime_seconds: 30
// days.
const MaxRuntimeSeconds = 30 * 24 * 60 * 60

// CodeMaxRuntimeExceeded is the last_error code of a job whose lease
// reached its max_runtime_seconds (not an error answer's code).
const CodeMaxRuntimeExceeded = "max_runtime_exceeded"

// JobError is why a job's last attempt failed.
type JobError struct {
	Code    string          `json:"code"`
	Message string          `json:"message"`
	Attempt int             `json:"attempt"`
	At      time.Time       `json:"at"`
	Payload json.RawMessage `json:"payload,omitempty"`
}

// Job is a job on the wire.
type Job struct {
	ID              string          `json:"id"`
	JobType         string          `json:"job_type"`
	Payload         json.RawMessage `json:"payload"`
	Requirements    Requirements    `json:"requirements"`
	State           string          `json:"state"`
	Attempt         int             `json:"attempt"`
	MaxAttempts     int             `json:"max_attempts"`
	Priority        int             `json:"priority"`
	CreatedAt       time.Time       `json:"created_at"`
	ScheduledAt     time.Time       `json:"scheduled_at"`
	LeasedAt        *time.Time      `json:"leased_at"`
	AcceptedAt      *time.Time      `json:"accepted_at"`
	FinishedAt      *time.Time      `json:"finished_at"`
	ReceiptID       *string         `json:"receipt_id"`
	CancelRequested bool            `json:"cancel_requested"`
	LastError       *JobError       `json:"last_error"`
	WorkerID        *string         `json:"worker_id"`
	PolicyVersion   *int64          `json:"policy_version"`
	// ResumeFrom, in a grant of an attempt after the first, names the
	// latest checkpoint an earlier attempt stored; absent otherwise.
	ResumeFrom *ResumeFrom `json:"resume_from,omitempty"`
}

// Grant is one leased job.
type Grant struct {
	LeaseID    string    `json:"lease_id"`
	LeaseToken string    `json:"lease_token"`
	Job        Job       `json:"job"`
	ExpiresAt  time.Time `json:"expires_at"`
	AcceptBy   time.Time `json:"accept_by"`
}

// LeaseResponse answers a lease request: the first grant at the top level
// (as in the v0.2 contract) and every grant in Leases. With no job, the
// top-level fields are null and Leases is empty.
type LeaseResponse struct {
	LeaseID    *string    `json:"lease_id"`
	LeaseToken *string    `json:"lease_token"`
	Job        *Job       `json:"job"`
	ExpiresAt  *time.Time `json:"expires_at"`
	AcceptBy   *time.Time `json:"accept_by"`
	Message    string     `json:"message"`
	Leases     []Grant    `json:"leases"`
	// ServerTime is the server's clock when it answered, at or after the
	// grant of every lease in Leases: what a heartbeat's leases_through
	// echoes. Zero from a server older than the field.
	ServerTime time.Time `json:"server_time"`
}

// TokenRequest is the body of accept.
type TokenRequest struct {
	LeaseToken string `json:"lease_token"`
}

// AcceptResponse answers accept.
type AcceptResponse struct {
	Job       Job       `json:"job"`
	ExpiresAt time.Time `json:"expires_at"`
}

// StatusRequest is the body of POST /workers/jobs/{id}/status.
type StatusRequest struct {
	LeaseToken string          `json:"lease_token"`
	EventType  string          `json:"event_type"`
	Message    string          `json:"message"`
	Payload    json.RawMessage `json:"payload"`
	// IdempotencyKey, when set, makes the event repeatable: a repeat with
	// the same key and body gets the first answer and records no second
	// event (PROTOCOL.md "Retries").
	IdempotencyKey string `json:"idempotency_key,omitempty"`
}

// StatusResponse answers a status event.
type StatusResponse struct {
	OK              bool      `json:"ok"`
	ExpiresAt       time.Time `json:"expires_at"`
	CancelRequested bool      `json:"cancel_requested"`
}

// LogEntry is one log line.
type LogEntry struct {
	Seq     int64           `json:"seq"`
	Message string          `json:"message"`
	Payload json.RawMessage `json:"payload,omitempty"`
}

// LogsRequest is the body of POST /workers/jobs/{id}/logs: one entry (Seq,
// Message, Payload, as in v0.2) or a batch (Entries), not both.
type LogsRequest struct {
	LeaseToken string          `json:"lease_token"`
	Seq        *int64          `json:"seq"`
	Message    *string         `json:"message"`
	Payload    json.RawMessage `json:"payload"`
	Entries    []LogEntry      `json:"entries"`
	// IdempotencyKey, when set, makes the request repeatable: a repeat
	// with the same key and body gets the first answer (its accepted and
	// duplicates counts) rather than one that counts every entry a
	// duplicate (PROTOCOL.md "Retries").
	IdempotencyKey string `json:"idempotency_key,omitempty"`
}

// LogsResponse answers logs.
type LogsResponse struct {
	OK         bool      `json:"ok"`
	Accepted   int       `json:"accepted"`
	Duplicates int       `json:"duplicates"`
	ExpiresAt  time.Time `json:"expires_at"`
}

// ArtifactRequest is the body of POST /workers/jobs/{id}/artifacts.
type ArtifactRequest struct {
	LeaseToken     string          `json:"lease_token"`
	ArtifactType   string          `json:"artifact_type"`
	Name           string          `json:"name"`
	URI            string          `json:"uri"`
	ChecksumSHA256 *string         `json:"checksum_sha256"`
	SizeBytes      *int64          `json:"size_bytes"`
	Metadata       json.RawMessage `json:"metadata"`
	// IdempotencyKey, when set, makes the report repeatable: a repeat with
	// the same key and body gets the first artifact_id and receipt_id
	// (PROTOCOL.md "Retries").
	IdempotencyKey string `json:"idempotency_key,omitempty"`
	// UploadID, when set, finishes an upload (UploadResponse.UploadID):
	// the artifact is recorded as stored once its bytes are checked
	// against ChecksumSHA256 and SizeBytes, both then required; URI is
	// then optional.
	UploadID string `json:"upload_id,omitempty"`
}

// ArtifactResponse answers an artifact report.
type ArtifactResponse struct {
	ArtifactID string `json:"artifact_id"`
	ReceiptID  string `json:"receipt_id"`
	// Stored is true when the artifact's bytes are stored (an upload was
	// finished).
	Stored bool `json:"stored"`
}

// CompleteRequest is the body of POST /workers/jobs/{id}/complete.
type CompleteRequest struct {
	LeaseToken   string          `json:"lease_token"`
	OutputURI    *string         `json:"output_uri"`
	Metrics      json.RawMessage `json:"metrics"`
	FinalMessage *string         `json:"final_message"`
	// WaitForProofs asks the control plane to wait (a bounded time) for
	// the receipts to be sequenced, and to answer with their proofs and
	// checkpoint. Without it the answer comes at once, with the receipts
	// but no proofs (Proofs empty, Checkpoint ""), unless they were
	// sequenced already (a repeat); repeat the completion, or read GET
	// /operator/receipts/{id}, for them later (PROTOCOL.md §5.8).
	WaitForProofs bool `json:"wait_for_proofs,omitempty"`
}

// CompleteResponse answers a completion; repeating the completion with
// the same lease token returns the same job, amounts and receipts, with
// the proofs once they exist.
type CompleteResponse struct {
	Job           Job                    `json:"job"`
	ActualMS      int64                  `json:"actual_ms"`
	ActualHours   string                 `json:"actual_hours"`
	ActualCostUSD string                 `json:"actual_cost_usd"`
	ReceiptID     string                 `json:"receipt_id"`
	Receipts      []receipts.WireReceipt `json:"receipts"`
	Proofs        []receipts.Proof       `json:"proofs"`
	Checkpoint    string                 `json:"checkpoint"`
}

// CompleteBatchRequest is the body of POST /workers/jobs/complete: 1 to
// MaxBatchComplete completions, each of a job the caller holds a lease on.
type CompleteBatchRequest struct {
	Completions []Completion `json:"completions"`
}

// Completion is one job's completion in a batch: JobID names the job, and
// the rest is the body of its complete (POST /workers/jobs/{id}/complete),
// under the same rules and limits.
type Completion struct {
	JobID string `json:"job_id"`
	CompleteRequest
}

// CompleteBatchResponse answers a batch complete: one result per
// completion, in the order of the request.
type CompleteBatchResponse struct {
	Results []CompletionResult `json:"results"`
}

// CompletionResult is how one completion of a batch went: what complete
// of that job alone would have answered.
type CompletionResult struct {
	JobID string `json:"job_id"`
	// OK reports that the job is completed (now, or by an earlier
	// completion under the same lease token).
	OK bool `json:"ok"`
	// Status is the HTTP status complete of this job alone would have
	// answered: 200 when OK.
	Status int `json:"status"`
	// Error, when OK is false, is that answer's error: its code
	// (PROTOCOL.md §12) and message.
	Error *ErrorDetail `json:"error,omitempty"`
	// Completed, when OK is true, is that answer but for the job itself.
	Completed *CompletedJob `json:"completed,omitempty"`
}

// CompletedJob is what a batch answers for a job it completed: the
// fields of CompleteResponse but Job, whose payload a batch would echo
// once per job. Its receipts and proofs are as in CompleteResponse, every
// proof of a batch against the one checkpoint, repeated in each result
// that has proofs.
type CompletedJob struct {
	ReceiptID     string                 `json:"receipt_id"`
	ActualMS      int64                  `json:"actual_ms"`
	ActualHours   string                 `json:"actual_hours"`
	ActualCostUSD string                 `json:"actual_cost_usd"`
	Receipts      []receipts.WireReceipt `json:"receipts"`
	Proofs        []receipts.Proof       `json:"proofs"`
	Checkpoint    string                 `json:"checkpoint"`
}

// FailRequest is the body of POST /workers/jobs/{id}/fail.
type FailRequest struct {
	LeaseToken string          `json:"lease_token"`
	ErrorCode  string          `json:"error_code"`
	Message    string          `json:"message"`
	Payload    json.RawMessage `json:"payload"`
	Retryable  bool            `json:"retryable"`
}

// FailResponse answers a failure.
type FailResponse struct {
	Job       Job    `json:"job"`
	Requeued  bool   `json:"requeued"`
	ReceiptID string `json:"receipt_id"`
}

// ReleaseRequest is the body of POST /workers/jobs/{id}/release.
type ReleaseRequest struct {
	LeaseToken string `json:"lease_token"`
	Reason     string `json:"reason"`
}

// JobResponse answers release.
type JobResponse struct {
	Job Job `json:"job"`
}

// AuditEvent is one event a node reports.
type AuditEvent struct {
	EventType  string          `json:"event_type"`
	Message    string          `json:"message"`
	Payload    json.RawMessage `json:"payload"`
	OccurredAt *time.Time      `json:"occurred_at"`
}

// AuditRequest is the body of POST /workers/audit.
type AuditRequest struct {
	Events []AuditEvent `json:"events"`
	// IdempotencyKey, when set, makes the report repeatable: a repeat with
	// the same key and events gets the first receipt_ids (PROTOCOL.md
	// "Retries").
	IdempotencyKey string `json:"idempotency_key,omitempty"`
}

// AuditResponse answers audit.
type AuditResponse struct {
	ReceiptIDs []string `json:"receipt_ids"`
}
