package lease

import (
	"cmp"
	"encoding/json"
	"slices"
	"time"
)

// State is where a job stands in its lifecycle.
type State string

// The job states (PROTOCOL.md, section 6 "Jobs and leases"). Succeeded, Failed and Canceled are terminal.
const (
	StateQueued    State = "queued"
	StateLeased    State = "leased"
	StateRunning   State = "running"
	StateSucceeded State = "succeeded"
	StateFailed    State = "failed"
	StateCanceled  State = "canceled"
)

// Terminal reports whether no transition leaves s.
func (s State) Terminal() bool {
	return s == StateSucceeded || s == StateFailed || s == StateCanceled
}

// Live reports whether a job in state s holds a lease.
func (s State) Live() bool { return s == StateLeased || s == StateRunning }

// Valid reports whether s is one of the six states.
func (s State) Valid() bool { return s == StateQueued || s.Live() || s.Terminal() }

// Requirements constrain which workers may lease a job.
type Requirements struct {
	// GPUSKU, when set, is the only GPU model the job may run on.
	GPUSKU string `json:"gpu_sku"`
	// GPUCount is how many GPUs (of GPUSKU, when set) the worker must have.
	GPUCount int `json:"gpu_count"`
	// MinVRAMMB is the VRAM, in MiB, that each of those GPUs must have.
	MinVRAMMB int `json:"min_vram_mb"`
	// MaxRuntimeSeconds bounds how long the job may run under one lease,
	// counted from accept: a lease that reaches it is revoked and the job
	// ends failed with CodeMaxRuntimeExceeded, without a retry. 0 means
	// Config.MaxRuntime; at most MaxRuntimeLimit. It constrains no match.
	MaxRuntimeSeconds int `json:"max_runtime_seconds"`
	// Tags, when not empty, restrict the job to a pool: a worker may
	// lease it only if every one of them is among the worker's effective
	// tags (Worker.EffectiveTags; Requirements.TagsMatch decides). At most
	// MaxJobTags, each 1 to MaxTagLen bytes of UTF-8 without spaces or
	// control characters; Enqueue stores them sorted and deduplicated,
	// nil when there are none.
	Tags []string `json:"tags"`
}

// Matches reports whether a job with requirements r fits one of fs, as
// every Store's ClaimLeases must decide it. It says nothing of tags:
// TagsMatch does, and a Store must check both.
func (r Requirements) Matches(fs []Fit) bool {
	return slices.ContainsFunc(fs, func(f Fit) bool {
		return r.GPUSKU == f.SKU && r.GPUCount <= f.GPUs && r.MinVRAMMB <= f.VRAMMB
	})
}

// TagsMatch reports whether every tag of r is among tags, a worker's
// effective tags (Worker.EffectiveTags, which ClaimQuery.Tags carries),
// as every Store's ClaimLeases must decide it: a job without tags matches
// every worker, a tagged job only a worker that has all of its tags. The
// order of either list does not matter.
func (r Requirements) TagsMatch(tags []string) bool {
	for _, t := range r.Tags {
		if !slices.Contains(tags, t) {
			return false
		}
	}
	return true
}

// Job is a unit of work and its lifecycle.
type Job struct {
	ID           string          `json:"id"`
	Type         string          `json:"job_type"`
	Payload      json.RawMessage `json:"payload"`
	Requirements Requirements    `json:"requirements"`
	// Priority orders eligible jobs: higher first, then oldest.
	Priority int `json:"priority"`
	// MaxAttempts is how many attempts the job may use before it fails.
	MaxAttempts int   `json:"max_attempts"`
	State       State `json:"state"`
	// Attempt is the number of the attempt the job is on, or will next run
	// as, starting at 1. Only a TTL expiry or a retryable failure after
	// accept uses an attempt.
	Attempt int `json:"attempt"`

	CreatedAt time.Time `json:"created_at"`
	// ScheduledAt is the earliest time a queued job may be leased; a retry
	// sets it after its backoff.
	ScheduledAt time.Time  `json:"scheduled_at"`
	LeasedAt    *time.Time `json:"leased_at"`
	AcceptedAt  *time.Time `json:"accepted_at"`
	FinishedAt  *time.Time `json:"finished_at"`

	// ReceiptID is the id of the receipt that settled the job, set by the
	// caller that mints it.
	ReceiptID       string `json:"receipt_id"`
	CancelRequested bool   `json:"cancel_requested"`
	// LastError is the most recent failure, kept after a retry.
	LastError *JobError `json:"last_error"`
	// Result is what the worker reported on completion.
	Result *Result `json:"result"`

	// Lease is the job's current lease while State is leased or running,
	// and its last lease afterwards (so a repeated completion can be
	// recognised). It is nil for a job that was never leased.
	Lease *Lease `json:"lease"`

	// Rev is the job record's revision: stores write a job only if the
	// stored revision is the one the writer read (see Store.UpdateJob).
	Rev int64 `json:"-"`
}

