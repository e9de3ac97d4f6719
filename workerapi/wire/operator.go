package wire

import (
	"encoding/json"
	"time"

	"golang.org/x/mod/sumdb/tlog"

	"github.com/nodelane/nodelane/receipts"
)

// The bodies and answers of the operator routes.

// DispatchRequest is the body of POST /operator/jobs.
type DispatchRequest struct {
	JobType string `json:"job_type"`
	// Payload is a JSON object; absent or null means {}.
	Payload      json.RawMessage `json:"payload"`
	Requirements Requirements    `json:"requirements"`
	Priority     int             `json:"priority"`
	// MaxAttempts defaults to 3; at most 100.
	MaxAttempts int `json:"max_attempts"`
}

// OperatorJob is a job as the operator routes show it: the job and what
// it was charged. The charge fields are null until the job is charged
// (it succeeded: its job_charged receipt was minted with its
// completion), and then equal that receipt's actual_ms, actual_hours and
// actual_cost_usd; ActualCostMicroUSD is actual_cost_usd in micro-USD.
type OperatorJob struct {
	Job
	ActualMS           *int64  `json:"actual_ms"`
	ActualHours        *string `json:"actual_hours"`
	ActualCostUSD      *string `json:"actual_cost_usd"`
	ActualCostMicroUSD *int64  `json:"actual_cost_micro_usd"`
}

// OperatorJobResponse answers POST /operator/jobs/{id}/cancel and
// /retry. ReceiptID is the job_retried receipt of a retry; a cancel
// answers without it.
type OperatorJobResponse struct {
	Job       OperatorJob `json:"job"`
	ReceiptID *string     `json:"receipt_id,omitempty"`
}

// DispatchResponse answers POST /operator/jobs: the queued job and
// whether a registered worker could lease it now; when not, Reason says
// why.
type DispatchResponse struct {
	Job      OperatorJob `json:"job"`
	Leasable bool        `json:"leasable"`
	Reason   string      `json:"reason"`
}

// DispatchBatchRequest is the body of POST /operator/jobs/batch: 1 to
// MaxBatchDispatch jobs, each as POST /operator/jobs takes it, queued all
// in one transaction or none.
type DispatchBatchRequest struct {
	Jobs []DispatchRequest `json:"jobs"`
}

// DispatchBatchResponse answers POST /operator/jobs/batch: each job's
// answer, as POST /operator/jobs would give it, in the order of the
// request.
type DispatchBatchResponse struct {
	Jobs []DispatchResponse `json:"jobs"`
}

// The order= values of the operator list routes (GET /operator/jobs,
// /operator/artifacts, /operator/workers, /operator/credentials,
// /operator/receipts). Any other value is refused with 400
// invalid_request.
const (
	// OrderAsc lists oldest first (ascending ids or indexes): the default.
	OrderAsc = "asc"
	// OrderDesc lists newest first; after= and next then page toward
	// older items (after= is an exclusive upper bound).
	OrderDesc = "desc"
)

// JobListResponse answers GET
// /operator/jobs[?state=&job_type=&worker_id=&tag=&after=&limit=&order=]:
// jobs in id order (ids are time-ordered; newest first with order=desc),
// 100 a page unless limit (1 to 1,000) says otherwise. worker_id selects
// the jobs whose last lease (live or ended) was that worker's, tag those
// whose requirements.tags include it; filters combine. Next is the after=
// of the next page, null after the last.
type JobListResponse struct {
	Jobs []OperatorJob `json:"jobs"`
	Next *string       `json:"next"`
}

// JobResult is what the worker reported when it completed a job.
type JobResult struct {
	OutputURI    *string         `json:"output_uri"`
	Metrics      json.RawMessage `json:"metrics"`
	FinalMessage *string         `json:"final_message"`
}

