package workerapi

import (
	"encoding/json"
	"fmt"
	"net/http"

	"github.com/nodelane/nodelane/lease"
	"github.com/nodelane/nodelane/replay"
	"github.com/nodelane/nodelane/workerapi/wire"
)

// Bounded cost for every request (PROTOCOL.md §3 and the limits of §5):
// the limits of wire/limits.go are checked as a body is decoded, before
// any store is asked, so that no request stores, or makes the control
// plane compute or answer, more than they allow. Each refusal is 400
// invalid_request naming the field and the limit.

// checkLimits checks the body v that decode filled against the limits of
// its route. Bodies without a limit of their own pass.
func checkLimits(v any) error {
	switch r := v.(type) {
	case *wire.RegisterRequest:
		return checkRegister(r)
	case *wire.HeartbeatRequest:
		return checkHeartbeat(r)
	case *wire.StartRequest:
		return checkStart(r)
	case *wire.SignalsRequest:
		return firstError(
			checkList("current_jobs", r.CurrentJobs, wire.MaxCurrentJobs, wire.MaxNameBytes),
			checkList("known_cancels", r.KnownCancels, wire.MaxCurrentJobs, wire.MaxNameBytes),
		)
	case *leaseBody:
		return firstError(
			checkList("supported_job_types", r.SupportedJobTypes, wire.MaxJobTypes, wire.MaxJobTypeBytes),
			checkList("supported_gpu_skus", r.SupportedGPUSKUs, wire.MaxGPUs, wire.MaxNameBytes),
			checkKey("request_id", r.RequestID),
		)
	case *wire.StatusRequest:
		return firstError(
			checkText("event_type", r.EventType, wire.MaxNameBytes),
			checkText("message", r.Message, wire.MaxMessageBytes),
			checkObject("payload", r.Payload),
			checkKey("idempotency_key", r.IdempotencyKey),
		)
	case *wire.LogsRequest:
		return checkLogs(r)
	case *wire.ArtifactRequest:
		return firstError(
			checkText("artifact_type", r.ArtifactType, wire.MaxNameBytes),
			checkText("name", r.Name, wire.MaxNameBytes),
			checkText("uri", r.URI, wire.MaxURIBytes),
			checkObject("metadata", r.Metadata),
			checkKey("idempotency_key", r.IdempotencyKey),
			checkText("upload_id", r.UploadID, wire.MaxUploadIDBytes),
		)
	case *wire.UploadRequest:
		return firstError(
			checkText("artifact_type", r.ArtifactType, wire.MaxNameBytes),
			checkText("name", r.Name, wire.MaxNameBytes),
			checkKey("idempotency_key", r.IdempotencyKey),
		)
	case *wire.CompleteRequest:
		return firstError(
			checkOptional("output_uri", r.OutputURI, wire.MaxURIBytes),
			checkOptional("final_message", r.FinalMessage, wire.MaxMessageBytes),
			checkObject("metrics", r.Metrics),
		)
	case *wire.FailRequest:
		return firstError(
			checkText("error_code", r.ErrorCode, wire.MaxNameBytes),
			checkText("message", r.Message, wire.MaxMessageBytes),
			checkObject("payload", r.Payload),
		)
	case *wire.ReleaseRequest:
		return checkText("reason", r.Reason, wire.MaxMessageBytes)
	case *wire.AuditRequest:
		if err := checkKey("idempotency_key", r.IdempotencyKey); err != nil {
			return err
		}
		// The count is checked by the route (wire.MaxAuditEvents); only
		// the payloads' hashes are kept.
		if len(r.Events) <= wire.MaxAuditEvents {
			for i, e := range r.Events {
				if err := checkText(fmt.Sprintf("events[%d].event_type", i), e.EventType, wire.MaxNameBytes); err != nil {
					return err
				}
			}
		}
	case *wire.ReasonRequest:
		return checkText("reason", r.Reason, wire.MaxReasonBytes)
	case *wire.ActivateRequest:
		return checkText("reason", r.Reason, wire.MaxReasonBytes)
	case *wire.SafeTypesRequest:
		return checkText("reason", r.Reason, wire.MaxReasonBytes)
	case *wire.DispatchRequest:
		// Explaining a job's leasability matches it against every worker.
		return firstError(
			checkText("job_type", r.JobType, wire.MaxJobTypeBytes),
			checkText("requirements.gpu_sku", r.Requirements.GPUSKU, wire.MaxNameBytes),
			checkTags("requirements.tags", r.Requirements.Tags),
		)
	}
	return nil
}

