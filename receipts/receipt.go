package receipts

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"
	"unicode/utf8"
)

// Kind names what a receipt records.
type Kind string

// The receipt kinds. The package documentation lists the fields of each.
const (
	KindWorkerRegistered    Kind = "worker_registered"
	KindArtifactReported    Kind = "artifact_reported"
	KindJobCompleted        Kind = "job_completed"
	KindJobCharged          Kind = "job_charged"
	KindJobFailed           Kind = "job_failed"
	KindEnvelopeActivated   Kind = "envelope_activated"
	KindEnvelopeDeactivated Kind = "envelope_deactivated"
	KindCredentialMinted    Kind = "credential_minted"
	KindCredentialRevoked   Kind = "credential_revoked"
	KindPrincipalCreated    Kind = "principal_created"
	KindWorkerBanned        Kind = "worker_banned"
	KindWorkerUnbanned      Kind = "worker_unbanned"
	KindWorkerApproved      Kind = "worker_approved"
	KindWorkerRetired       Kind = "worker_retired"
	KindNodeAudit           Kind = "node_audit"
	// KindWorkerUpdated records that a worker that started (or registered) again
	// brought other capabilities than it had: job types, tags, GPUs or
	// governor limits, old and new.
	KindWorkerUpdated Kind = "worker_updated"
	// KindJobRetried records that an operator put a failed or canceled job
	// back in the queue with a fresh attempt budget.
	KindJobRetried Kind = "job_retried"
	// KindEnvelopeSafeTypesChanged records that an operator changed the
	// envelope's safe job types: the list before and after.
	KindEnvelopeSafeTypesChanged Kind = "envelope_safe_types_changed"
)

// Kinds returns every receipt kind, in byte order.
func Kinds() []Kind {
	ks := make([]Kind, 0, len(kindSpecs))
	for k := range kindSpecs {
		ks = append(ks, k)
	}
	slices.Sort(ks)
	return ks
}

// Valid reports whether k is a known kind.
func (k Kind) Valid() bool {
	_, ok := kindSpecs[k]
	return ok
}

// The outcomes of a job_failed receipt.
const (
	// OutcomeRequeued means the job went back to the queue for another attempt.
	OutcomeRequeued = "requeued"
	// OutcomeFailed means the job failed for good (not retryable, or out of attempts).
	OutcomeFailed = "failed"
	// OutcomeCanceled means the job had a cancel request and ended canceled.
	OutcomeCanceled = "canceled"
)

// The values of the "charged" field of job_completed and job_failed
// receipts: whether the attempt's GPU time was billed (by a job_charged
// receipt). Canonical bodies have no booleans, so it is a string.
const (
	// ChargedYes means the attempt was billed; a completion's job_charged
	// receipt is the charge.
	ChargedYes = "yes"
	// ChargedNo means the attempt's GPU time was billed to no one.
	ChargedNo = "no"
)