// JobEventView is a status event or a log line of a job.
type JobEventView struct {
	ID int64 `json:"id"`
	// Kind is "status" or "log".
	Kind string `json:"kind"`
	// EventType is a status event's event_type; null for a log line.
	EventType  *string         `json:"event_type"`
	Message    string          `json:"message"`
	Payload    json.RawMessage `json:"payload"`
	Seq        *int64          `json:"seq"`
	LeaseEpoch int64           `json:"lease_epoch"`
	CreatedAt  time.Time       `json:"created_at"`
}

// JobDetailResponse answers GET /operator/jobs/{id}. Reason says why a
// queued job cannot be leased now ("" when it can, and for a job in any
// other state). Events are the first page of the job's events after
// ?events_after= (1,000 at most); EventsNext is the events_after= of the
// next page, null after the last. Artifacts are the job's first
// MaxJobArtifacts artifacts (fewer once they reach MaxPageBytes);
// ArtifactsNext, when more follow, is the after= with which GET
// /operator/artifacts?job_id= pages on, null when none do.
type JobDetailResponse struct {
	Job        OperatorJob    `json:"job"`
	Leasable   bool           `json:"leasable"`
	Reason     string         `json:"reason"`
	Result     *JobResult     `json:"result"`
	Events     []JobEventView `json:"events"`
	EventsNext *int64         `json:"events_next"`
	Artifacts  []ArtifactView `json:"artifacts"`
	// ArtifactsNext is the after= of the job's remaining artifacts.
	ArtifactsNext *string `json:"artifacts_next"`
}

// The statuses of an artifact, from its job's outcome.
const (
	// ArtifactTrained means an adapter of a lora_train job that succeeded.
	ArtifactTrained = "trained"
	// ArtifactSucceeded means any other artifact of the attempt that succeeded.
	ArtifactSucceeded = "succeeded"
	// ArtifactFailed and ArtifactCanceled mean the job ended so.
	ArtifactFailed   = "failed"
	ArtifactCanceled = "canceled"
	// ArtifactPending means the job has not ended.
	ArtifactPending = "pending"
	// ArtifactSuperseded means the job succeeded, but under a later lease than
	// the one that reported the artifact: the artifact is from an
	// abandoned attempt (an expired or released lease), not the result.
	ArtifactSuperseded = "superseded"
)

// ArtifactView is an artifact with its job's outcome.
type ArtifactView struct {
	ArtifactID     string          `json:"artifact_id"`
	ArtifactType   string          `json:"artifact_type"`
	Name           string          `json:"name"`
	URI            string          `json:"uri"`
	ChecksumSHA256 *string         `json:"checksum_sha256"`
	SizeBytes      int64           `json:"size_bytes"`
	Metadata       json.RawMessage `json:"metadata"`
	ReceiptID      *string         `json:"receipt_id"`
	CreatedAt      time.Time       `json:"created_at"`
	WorkerID       string          `json:"worker_id"`
	LeaseEpoch     int64           `json:"lease_epoch"`
	JobID          string          `json:"job_id"`
	JobType        string          `json:"job_type"`
	JobState       string          `json:"job_state"`
	// Status is one of the Artifact* constants.
	Status string `json:"status"`
	// Stored is true when the control plane holds the artifact's bytes;
	// ContentURL is then the route that serves them
	// (OperatorArtifactContentPath), null otherwise.
	Stored     bool    `json:"stored"`
	ContentURL *string `json:"content_url"`
}

// ArtifactListResponse answers
// GET /operator/artifacts[?job_id=&artifact_type=&after=&limit=&order=]:
// artifacts in id order (newest first with order=desc), 1,000 a page
// unless limit says fewer. Next is
// the after= of the next page, null after the last.
type ArtifactListResponse struct {
	Artifacts []ArtifactView `json:"artifacts"`
	Next      *string        `json:"next"`
}