// JobError records why an attempt failed.
type JobError struct {
	Code    string          `json:"code"`
	Message string          `json:"message"`
	Payload json.RawMessage `json:"payload,omitempty"`
	// Attempt is the attempt that failed.
	Attempt int       `json:"attempt"`
	At      time.Time `json:"at"`
}

// Result is what a worker reported when it completed a job.
type Result struct {
	OutputURI    string          `json:"output_uri,omitempty"`
	Metrics      json.RawMessage `json:"metrics,omitempty"`
	FinalMessage string          `json:"final_message,omitempty"`
	// ReceiptID, given to Manager.Complete, is the id of the receipt
	// that will settle the job, which the caller mints in the same
	// transaction: the completion stores it as Job.ReceiptID, in the same
	// write (SetReceipt does it afterwards). It is not part of the stored
	// Result, which keeps it empty.
	ReceiptID string `json:"-"`
}

// Lease is one grant of a job to one worker.
type Lease struct {
	ID       string `json:"lease_id"`
	JobID    string `json:"job_id"`
	WorkerID string `json:"worker_id"`
	// Epoch is the fencing token: it strictly increases with every lease of
	// the job, independently of the attempt count.
	Epoch int64 `json:"epoch"`
	// TokenHash is SHA-256 of the lease token; the token itself is never stored.
	TokenHash []byte    `json:"-"`
	ExpiresAt time.Time `json:"expires_at"`
	// AcceptBy is the deadline for Accept; a lease not accepted by then
	// returns the job to the queue.
	AcceptBy time.Time `json:"accept_by"`
	// SKU is the GPU model the job runs on: the job's own SKU, else the
	// worker's first GPU's.
	SKU string `json:"sku"`
	// PriceMicroUSD is the price per GPU-hour in micro-USD, snapshotted
	// when the lease was granted.
	PriceMicroUSD int64 `json:"price_micro_usd"`
	// PolicyVersion is the envelope policy version in force at lease time.
	PolicyVersion int64 `json:"policy_version"`
}

// EventKind tells status events from log lines.
type EventKind string

// Event kinds.
const (
	EventStatus EventKind = "status"
	EventLog    EventKind = "log"
)

// Event is a status event or a log line reported by a worker.
type Event struct {
	// ID is assigned by the store, increasing in insertion order.
	ID    int64     `json:"id"`
	JobID string    `json:"job_id"`
	Kind  EventKind `json:"kind"`
	// Epoch is the lease epoch under which the worker reported the event.
	Epoch int64 `json:"epoch"`
	// Type is a status event's event_type (for example "progress").
	Type    string          `json:"event_type,omitempty"`
	Message string          `json:"message"`
	Payload json.RawMessage `json:"payload,omitempty"`
	// Seq numbers a job's log lines; a seq already stored is a duplicate.
	// Zero for status events.
	Seq       int64     `json:"seq,omitempty"`
	CreatedAt time.Time `json:"created_at"`
}

// Artifact is a file a worker produced for a job.
type Artifact struct {
	ID        string          `json:"artifact_id"`
	JobID     string          `json:"job_id"`
	WorkerID  string          `json:"worker_id"`
	Epoch     int64           `json:"epoch"`
	Type      string          `json:"artifact_type"`
	Name      string          `json:"name"`
	URI       string          `json:"uri"`
	SHA256    string          `json:"checksum_sha256,omitempty"`
	SizeBytes int64           `json:"size_bytes,omitempty"`
	Metadata  json.RawMessage `json:"metadata,omitempty"`
	// Object, when set, names where the artifact's bytes are stored: the
	// key prefix of its parts in the host's artifact store ("" means the
	// artifact is metadata only). The control plane sets it, never a
	// worker, and only after it checked SHA256 and SizeBytes against the
	// stored bytes.
	Object string `json:"object,omitempty"`
	// PartSize is the size of each stored part but the last, when Object
	// is set: part n (from 1) holds bytes (n-1)*PartSize onwards.
	PartSize int64 `json:"part_size,omitempty"`
	// ReceiptID is the receipt minted for the artifact, set by the caller.
	ReceiptID string    `json:"receipt_id,omitempty"`
	CreatedAt time.Time `json:"created_at"`
}

// GPU is one GPU a worker has.
type GPU struct {
	SKU    string `json:"sku"`
	VRAMMB int    `json:"vram_mb"`
}

// Capabilities are what a worker can run.
type Capabilities struct {
	GPUs     []GPU    `json:"gpus"`
	JobTypes []string `json:"job_types"`
}

// Governor limits how much of a worker the control plane may use.
type Governor struct {
	// MaxJobs is how many live leases the worker may hold; 0 means 1.
	MaxJobs int `json:"max_jobs"`
	// MaxVRAMMB, when positive, caps the VRAM any one job may require.
	MaxVRAMMB int `json:"max_vram_mb"`
}