// Receipt is one consequential event, in the fields its canonical bytes
// carry. Which fields a kind requires and allows is listed in the package
// documentation; a field a kind does not allow must be left zero, and an
// optional field left zero is absent from the bytes.
//
// Times are kept in UTC to the microsecond; Encode truncates finer ones.
type Receipt struct {
	// ID is the receipt's id; Log.Mint assigns one when it is empty.
	ID   string
	Kind Kind
	// PolicyVersion is the envelope policy version in force (for an
	// envelope change, the version it created).
	PolicyVersion int64
	// ServerTime is when the control plane minted the receipt; Log.Mint
	// sets it when it is zero.
	ServerTime time.Time

	// Subjects.
	WorkerID     string // "worker_id"
	NodeID       string // "node_id"
	JobID        string // "job_id"
	LeaseID      string // "lease_id"
	ArtifactID   string // "artifact_id"
	CredentialID string // "credential_id"
	PrincipalID  string // "principal_id"
	// Actor is who made the change: an operator's principal id, or
	// "system" for the maintainer.
	Actor string // "actor"
	// ProvisioningCredentialID is the credential a registration was
	// authorised by (the provisioning token's), where CredentialID is the
	// worker token it minted.
	ProvisioningCredentialID string // "provisioning_credential_id"

	// Jobs.
	JobType    string    // "job_type"
	Attempt    int64     // "attempt"
	LeaseEpoch int64     // "lease_epoch"
	StartedAt  time.Time // "started_at": when the worker accepted the job
	EndedAt    time.Time // "ended_at": when the job completed or failed
	// Outcome of a failure: OutcomeRequeued, OutcomeFailed or OutcomeCanceled.
	Outcome       string // "outcome"
	ErrorCode     string // "error_code"
	OutputURI     string // "output_uri"
	MetricsSHA256 string // "metrics_sha256": PayloadSHA256 of the metrics
	PayloadSHA256 string // "payload_sha256": PayloadSHA256 of a failure's or an audit event's payload
	// Charged says whether the attempt a job_completed or job_failed
	// receipt ends was billed: ChargedYes or ChargedNo.
	Charged string // "charged"

	// Money (job_charged). actual_hours is not a field: the bytes carry
	// Hours(ActualMS).
	GPUSKU     string // "gpu_sku"
	GPUCount   int64  // "gpu_count"
	RateMicros int64  // "rate_usd_per_gpu_hour", micro-USD per GPU-hour
	ActualMS   int64  // "actual_ms"
	CostMicros int64  // "actual_cost_usd", micro-USD

	// Artifacts.
	ArtifactType   string // "artifact_type"
	Name           string // "name"
	URI            string // "uri"
	ChecksumSHA256 string // "checksum_sha256"
	SizeBytes      int64  // "size_bytes"
	MetadataSHA256 string // "metadata_sha256": PayloadSHA256 of the metadata

	// Workers, credentials, envelope, audit.
	KeyID      string    // "key_id": the node key's id (base64url SHA-256 of the raw key)
	Reason     string    // "reason"
	Until      time.Time // "until": an activation's deadline
	Scopes     string    // "scopes": space-separated
	ExpiresAt  time.Time // "expires_at"
	EventType  string    // "event_type"
	OccurredAt time.Time // "occurred_at": the worker's time of an audit event
	// JobTypes and Tags are what an approval pins: sorted, space-separated.
	JobTypes string // "job_types"
	Tags     string // "tags"

	// A worker's capabilities before and after a worker_updated: job types
	// and tags sorted and space-separated, GPUs as sorted space-separated
	// "sku:vram_mb" entries (one per GPU); the new job types and tags are
	// JobTypes and Tags. An empty list, or a zero limit, is absent.
	OldJobTypes  string // "old_job_types"
	OldTags      string // "old_tags"
	GPUs         string // "gpus"
	OldGPUs      string // "old_gpus"
	MaxJobs      int64  // "max_jobs"
	OldMaxJobs   int64  // "old_max_jobs"
	MaxVRAMMB    int64  // "max_vram_mb"
	OldMaxVRAMMB int64  // "old_max_vram_mb"
}

type fieldType uint8

const (
	tString fieldType = iota // a non-empty valid UTF-8 string
	tInt                     // an integer, 0 to MaxInt
	tTime                    // a time, as timeLayout
	tMoney                   // micro-USD, as FormatMicros, not negative
	tSHA256                  // 64 lowercase hex digits
	tHours                   // Hours(ActualMS): no field of its own
)

type fieldDef struct {
	typ fieldType
	str func(*Receipt) *string
	num func(*Receipt) *int64
	tm  func(*Receipt) *time.Time
}

func strField(f func(*Receipt) *string) fieldDef     { return fieldDef{typ: tString, str: f} }
func hashField(f func(*Receipt) *string) fieldDef    { return fieldDef{typ: tSHA256, str: f} }
func intField(f func(*Receipt) *int64) fieldDef      { return fieldDef{typ: tInt, num: f} }
func moneyField(f func(*Receipt) *int64) fieldDef    { return fieldDef{typ: tMoney, num: f} }
func timeField(f func(*Receipt) *time.Time) fieldDef { return fieldDef{typ: tTime, tm: f} }

