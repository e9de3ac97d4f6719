package wire

// Limits on what one request may carry, so that every request costs the
// control plane a bounded amount of work, storage and answer bytes.
// PROTOCOL.md gives each with the route it applies to. A body over a
// limit is refused, before anything is stored, with 400 invalid_request
// and a message that names the field and the limit; a signature field
// over MaxSignatureFieldBytes is 401 malformed_signature. Lengths are in
// bytes of UTF-8, not characters.
const (
	// MaxSignatureFieldBytes bounds each of the Signature,
	// Signature-Input and Content-Digest fields of a worker request (its
	// field lines combined, as HTTP combines them: joined by ", ").
	MaxSignatureFieldBytes = 8 << 10

	// MaxGPUs bounds capabilities.gpus of register and heartbeat, and
	// supported_gpu_skus of a lease request.
	MaxGPUs = 64
	// MaxJobTypes bounds capabilities.job_types of register and heartbeat,
	// and supported_job_types of a lease request.
	MaxJobTypes = 256
	// MaxTags bounds the tags of register, and requirements.tags of POST
	// /operator/jobs; MaxTagBytes each tag. A job's tags must also be
	// non-empty UTF-8 without whitespace or control characters.
	MaxTags     = 64
	MaxTagBytes = 128
	// MaxNameBytes bounds every name-like string a worker sends: node_id,
	// name, hostname, role and version of register; each GPU sku; each id
	// of current_jobs; a status event's event_type; an artifact's
	// artifact_type and name; a failure's error_code; an audit event's
	// event_type. The operator's requirements.gpu_sku of POST
	// /operator/jobs is bounded by it too.
	MaxNameBytes = 255
	// MaxJobTypeBytes bounds a job type: each of capabilities.job_types
	// and supported_job_types, and the job_type of POST /operator/jobs
	// (no job of a longer type can be queued).
	MaxJobTypeBytes = 128
	// MaxURIBytes bounds endpoint_url of register, an artifact's uri and a
	// completion's output_uri.
	MaxURIBytes = 2048
	// MaxUploadIDBytes bounds an upload_id (UploadResponse.UploadID) a
	// worker sends back.
	MaxUploadIDBytes = 1024
	// MaxMessageBytes bounds free text a worker sends: a status event's
	// or a log entry's message, a completion's final_message, a failure's
	// message, a release's reason.
	MaxMessageBytes = 16 << 10
	// MaxPayloadBytes bounds each JSON object a worker sends to be kept:
	// a status event's or a log entry's payload, a failure's payload, an
	// artifact's metadata and a completion's metrics (as MaxMetricsBytes
	// bounds a heartbeat's metrics).
	MaxPayloadBytes = 16 << 10
	// MaxLogEntries bounds the entries of one logs request.
	MaxLogEntries = 1000
	// MaxBatchComplete bounds the completions of one batch complete
	// (POST /workers/jobs/complete); it is checked before any of them is
	// looked at. Each completion is bounded as a complete's body is, and
	// its job_id by MaxNameBytes.
	MaxBatchComplete = 100
	// MaxBatchDispatch bounds the jobs of one batch dispatch (POST
	// /operator/jobs/batch); each is bounded as POST /operator/jobs's
	// body is, and all of them by the body limit.
	MaxBatchDispatch = 100
	// MaxCurrentJobs bounds current_jobs of a heartbeat, a registration
	// and a start (POST /workers/start): above the live
	// leases a worker may hold (16 unless the host configures more), so a
	// node names every job it holds in one heartbeat.
	MaxCurrentJobs = 256

	// MaxReasonBytes bounds the reason an operator gives to ban, unban,
	// revoke, activate and deactivate.
	MaxReasonBytes = 1024
	// MaxJobArtifacts bounds the artifacts GET /operator/jobs/{id}
	// carries; the rest are paged with GET /operator/artifacts?job_id=.
	MaxJobArtifacts = 100

	// MaxPageBytes bounds, roughly, the bytes of the items of one page of
	// an operator read (the events of GET /operator/jobs/{id}, and the
	// lists of jobs, artifacts and workers): a page ends early, with its
	// next cursor set, once its items reach this size. A page always
	// holds at least one item.
	MaxPageBytes = 1 << 20

	// MinIdempotencyKeyBytes and MaxIdempotencyKeyBytes bound a lease's
	// request_id and the idempotency_key of an artifact or audit report,
	// which hold only the characters [A-Za-z0-9._~-].
	MinIdempotencyKeyBytes = 16
	MaxIdempotencyKeyBytes = 128
)