// WorkerView is a registered worker and its ban.
type WorkerView struct {
	WorkerID                 string         `json:"worker_id"`
	NodeID                   string         `json:"node_id"`
	Name                     string         `json:"name"`
	Hostname                 string         `json:"hostname"`
	EndpointURL              *string        `json:"endpoint_url"`
	Role                     string         `json:"role"`
	Tags                     []string       `json:"tags"`
	Version                  string         `json:"version"`
	HeartbeatIntervalSeconds int            `json:"heartbeat_interval_seconds"`
	Capabilities             Capabilities   `json:"capabilities"`
	GovernorLimits           GovernorLimits `json:"governor_limits"`
	PolicyVersion            int64          `json:"policy_version"`
	// Status is the last heartbeat's: idle, busy or draining (or
	// "registered" before the first). It is what the worker said, however
	// long ago: Liveness says whether it still heartbeats.
	Status string `json:"status"`
	// Liveness is LivenessOnline, LivenessStale or LivenessOffline, from
	// LastSeenAt (the last heartbeat or registration) when read.
	Liveness     string     `json:"liveness"`
	RegisteredAt time.Time  `json:"registered_at"`
	LastSeenAt   time.Time  `json:"last_seen_at"`
	Banned       bool       `json:"banned"`
	BanReason    *string    `json:"ban_reason"`
	BannedAt     *time.Time `json:"banned_at"`
	// Approval is ApprovalNotRequired, ApprovalPending or
	// ApprovalApproved. ApprovedAt and ApprovedBy are the last approval's,
	// null before one; ApprovedJobTypes and ApprovedTags are what it pins,
	// [] when nothing.
	Approval         string     `json:"approval"`
	ApprovedAt       *time.Time `json:"approved_at"`
	ApprovedBy       *string    `json:"approved_by"`
	ApprovedJobTypes []string   `json:"approved_job_types"`
	ApprovedTags     []string   `json:"approved_tags"`
	// PendingJobTypes and PendingTags are the registered job types and
	// tags that await an operator's approval: all of them while Approval
	// is pending, afterwards those the approval does not cover (a widening
	// since); [] when none.
	PendingJobTypes []string `json:"pending_job_types"`
	PendingTags     []string `json:"pending_tags"`
	// MaxLeases is how many live leases the worker may hold: its
	// governor's max_jobs (0 meaning 1), capped by the control plane.
	MaxLeases int `json:"max_leases"`
	// Drain reports an operator's standing request that the worker drain
	// (POST /operator/workers/{id}/drain, withdrawn by .../resume): it is
	// granted no job while it stands. DrainRequestedAt and
	// DrainRequestedBy say when and by whom, null without one.
	Drain            bool       `json:"drain"`
	DrainRequestedAt *time.Time `json:"drain_requested_at"`
	DrainRequestedBy *string    `json:"drain_requested_by"`
}

// WorkerListResponse answers GET /operator/workers[?after=&limit=&order=]:
// workers in id order (newest first with order=desc), 1,000 a page
// unless limit says fewer. Next is the
// after= of the next page, null after the last.
type WorkerListResponse struct {
	Workers []WorkerView `json:"workers"`
	Next    *string      `json:"next"`
}

// WorkerLease is one live lease a worker holds.
type WorkerLease struct {
	JobID           string    `json:"job_id"`
	JobType         string    `json:"job_type"`
	State           string    `json:"state"`
	LeaseID         string    `json:"lease_id"`
	LeaseEpoch      int64     `json:"lease_epoch"`
	ExpiresAt       time.Time `json:"expires_at"`
	AcceptBy        time.Time `json:"accept_by"`
	CancelRequested bool      `json:"cancel_requested"`
}

// WorkerDetailResponse answers GET /operator/workers/{id}: the worker, its
// latest heartbeat metrics (null before the first) and its live leases.
type WorkerDetailResponse struct {
	Worker  WorkerView      `json:"worker"`
	Metrics json.RawMessage `json:"metrics"`
	Leases  []WorkerLease   `json:"leases"`
}

// WorkerResponse answers ban and unban. ReceiptID is the receipt of the
// change, null when the call changed nothing.
type WorkerResponse struct {
	Worker    WorkerView `json:"worker"`
	ReceiptID *string    `json:"receipt_id"`
}