// fieldDefs are the kind-specific fields, by key. Read only.
var fieldDefs = map[string]fieldDef{
	"worker_id":             strField(func(r *Receipt) *string { return &r.WorkerID }),
	"node_id":               strField(func(r *Receipt) *string { return &r.NodeID }),
	"job_id":                strField(func(r *Receipt) *string { return &r.JobID }),
	"lease_id":              strField(func(r *Receipt) *string { return &r.LeaseID }),
	"artifact_id":           strField(func(r *Receipt) *string { return &r.ArtifactID }),
	"credential_id":         strField(func(r *Receipt) *string { return &r.CredentialID }),
	"principal_id":          strField(func(r *Receipt) *string { return &r.PrincipalID }),
	"actor":                 strField(func(r *Receipt) *string { return &r.Actor }),
	"job_type":              strField(func(r *Receipt) *string { return &r.JobType }),
	"attempt":               intField(func(r *Receipt) *int64 { return &r.Attempt }),
	"lease_epoch":           intField(func(r *Receipt) *int64 { return &r.LeaseEpoch }),
	"started_at":            timeField(func(r *Receipt) *time.Time { return &r.StartedAt }),
	"ended_at":              timeField(func(r *Receipt) *time.Time { return &r.EndedAt }),
	"outcome":               strField(func(r *Receipt) *string { return &r.Outcome }),
	"error_code":            strField(func(r *Receipt) *string { return &r.ErrorCode }),
	"charged":               strField(func(r *Receipt) *string { return &r.Charged }),
	"output_uri":            strField(func(r *Receipt) *string { return &r.OutputURI }),
	"metrics_sha256":        hashField(func(r *Receipt) *string { return &r.MetricsSHA256 }),
	"payload_sha256":        hashField(func(r *Receipt) *string { return &r.PayloadSHA256 }),
	"gpu_sku":               strField(func(r *Receipt) *string { return &r.GPUSKU }),
	"gpu_count":             intField(func(r *Receipt) *int64 { return &r.GPUCount }),
	"rate_usd_per_gpu_hour": moneyField(func(r *Receipt) *int64 { return &r.RateMicros }),
	"actual_ms":             intField(func(r *Receipt) *int64 { return &r.ActualMS }),
	"actual_hours":          {typ: tHours},
	"actual_cost_usd":       moneyField(func(r *Receipt) *int64 { return &r.CostMicros }),
	"artifact_type":         strField(func(r *Receipt) *string { return &r.ArtifactType }),
	"name":                  strField(func(r *Receipt) *string { return &r.Name }),
	"uri":                   strField(func(r *Receipt) *string { return &r.URI }),
	"checksum_sha256":       hashField(func(r *Receipt) *string { return &r.ChecksumSHA256 }),
	"size_bytes":            intField(func(r *Receipt) *int64 { return &r.SizeBytes }),
	"metadata_sha256":       hashField(func(r *Receipt) *string { return &r.MetadataSHA256 }),
	"key_id":                strField(func(r *Receipt) *string { return &r.KeyID }),
	"reason":                strField(func(r *Receipt) *string { return &r.Reason }),
	"until":                 timeField(func(r *Receipt) *time.Time { return &r.Until }),
	"scopes":                strField(func(r *Receipt) *string { return &r.Scopes }),
	"expires_at":            timeField(func(r *Receipt) *time.Time { return &r.ExpiresAt }),
	"event_type":            strField(func(r *Receipt) *string { return &r.EventType }),
	"occurred_at":           timeField(func(r *Receipt) *time.Time { return &r.OccurredAt }),
	"job_types":             strField(func(r *Receipt) *string { return &r.JobTypes }),
	"tags":                  strField(func(r *Receipt) *string { return &r.Tags }),

	// The credential a registration was authorised by.
	"provisioning_credential_id": strField(func(r *Receipt) *string { return &r.ProvisioningCredentialID }),

	// A worker's capabilities before and after (worker_updated).
	"old_job_types":   strField(func(r *Receipt) *string { return &r.OldJobTypes }),
	"old_tags":        strField(func(r *Receipt) *string { return &r.OldTags }),
	"gpus":            strField(func(r *Receipt) *string { return &r.GPUs }),
	"old_gpus":        strField(func(r *Receipt) *string { return &r.OldGPUs }),
	"max_jobs":        intField(func(r *Receipt) *int64 { return &r.MaxJobs }),
	"old_max_jobs":    intField(func(r *Receipt) *int64 { return &r.OldMaxJobs }),
	"max_vram_mb":     intField(func(r *Receipt) *int64 { return &r.MaxVRAMMB }),
	"old_max_vram_mb": intField(func(r *Receipt) *int64 { return &r.OldMaxVRAMMB }),
}