func checkRegister(r *wire.RegisterRequest) error {
	if err := firstError(
		checkText("node_id", r.NodeID, wire.MaxNameBytes),
		checkText("name", r.Name, wire.MaxNameBytes),
		checkText("hostname", r.Hostname, wire.MaxNameBytes),
		checkText("role", r.Role, wire.MaxNameBytes),
		checkText("version", r.Version, wire.MaxNameBytes),
		checkOptional("endpoint_url", r.EndpointURL, wire.MaxURIBytes),
		checkTags("tags", r.Tags),
		checkHeld(r.CurrentJobs),
	); err != nil {
		return err
	}
	return checkCapabilities("capabilities", &r.Capabilities)
}

// checkStart bounds a start as a registration is bounded.
func checkStart(r *wire.StartRequest) error {
	if err := firstError(
		checkText("name", r.Name, wire.MaxNameBytes),
		checkText("hostname", r.Hostname, wire.MaxNameBytes),
		checkText("role", r.Role, wire.MaxNameBytes),
		checkText("version", r.Version, wire.MaxNameBytes),
		checkTags("tags", r.Tags),
		checkHeld(r.CurrentJobs),
	); err != nil {
		return err
	}
	return checkCapabilities("capabilities", &r.Capabilities)
}

// checkHeld bounds an optional current_jobs as a heartbeat's.
func checkHeld(jobs *[]string) error {
	if jobs == nil {
		return nil
	}
	return checkList("current_jobs", *jobs, wire.MaxCurrentJobs, wire.MaxNameBytes)
}

func checkHeartbeat(r *wire.HeartbeatRequest) error {
	if err := checkList("current_jobs", r.CurrentJobs, wire.MaxCurrentJobs, wire.MaxNameBytes); err != nil {
		return err
	}
	if r.Capabilities != nil {
		return checkCapabilities("capabilities", r.Capabilities)
	}
	return nil
}

// checkCapabilities bounds what every lease and every leasability check
// of a job iterates over: a node's GPUs and job types.
func checkCapabilities(field string, c *wire.Capabilities) error {
	if len(c.GPUs) > wire.MaxGPUs {
		return invalid("%s.gpus lists %d GPUs, over the limit of %d", field, len(c.GPUs), wire.MaxGPUs)
	}
	for i, g := range c.GPUs {
		if err := checkText(fmt.Sprintf("%s.gpus[%d].sku", field, i), g.SKU, wire.MaxNameBytes); err != nil {
			return err
		}
	}
	return checkList(field+".job_types", c.JobTypes, wire.MaxJobTypes, wire.MaxJobTypeBytes)
}

func checkLogs(r *wire.LogsRequest) error {
	if len(r.Entries) > wire.MaxLogEntries {
		return invalid("entries holds %d entries, over the limit of %d a request", len(r.Entries), wire.MaxLogEntries)
	}
	if err := firstError(
		checkOptional("message", r.Message, wire.MaxMessageBytes),
		checkObject("payload", r.Payload),
		checkKey("idempotency_key", r.IdempotencyKey),
	); err != nil {
		return err
	}
	for i, e := range r.Entries {
		if err := firstError(
			checkText(fmt.Sprintf("entries[%d].message", i), e.Message, wire.MaxMessageBytes),
			checkObject(fmt.Sprintf("entries[%d].payload", i), e.Payload),
		); err != nil {
			return err
		}
	}
	return nil
}

// checkTags checks tags, a node's or a job's: at most wire.MaxTags, each
// as wire.CheckTag says, the rules of an approval's pinned tags
// (approvalPins), so that a job names only tags an operator could pin.
func checkTags(field string, tags []string) error {
	if err := checkList(field, tags, wire.MaxTags, wire.MaxTagBytes); err != nil {
		return err
	}
	for i, t := range tags {
		if err := wire.CheckTag(t); err != nil {
			return invalid("%s[%d] %v", field, i, err)
		}
	}
	return nil
}

// checkText refuses a string over max bytes.
func checkText(field, s string, max int) error {
	if len(s) > max {
		return invalid("%s is %d bytes, over the limit of %d bytes", field, len(s), max)
	}
	return nil
}

func checkOptional(field string, s *string, max int) error {
	if s == nil {
		return nil
	}
	return checkText(field, *s, max)
}