// ReasonRequest is the body of ban, unban, revoke and deactivate: a
// reason, which deactivate requires and the others record if given.
type ReasonRequest struct {
	Reason string `json:"reason"`
}

// MintCredentialRequest is the body of POST /operator/credentials.
type MintCredentialRequest struct {
	Principal string   `json:"principal"`
	Scopes    []string `json:"scopes"`
	// TTLSeconds is the credential's lifetime; absent or 0 means 30 days.
	TTLSeconds int64 `json:"ttl_seconds"`
	// MaxRegistrations, for a credential with node:register, limits how
	// many registrations it may authorise (1 to MaxRegistrations); absent
	// or null means no limit.
	MaxRegistrations *int64 `json:"max_registrations"`
}

// MintCredentialResponse answers POST /operator/credentials. Token is
// shown this once.
type MintCredentialResponse struct {
	CredentialID string    `json:"credential_id"`
	Token        string    `json:"token"`
	Principal    string    `json:"principal"`
	Scopes       []string  `json:"scopes"`
	ExpiresAt    time.Time `json:"expires_at"`
	ReceiptID    string    `json:"receipt_id"`
	// MaxRegistrations is the credential's limit of registrations, null
	// for none.
	MaxRegistrations *int64 `json:"max_registrations"`
}

// RevokeCredentialResponse answers POST /operator/credentials/{id}/revoke.
// ReceiptID is null when the credential was revoked already.
type RevokeCredentialResponse struct {
	CredentialID string    `json:"credential_id"`
	Principal    string    `json:"principal"`
	RevokedAt    time.Time `json:"revoked_at"`
	ReceiptID    *string   `json:"receipt_id"`
}

// CredentialView is a credential as GET /operator/credentials lists it:
// never its token, secret or digest. RevokedAt is null while it is not
// revoked.
type CredentialView struct {
	CredentialID string     `json:"credential_id"`
	Principal    string     `json:"principal"`
	Scopes       []string   `json:"scopes"`
	CreatedAt    time.Time  `json:"created_at"`
	ExpiresAt    time.Time  `json:"expires_at"`
	RevokedAt    *time.Time `json:"revoked_at"`
	// Registrations is how many node registrations the credential
	// authorised (re-registrations included); 0 for a credential without
	// node:register.
	Registrations int64 `json:"registrations"`
	// MaxRegistrations is its limit of registrations, null for none.
	MaxRegistrations *int64 `json:"max_registrations"`
}

// CredentialListResponse answers GET
// /operator/credentials[?principal=&after=&limit=&order=]: credentials in
// byte order of their ids (descending with order=desc). Next is the after= of the next page, null after
// the last.
type CredentialListResponse struct {
	Credentials []CredentialView `json:"credentials"`
	Next        *string          `json:"next"`
}

// CreatePrincipalRequest is the body of POST /operator/principals: the
// new operator principal's id (1 to MaxPrincipalIDLen bytes of
// [A-Za-z0-9._:@-], starting with a letter or a digit) and its name for
// people (at most MaxPrincipalNameLen bytes without control characters;
// may be empty).
type CreatePrincipalRequest struct {
	ID   string `json:"id"`
	Name string `json:"name"`
}

// CreatePrincipalResponse answers POST /operator/principals with the
// principal created, always of kind "operator", and its principal_created
// receipt.
type CreatePrincipalResponse struct {
	ID        string    `json:"id"`
	Kind      string    `json:"kind"`
	Name      string    `json:"name"`
	CreatedAt time.Time `json:"created_at"`
	ReceiptID string    `json:"receipt_id"`
}

// The limits of POST /operator/principals.
const (
	// MaxPrincipalIDLen bounds a principal id, in bytes.
	MaxPrincipalIDLen = 128
	// MaxPrincipalNameLen bounds a principal's name, in bytes.
	MaxPrincipalNameLen = 256
)