// kindSpec lists the fields a kind requires and those it allows.
type kindSpec struct {
	required []string
	optional []string
}

// foreignFields lists, by kind, in name order, the fields of fieldDefs
// that a receipt of the kind must leave unset: Encode checks these rather
// than build the kind's set of fields on every call. Read only.
var foreignFields = func() map[Kind][]string {
	out := make(map[Kind][]string, len(kindSpecs))
	for kind, spec := range kindSpecs {
		for k := range fieldDefs {
			if !slices.Contains(spec.required, k) && !slices.Contains(spec.optional, k) {
				out[kind] = append(out[kind], k)
			}
		}
		slices.Sort(out[kind])
	}
	return out
}()

// kindSpecs is the table the package documentation shows. Read only.
var kindSpecs = map[Kind]kindSpec{
	KindWorkerRegistered: {
		required: []string{"worker_id", "node_id", "key_id"},
		optional: []string{"credential_id", "provisioning_credential_id"},
	},
	KindArtifactReported: {
		// The checksum and size are optional, as the worker contract makes them.
		required: []string{"job_id", "worker_id", "lease_epoch", "artifact_id"},
		optional: []string{"checksum_sha256", "size_bytes", "lease_id", "artifact_type", "name", "uri", "metadata_sha256"},
	},
	KindJobCompleted: {
		required: []string{"job_id", "worker_id", "job_type", "lease_epoch", "attempt", "started_at", "ended_at"},
		// actual_ms, gpu_count and charged: the attempt's GPU time,
		// absent from receipts minted before they existed.
		optional: []string{"lease_id", "output_uri", "metrics_sha256", "actual_ms", "gpu_count", "charged"},
	},
	KindJobCharged: {
		required: []string{"job_id", "worker_id", "gpu_count", "rate_usd_per_gpu_hour", "started_at", "ended_at", "actual_ms", "actual_hours", "actual_cost_usd"},
		optional: []string{"lease_id", "gpu_sku"},
	},
	KindJobFailed: {
		required: []string{"job_id", "worker_id", "job_type", "lease_epoch", "attempt", "error_code", "outcome"},
		// actual_ms (absent when the lease was never accepted or ran
		// under a millisecond), gpu_count and charged: the attempt's GPU
		// time, absent from receipts minted before they existed.
		optional: []string{"lease_id", "started_at", "ended_at", "payload_sha256", "actual_ms", "gpu_count", "charged"},
	},
	KindEnvelopeActivated: {
		required: []string{"actor", "reason"},
		optional: []string{"until"},
	},
	KindEnvelopeDeactivated: {
		required: []string{"actor", "reason"},
	},
	KindCredentialMinted: {
		required: []string{"credential_id", "principal_id", "scopes"},
		optional: []string{"actor", "expires_at"},
	},
	KindCredentialRevoked: {
		required: []string{"credential_id"},
		optional: []string{"principal_id", "actor", "reason"},
	},
	KindPrincipalCreated: {
		// An operator principal created over the operator routes; name
		// is its name for people, absent when it has none.
		required: []string{"principal_id", "actor"},
		optional: []string{"name"},
	},
	KindWorkerBanned: {
		required: []string{"worker_id"},
		optional: []string{"node_id", "actor", "reason"},
	},
	KindWorkerUnbanned: {
		required: []string{"worker_id"},
		optional: []string{"node_id", "actor", "reason"},
	},
	KindWorkerRetired: {
		required: []string{"worker_id", "actor"},
		optional: []string{"node_id", "reason"},
	},
	KindWorkerApproved: {
		// job_types and tags are what the approval pins, absent when it
		// pins none.
		required: []string{"worker_id", "actor"},
		optional: []string{"node_id", "reason", "job_types", "tags"},
	},
	KindNodeAudit: {
		required: []string{"worker_id", "event_type", "occurred_at", "payload_sha256"},
		optional: []string{"node_id"},
	},
	KindJobRetried: {
		// error_code is the last error's code (absent for a job canceled
		// before any failure).
		required: []string{"job_id", "job_type", "actor"},
		optional: []string{"reason", "error_code"},
	},
	KindEnvelopeSafeTypesChanged: {
		// job_types and old_job_types: the safe types after and before,
		// sorted, space-separated, absent when none.
		required: []string{"actor"},
		optional: []string{"reason", "job_types", "old_job_types"},
	},
	KindWorkerUpdated: {
		// Each list or limit, old and new, is absent when empty or zero.
		required: []string{"worker_id"},
		optional: []string{"node_id", "old_job_types", "job_types", "old_tags", "tags", "old_gpus", "gpus",
			"old_max_jobs", "max_jobs", "old_max_vram_mb", "max_vram_mb"},
	},
}