// Worker is a registered worker node.
type Worker struct {
	ID                string          `json:"worker_id"`
	NodeID            string          `json:"node_id"`
	Name              string          `json:"name"`
	Hostname          string          `json:"hostname"`
	EndpointURL       string          `json:"endpoint_url,omitempty"`
	Role              string          `json:"role"`
	Tags              []string        `json:"tags"`
	Version           string          `json:"version"`
	HeartbeatInterval int             `json:"heartbeat_interval_seconds"`
	Capabilities      Capabilities    `json:"capabilities"`
	Governor          Governor        `json:"governor_limits"`
	PolicyVersion     int64           `json:"policy_version"`
	Status            string          `json:"status"`
	Metrics           json.RawMessage `json:"metrics,omitempty"`
	RegisteredAt      time.Time       `json:"registered_at"`
	LastSeenAt        time.Time       `json:"last_seen_at"`
	// Approval is the operator's approval of the worker: whether it still
	// awaits one, and the job types it pins. Only Manager.Approve (through
	// Store.SetApproval) changes it once the worker is stored.
	Approval Approval `json:"approval"`
	// Drain is the operator's standing request that the worker drain
	// (Manager.SetDrain), nil when there is none: while it stands the
	// worker is granted no job. Only Manager.SetDrain (through
	// DrainStore.SetDrain) changes it once the worker is stored.
	Drain *DrainRequest `json:"drain,omitempty"`
}

// DrainRequest is an operator's request that a worker drain: finish what
// it runs and take nothing new.
type DrainRequest struct {
	// At is when the request was made.
	At time.Time `json:"at"`
	// By names who made it (the operator's principal id).
	By string `json:"by,omitempty"`
}

// EffectiveTags returns the tags a job's Requirements.Tags are matched
// against: those w registered (Tags), and when its approval pins tags
// (Approval.Tags), only those of them it pins, sorted and without
// duplicates, nil when none. An approval narrows the registered tags,
// never widens them, as it narrows job types.
func (w *Worker) EffectiveTags() []string {
	var out []string
	for _, t := range w.Tags {
		if w.Approval.allowsTag(t) {
			out = append(out, t)
		}
	}
	slices.Sort(out)
	return slices.Compact(out)
}

// Fits lists the job shapes w can take on the SKUs offered (all of its
// own when offered is empty): for each SKU (and for jobs without one) and
// each VRAM size among the GPUs, how many GPUs have at least that much.
// The governor's max_vram_mb caps every size. A shape with no GPUs admits
// CPU-only jobs. Lease matches with it; Requirements.Matches tests a job.
//
// It takes time O(G log G) in the worker's G GPUs (and linear in the SKUs
// offered), and lists at most 2G+1 shapes: it runs for every worker
// whenever a job's leasability is explained.
func (w *Worker) Fits(offered []string) []Fit {
	var want map[string]bool
	if len(offered) > 0 {
		want = make(map[string]bool, len(offered))
		for _, s := range offered {
			want[s] = true
		}
	}
	// The GPUs of each offered SKU, SKUs in the order they first appear.
	var skus []string
	bySKU := map[string][]GPU{}
	var all []GPU
	for _, g := range w.Capabilities.GPUs {
		if want != nil && !want[g.SKU] {
			continue
		}
		if _, ok := bySKU[g.SKU]; !ok {
			skus = append(skus, g.SKU)
		}
		bySKU[g.SKU] = append(bySKU[g.SKU], g)
	}
	out := []Fit{{}}
	listed := map[Fit]bool{}
	// add lists the shapes of gpus under sku not listed yet. Within one
	// call, two GPUs give one shape exactly when their VRAM is equal.
	add := func(sku string, gpus []GPU) {
		// desc holds the VRAM sizes, largest first: the GPUs with at least
		// v are those before the first size below v.
		desc := make([]int, len(gpus))
		for i, g := range gpus {
			desc[i] = g.VRAMMB
		}
		slices.SortFunc(desc, func(a, b int) int { return cmp.Compare(b, a) })
		for _, g := range gpus {
			n, _ := slices.BinarySearchFunc(desc, g.VRAMMB, func(e, t int) int {
				if e >= t {
					return -1
				}
				return 1
			})
			v := g.VRAMMB
			if w.Governor.MaxVRAMMB > 0 {
				v = min(v, w.Governor.MaxVRAMMB)
			}
			if f := (Fit{SKU: sku, GPUs: n, VRAMMB: v}); !listed[f] {
				listed[f] = true
				out = append(out, f)
			}
		}
	}
	// GPUs without a SKU are listed under "" twice: on their own, then
	// with all the others; a shape is listed once.
	for _, sku := range skus {
		add(sku, bySKU[sku])
		all = append(all, bySKU[sku]...)
	}
	add("", all)
	return out
}