// EnvelopeResponse is the envelope's state: whether blocked job types may
// run now (Active accounts for the deadline), the policy version, the
// last change, and the job type classes (unlisted types are blocked).
// ReceiptID is set on the answers of activate and deactivate.
type EnvelopeResponse struct {
	Active        bool       `json:"active"`
	PolicyVersion int64      `json:"policy_version"`
	By            string     `json:"by"`
	Reason        string     `json:"reason"`
	Until         *time.Time `json:"until"`
	ChangedAt     *time.Time `json:"changed_at"`
	// SafeTypes are every safe job type: the canonical ones, the
	// server's (-safe-type), then RuntimeSafeTypes.
	SafeTypes    []string `json:"safe_types"`
	BlockedTypes []string `json:"blocked_types"`
	// RuntimeSafeTypes are the job types operators made safe at run time
	// (POST /operator/envelope/safe-types), sorted, [] when none: the
	// ones a change may remove.
	RuntimeSafeTypes []string `json:"runtime_safe_types"`
	ReceiptID        string   `json:"receipt_id,omitempty"`
}

// SafeTypesRequest is the body of POST /operator/envelope/safe-types: job
// types to make safe (Add) and to make blocked again (Remove), together
// 1 to MaxSafeTypesChange, and why (Reason, required, at most
// MaxReasonBytes). A canonical blocked type (raw_training,
// model_file_write, ...) can never be made safe.
type SafeTypesRequest struct {
	Add    []string `json:"add"`
	Remove []string `json:"remove"`
	Reason string   `json:"reason"`
}

// The limits of POST /operator/envelope/safe-types; a change beyond one
// is refused with 400 invalid_request.
const (
	// MaxSafeTypesChange bounds the job types one change adds and
	// removes.
	MaxSafeTypesChange = 64
	// MaxRuntimeSafeTypes bounds the job types made safe at run time, all
	// changes together.
	MaxRuntimeSafeTypes = 256
)

// ActivateRequest is the body of POST /operator/envelope/activate.
type ActivateRequest struct {
	Reason string `json:"reason"`
	// Until, when set, ends the activation at that time.
	Until *time.Time `json:"until"`
}

// ReceiptListResponse answers GET
// /operator/receipts[?kind=&after=&limit=&order=]: sequenced receipts with
// an index above after, in index order (below it, newest first, with
// order=desc; a desc page that reaches index 0 has no Next), 100 a
// page unless limit (1 to 1,000) says otherwise. Next is the after= of
// the next page (the last index listed), null after the last. With kind,
// only receipts of that kind are listed, and a page also ends once
// MaxReceiptKindScan receipts were read, with Next the last index read:
// a page may then hold fewer than limit receipts, or none, and still
// have a next one.
type ReceiptListResponse struct {
	Receipts []receipts.WireReceipt `json:"receipts"`
	Next     *int64                 `json:"next"`
}

// MaxReceiptKindScan bounds how many receipts of the log one page of GET
// /operator/receipts?kind= reads.
const MaxReceiptKindScan = 10000

// ReceiptResponse answers GET /operator/receipts/{id}: the receipt, and,
// once it is sequenced, its inclusion proof and the signed checkpoint the
// proof is against (both null before).
type ReceiptResponse struct {
	Receipt    receipts.WireReceipt `json:"receipt"`
	Proof      *receipts.Proof      `json:"proof"`
	Checkpoint *string              `json:"checkpoint"`
}

// The group_by values of GET /operator/costs.
const (
	// CostGroupBySKU groups charges by the GPU SKU of their receipt ("" for
	// a job that ran on none).
	CostGroupBySKU = "sku"
	// CostGroupByWorker groups charges by worker id.
	CostGroupByWorker = "worker"
	// CostGroupByJobType groups charges by the job type of the
	// job_completed receipt minted with each.
	CostGroupByJobType = "job_type"
)