// timeLayout is the one form of a time in canonical bytes.
const timeLayout = "2006-01-02T15:04:05.000000Z"

// FormatTime formats t as canonical bytes carry it: RFC 3339 in UTC with
// exactly six fractional digits.
func FormatTime(t time.Time) string { return t.UTC().Format(timeLayout) }

func utcMicros(t time.Time) time.Time {
	if t.IsZero() {
		return t
	}
	return t.UTC().Truncate(time.Microsecond)
}

func (r *Receipt) normalize() {
	r.ServerTime = utcMicros(r.ServerTime)
	for _, d := range fieldDefs {
		if d.typ == tTime {
			p := d.tm(r)
			*p = utcMicros(*p)
		}
	}
}

// isSet reports whether the field d of r is not zero.
func (d fieldDef) isSet(r *Receipt) bool {
	switch d.typ {
	case tString, tSHA256:
		return *d.str(r) != ""
	case tInt, tMoney:
		return *d.num(r) != 0
	case tTime:
		return !d.tm(r).IsZero()
	}
	return false
}

// Encode returns r's canonical bytes. It returns ErrInvalidArgument if a
// required field is missing, a field does not belong to r's kind or a
// value is out of range, and ErrInconsistent if fields disagree (see
// Check).
func (r *Receipt) Encode() ([]byte, error) {
	c := *r
	c.normalize()
	spec, ok := kindSpecs[c.Kind]
	if !ok {
		return nil, fmt.Errorf("%w: unknown kind %q", ErrInvalidArgument, c.Kind)
	}
	invalid := func(format string, args ...any) ([]byte, error) {
		return nil, fmt.Errorf("%w: %s receipt %s: %s", ErrInvalidArgument, c.Kind, c.ID, fmt.Sprintf(format, args...))
	}
	if c.ID == "" || !utf8.ValidString(c.ID) {
		return invalid("id must be non-empty UTF-8")
	}
	if c.PolicyVersion < 0 || c.PolicyVersion > MaxInt {
		return invalid("policy_version %d is out of range", c.PolicyVersion)
	}
	if err := checkTime(c.ServerTime); c.ServerTime.IsZero() || err != nil {
		return invalid("server_time must be set, in years 1 to 9999")
	}
	for _, k := range foreignFields[c.Kind] {
		if fieldDefs[k].isSet(&c) {
			return invalid("field %s does not belong to the kind", k)
		}
	}
	ms := make([]member, 0, 5+len(spec.required)+len(spec.optional))
	ms = append(ms,
		member{key: "v", isInt: true, num: 1},
		member{key: "kind", str: string(c.Kind)},
		member{key: "id", str: c.ID},
		member{key: "policy_version", isInt: true, num: c.PolicyVersion},
		member{key: "server_time", str: FormatTime(c.ServerTime)},
	)
	add := func(k string, required bool) error {
		d := fieldDefs[k]
		if d.typ != tHours && !d.isSet(&c) {
			if !required {
				return nil
			}
			if d.typ != tInt && d.typ != tMoney {
				return fmt.Errorf("field %s is required", k)
			}
		}
		m := member{key: k}
		switch d.typ {
		case tString:
			if m.str = *d.str(&c); !utf8.ValidString(m.str) {
				return fmt.Errorf("field %s is not valid UTF-8", k)
			}
		case tSHA256:
			if m.str = *d.str(&c); !isSHA256Hex(m.str) {
				return fmt.Errorf("field %s is not 64 lowercase hex digits", k)
			}
		case tInt:
			m.isInt, m.num = true, *d.num(&c)
			if m.num < 0 || m.num > MaxInt {
				return fmt.Errorf("field %s = %d is out of range", k, m.num)
			}
		case tMoney:
			v := *d.num(&c)
			if v < 0 {
				return fmt.Errorf("field %s = %d is negative", k, v)
			}
			m.str = FormatMicros(v)
		case tTime:
			t := *d.tm(&c)
			if err := checkTime(t); err != nil {
				return fmt.Errorf("field %s: %v", k, err)
			}
			m.str = FormatTime(t)
		case tHours:
			if c.ActualMS < 0 {
				return fmt.Errorf("actual_ms %d is negative", c.ActualMS)
			}
			m.str = Hours(c.ActualMS)
		}
		ms = append(ms, m)
		return nil
	}
	for _, k := range spec.required {
		if err := add(k, true); err != nil {
			return invalid("%v", err)
		}
	}
	for _, k := range spec.optional {
		if err := add(k, false); err != nil {
			return invalid("%v", err)
		}
	}
	if err := c.consistent(); err != nil {
		return nil, err
	}
	b := appendObject(nil, ms)
	if len(b) > MaxBodySize {
		return invalid("%d bytes is over the limit of %d", len(b), MaxBodySize)
	}
	return b, nil
}