// checkList refuses a list of more than maxItems strings, or one of them
// over maxBytes.
func checkList(field string, l []string, maxItems, maxBytes int) error {
	if len(l) > maxItems {
		return invalid("%s lists %d items, over the limit of %d", field, len(l), maxItems)
	}
	for i, s := range l {
		if err := checkText(fmt.Sprintf("%s[%d]", field, i), s, maxBytes); err != nil {
			return err
		}
	}
	return nil
}

// checkObject refuses a kept JSON value (payload, metadata, metrics) over
// wire.MaxPayloadBytes, as sent.
func checkObject(field string, raw json.RawMessage) error {
	if len(raw) > wire.MaxPayloadBytes {
		return invalid("%s is %d bytes, over the limit of %d bytes", field, len(raw), wire.MaxPayloadBytes)
	}
	return nil
}

func firstError(errs ...error) error {
	for _, err := range errs {
		if err != nil {
			return err
		}
	}
	return nil
}

// The signature fields a worker request carries.
var signatureFields = []string{"Signature-Input", "Signature", "Content-Digest"}

// checkSignatureFields checks what can be checked of a worker request's
// signature before its body is read: the three fields are present (401
// missing_signature), each within wire.MaxSignatureFieldBytes, its field
// lines combined, Signature and Signature-Input parse (without a member
// or parameter named twice) and hold the label's signature, and
// Content-Digest has one field line (401 malformed_signature). The
// verifier checks all of it again, with the rest, once the body is read.
func checkSignatureFields(h http.Header) error {
	for _, name := range signatureFields {
		lines := h.Values(name)
		if len(lines) == 0 {
			return fmt.Errorf("%w: request needs Signature, Signature-Input and Content-Digest", replay.ErrMissingSignature)
		}
		n := 2 * (len(lines) - 1) // the ", " that combine them
		for _, l := range lines {
			n += len(l)
		}
		if n > wire.MaxSignatureFieldBytes {
			return fmt.Errorf("%w: %s is %d bytes, over the limit of %d bytes", replay.ErrMalformedSignature, name, n, wire.MaxSignatureFieldBytes)
		}
	}
	if _, err := replay.ParseSignature(h, replay.Label); err != nil {
		return err
	}
	if cd := h.Values("Content-Digest"); len(cd) > 1 {
		return fmt.Errorf("%w: Content-Digest has %d field lines", replay.ErrMalformedSignature, len(cd))
	}
	return nil
}

// Operator reads are bounded in bytes as well as in items: a page ends
// early, with its cursor set, once its items reach wire.MaxPageBytes.

// itemOverhead is a generous estimate of what an item's JSON adds to the
// bytes of its variable fields: field names, ids, times, numbers.
const itemOverhead = 400

// fitPage keeps the items of a page, in order, while their sizes add up
// to at most wire.MaxPageBytes (and at least one item); cut reports that
// items were left out, so that the page's cursor must be set at the last
// item kept.
func fitPage[T any](items []T, size func(T) int) (kept []T, cut bool) {
	n := 0
	for i, it := range items {
		if n += size(it); n > wire.MaxPageBytes && i > 0 {
			return items[:i], true
		}
	}
	return items, false
}

func eventBytes(e *lease.Event) int {
	return itemOverhead + len(e.Type) + len(e.Message) + len(e.Payload)
}

func jobBytes(j *lease.Job) int {
	n := itemOverhead + len(j.Type) + len(j.Payload) + len(j.Requirements.GPUSKU)
	for _, t := range j.Requirements.Tags {
		n += len(t) + 4
	}
	if e := j.LastError; e != nil {
		n += len(e.Code) + len(e.Message) + len(e.Payload)
	}
	return n
}

func artifactBytes(a *lease.Artifact) int {
	return 2*itemOverhead + len(a.Type) + len(a.Name) + len(a.URI) + len(a.Metadata)
}

func workerBytes(w *lease.Worker) int {
	n := 2*itemOverhead + len(w.NodeID) + len(w.Name) + len(w.Hostname) + len(w.EndpointURL) + len(w.Role) + len(w.Version)
	for _, t := range w.Tags {
		n += len(t) + 4
	}
	for _, t := range w.Capabilities.JobTypes {
		n += len(t) + 4
	}
	for _, g := range w.Capabilities.GPUs {
		n += len(g.SKU) + 32
	}
	return n
}