// The limits of GET /operator/costs; a report beyond one is refused with
// 400 invalid_request.
const (
	// MaxCostRangeDays bounds to - from.
	MaxCostRangeDays = 366
	// MaxCostGroups bounds the groups of one report.
	MaxCostGroups = 10000
	// MaxCostScanReceipts bounds the receipts of the log a report reads
	// (it reads the whole log, in index order).
	MaxCostScanReceipts = 1000000
)

// CostSum is what a set of job_charged receipts adds up to: how many
// (Jobs), their actual_ms summed (ActualMS), their GPU time in hours
// (GPUHours: the sum of actual_ms × gpu_count, formatted as hours with
// six decimals, rounded half up once), and their actual_cost_usd summed,
// exactly, in micro-USD (CostMicroUSD) and as USD with six decimals
// (CostUSD).
type CostSum struct {
	Jobs         int64  `json:"jobs"`
	ActualMS     int64  `json:"actual_ms"`
	GPUHours     string `json:"gpu_hours"`
	CostMicroUSD int64  `json:"cost_micro_usd"`
	CostUSD      string `json:"cost_usd"`
}

// CostGroup is the sum of the charges with one key: a GPU SKU, a worker
// id or a job type.
type CostGroup struct {
	Key string `json:"key"`
	CostSum
}

// CostReport answers GET /operator/costs[?from=&to=&group_by=]: the
// job_charged receipts whose server_time is in [From, To), summed by
// group (sorted by key, in byte order) and in total, and beside them the
// GPU time no one was charged for (Unbilled).
type CostReport struct {
	From    time.Time   `json:"from"`
	To      time.Time   `json:"to"`
	GroupBy string      `json:"group_by"`
	Groups  []CostGroup `json:"groups"`
	Total   CostSum     `json:"total"`
	// Unbilled sums the attempts of the window that ended uncharged: every
	// job_failed receipt, and every job_completed receipt whose charged
	// is "no", by reason.
	Unbilled Unbilled `json:"unbilled"`
}

// UnbilledCompleted is the Reason of the unbilled group of completions
// that were not charged (job_completed receipts with charged "no").
const UnbilledCompleted = "completed_uncharged"

// UnbilledSum is what a set of uncharged attempts adds up to: how many
// (Attempts), their actual_ms summed (ActualMS), their GPU time in
// GPU-milliseconds exactly (GPUMS: the sum of actual_ms × gpu_count) and
// in GPU-hours (GPUHours: GPUMS / 3,600,000 with six decimals, rounded
// half up once). A receipt minted before receipts carried actual_ms
// counts as an attempt of 0 ms.
type UnbilledSum struct {
	Attempts int64  `json:"attempts"`
	ActualMS int64  `json:"actual_ms"`
	GPUMS    int64  `json:"gpu_ms"`
	GPUHours string `json:"gpu_hours"`
}

// UnbilledGroup is the uncharged attempts of one reason: a job_failed
// receipt's error_code (lease_expired, worker_offline, a worker's own
// code, ...), or UnbilledCompleted.
type UnbilledGroup struct {
	Reason string `json:"reason"`
	UnbilledSum
}

// Unbilled is the uncharged GPU time of a cost report's window, by reason
// (sorted in byte order) and in total.
type Unbilled struct {
	Groups []UnbilledGroup `json:"groups"`
	Total  UnbilledSum     `json:"total"`
}

// ConsistencyResponse answers GET /operator/receipts/consistency.
type ConsistencyResponse struct {
	Hashes []tlog.Hash `json:"hashes"`
}

// The liveness of a worker (WorkerView.Liveness), from its last_seen_at
// and the control plane's heartbeat interval h and offline_after.
const (
	// LivenessOnline means the worker was last seen within 1.5 × h.
	LivenessOnline = "online"
	// LivenessStale means it missed a heartbeat (last seen over 1.5 × h ago),
	// and is not yet offline. It keeps its leases and still counts for
	// leasability.
	LivenessStale = "stale"
	// LivenessOffline means it was last seen offline_after ago or more. Its live leases
	// end (their jobs go back to the queue with last_error worker_offline)
	// and it does not count for leasability.
	LivenessOffline = "offline"
)