// Check reports whether r can be encoded: ErrInvalidArgument or
// ErrInconsistent as Encode returns them. Beyond the form of each field,
// it checks that a job ended no earlier than it started, that a
// job_charged receipt's actual_ms is DurationMS(started_at, ended_at) and
// its actual_cost_usd is Cost(actual_ms, gpu_count, rate), and that a
// job_failed outcome is one of the Outcome constants.
func (r *Receipt) Check() error {
	_, err := r.Encode()
	return err
}

func (r *Receipt) consistent() error {
	bad := func(format string, args ...any) error {
		return fmt.Errorf("%w: %s receipt %s: %s", ErrInconsistent, r.Kind, r.ID, fmt.Sprintf(format, args...))
	}
	if !r.StartedAt.IsZero() && !r.EndedAt.IsZero() && r.EndedAt.Before(r.StartedAt) {
		return bad("ended_at %s is before started_at %s", FormatTime(r.EndedAt), FormatTime(r.StartedAt))
	}
	switch r.Kind {
	case KindJobCharged:
		ms, err := DurationMS(r.StartedAt, r.EndedAt)
		if err != nil {
			return bad("%v", err)
		}
		if ms != r.ActualMS {
			return bad("actual_ms %d is not the %d ms from started_at to ended_at", r.ActualMS, ms)
		}
		cost, err := Cost(r.ActualMS, r.GPUCount, r.RateMicros)
		if err != nil {
			return bad("%v", err)
		}
		if cost != r.CostMicros {
			return bad("actual_cost_usd %s is not %s, the cost of %d ms on %d GPUs at %s per GPU-hour",
				FormatMicros(r.CostMicros), FormatMicros(cost), r.ActualMS, r.GPUCount, FormatMicros(r.RateMicros))
		}
	case KindJobFailed:
		switch r.Outcome {
		case OutcomeRequeued, OutcomeFailed, OutcomeCanceled:
		default:
			return bad("outcome %q is not requeued, failed or canceled", r.Outcome)
		}
	}
	if r.Kind == KindJobCompleted || r.Kind == KindJobFailed {
		if r.Charged != "" && r.Charged != ChargedYes && r.Charged != ChargedNo {
			return bad("charged %q is not yes or no", r.Charged)
		}
		if r.ActualMS != 0 {
			// The attempt's GPU time runs from accept to its end.
			if r.StartedAt.IsZero() || r.EndedAt.IsZero() {
				return bad("actual_ms needs started_at and ended_at")
			}
			ms, err := DurationMS(r.StartedAt, r.EndedAt)
			if err != nil {
				return bad("%v", err)
			}
			if ms != r.ActualMS {
				return bad("actual_ms %d is not the %d ms from started_at to ended_at", r.ActualMS, ms)
			}
		}
	}
	return nil
}

func checkTime(t time.Time) error {
	if y := t.Year(); !t.IsZero() && (y < 1 || y > 9999) {
		return fmt.Errorf("year %d is outside 1 to 9999", y)
	}
	return nil
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

// Decode parses canonical bytes. Anything that Encode would not have
// written is rejected with ErrNotCanonical: other JSON (whitespace,
// floats, exponents, negative numbers, leading zeros, booleans, null,
// arrays, nested objects, duplicate or unsorted keys, other escapes),
// integers above MaxInt, invalid UTF-8, an unknown kind or version, an
// unknown or missing field, a value of the wrong form. Fields that
// disagree with each other give ErrInconsistent (see Check).
func Decode(body []byte) (*Receipt, error) {
	if len(body) > MaxBodySize {
		return nil, fmt.Errorf("%w: %d bytes is over the limit of %d", ErrNotCanonical, len(body), MaxBodySize)
	}
	ms, err := parseObject(body)
	if err != nil {
		return nil, err
	}
	byKey := make(map[string]member, len(ms))
	for _, m := range ms {
		byKey[m.key] = m
	}
	bad := func(format string, args ...any) (*Receipt, error) {
		return nil, fmt.Errorf("%w: %s", ErrNotCanonical, fmt.Sprintf(format, args...))
	}
	if v, ok := byKey["v"]; !ok || !v.isInt || v.num != 1 {
		return bad(`"v" must be 1`)
	}
	var r Receipt
	kind, ok := byKey["kind"]
	if !ok || kind.isInt {
		return bad(`"kind" is missing`)
	}
	r.Kind = Kind(kind.str)
	spec, ok := kindSpecs[r.Kind]
	if !ok {
		return bad("unknown kind %q", kind.str)
	}
	id, ok := byKey["id"]
	if !ok || id.isInt || id.str == "" {
		return bad(`"id" is missing`)
	}
	r.ID = id.str
	pv, ok := byKey["policy_version"]
	if !ok || !pv.isInt {
		return bad(`"policy_version" is missing or not an integer`)
	}
	r.PolicyVersion = pv.num
	st, ok := byKey["server_time"]
	if !ok || st.isInt {
		return bad(`"server_time" is missing`)
	}
	if r.ServerTime, err = parseTime(st.str); err != nil {
		return bad(`"server_time": %v`, err)
	}
	allowed := map[string]bool{"v": true, "kind": true, "id": true, "policy_version": true, "server_time": true}
	for _, k := range spec.required {
		if _, ok := byKey[k]; !ok {
			return bad("%s receipt: %q is missing", r.Kind, k)
		}
		allowed[k] = true
	}
	for _, k := range spec.optional {
		allowed[k] = true
	}
	var hours *member
	for _, m := range ms {
		if !allowed[m.key] {
			return bad("%s receipt: %q is not a field of the kind", r.Kind, m.key)
		}
		d, ok := fieldDefs[m.key]
		if !ok {
			continue // one of the common fields, read above
		}
		if m.isInt != (d.typ == tInt) {
			return bad("%q has the wrong type", m.key)
		}
		switch d.typ {
		case tString:
			if m.str == "" {
				return bad("%q is empty (an optional field is left out, never empty)", m.key)
			}
			*d.str(&r) = m.str
		case tSHA256:
			if !isSHA256Hex(m.str) {
				return bad("%q is not 64 lowercase hex digits", m.key)
			}
			*d.str(&r) = m.str
		case tInt:
			*d.num(&r) = m.num
		case tMoney:
			v, err := ParseMicros(m.str)
			if err != nil || v < 0 {
				return bad("%q is not a non-negative amount with six decimals", m.key)
			}
			*d.num(&r) = v
		case tTime:
			t, err := parseTime(m.str)
			if err != nil {
				return bad("%q: %v", m.key, err)
			}
			*d.tm(&r) = t
		case tHours:
			hours = &m
		}
	}
	if err := r.consistent(); err != nil {
		return nil, err
	}
	if hours != nil && hours.str != Hours(r.ActualMS) {
		return nil, fmt.Errorf("%w: %s receipt %s: actual_hours %q is not %q, the hours of %d ms",
			ErrInconsistent, r.Kind, r.ID, hours.str, Hours(r.ActualMS), r.ActualMS)
	}
	again, err := r.Encode()
	if err != nil {
		if errors.Is(err, ErrInconsistent) {
			return nil, err
		}
		return nil, fmt.Errorf("%w: %s", ErrNotCanonical, strings.TrimPrefix(err.Error(), ErrInvalidArgument.Error()+": "))
	}
	if !bytes.Equal(again, body) {
		return bad("%s receipt %s is not in canonical form (key order, escapes or empty optional fields)", r.Kind, r.ID)
	}
	return &r, nil
}

func parseTime(s string) (time.Time, error) {
	t, err := time.Parse(timeLayout, s)
	if err != nil || FormatTime(t) != s {
		return time.Time{}, fmt.Errorf("%q is not a UTC time with six fractional digits", s)
	}
	return t, nil
}

// PayloadSHA256 returns the SHA-256, in lowercase hex, of a free-form
// JSON payload (metrics, a failure's or an audit event's payload), which
// receipts carry instead of the payload. The hash is over the payload's
// bytes with insignificant whitespace removed (json.Compact), so that
// whoever holds the payload can check it against the receipt whatever its
// indentation. An empty payload is hashed as null. It returns
// ErrInvalidArgument if the payload is not valid JSON.
func PayloadSHA256(payload json.RawMessage) (string, error) {
	if len(bytes.TrimSpace(payload)) == 0 {
		payload = json.RawMessage("null")
	}
	var buf bytes.Buffer
	if err := json.Compact(&buf, payload); err != nil {
		return "", fmt.Errorf("%w: payload is not valid JSON: %v", ErrInvalidArgument, err)
	}
	sum := sha256.Sum256(buf.Bytes())
	return hex.EncodeToString(sum[:]), nil
}

// String returns the receipt's canonical bytes, or a description of why
// it has none, for logs and test failures.
func (r *Receipt) String() string {
	b, err := r.Encode()
	if err != nil {
		return fmt.Sprintf("invalid receipt (%v)", strings.TrimPrefix(err.Error(), "receipts: "))
	}
	return string(b)
}
