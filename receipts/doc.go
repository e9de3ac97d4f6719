// Package receipts mints nodelane's verifiable receipts (PROTOCOL.md, sections 8 to 11): every
// consequential event (a worker registered, an artifact reported, a job
// completed, charged or failed, the envelope changed, a credential minted
// or revoked, a worker banned or retired, a node's audit event) leaves a receipt with
// canonical bytes in an append-only RFC 6962 Merkle log, whose signed
// checkpoints let a third party verify any receipt offline.
//
// # Minting and sequencing
//
// [Log.Mint] only writes the receipt, in the caller's transaction, so that
// it commits or rolls back with the change it records. A [Sequencer] gives
// minted receipts their log indices later, in mint order and in batches:
// each batch is one store transaction under a lock that admits one
// sequencer at a time across replicas, and only after it commits does the
// Sequencer sign a checkpoint for the new tree (Tessera's
// integrate-then-publish), so no signed checkpoint can ever be rolled
// back. A tree committed without its checkpoint (a crash between the two
// steps) is signed by the next run.
//
// # Canonical bytes
//
// A receipt's body is its canonical bytes: the leaf the log hashes
// (SHA-256 of 0x00 and the body, RFC 6962) and what the wire carries in
// base64. They are one JSON object (RFC 8259) under these rules, and
// [Decode] rejects with [ErrNotCanonical] any body that breaks one of
// them, by parsing strictly and then comparing the body with the
// re-encoding of what it parsed:
//
//   - The object is flat: every value is a string or an integer from 0 to
//     2^53-1 ([MaxInt]), written in decimal without sign or leading zero.
//     No fraction, exponent, true, false, null, array or nested object.
//   - Members are sorted by key in byte order, each key once, with no
//     whitespace anywhere and nothing after the closing brace.
//   - Strings are valid UTF-8, escaped as RFC 8785 (JCS) escapes them:
//     '"' and '\' as \" and \\; U+0008, U+0009, U+000A, U+000C, U+000D as
//     \b, \t, \n, \f, \r; the other code points below U+0020 as \u00xx
//     in lowercase hex; every other character, '/' and non-ASCII
//     included, as itself.
//   - Every body has "v": 1, "kind", "id", "policy_version" and
//     "server_time"; then the fields its kind requires, and those it
//     allows that are set, and no other. An optional field is absent,
//     never empty: "" or 0 is not written for it. String fields other
//     than optional ones are never empty.
//   - Times are RFC 3339 strings in UTC with exactly six fractional
//     digits: "2026-11-30T09:00:00.000000Z".
//   - Money is a string of USD with exactly six decimals, that is an
//     exact number of micro-USD ("0.000618" is 618 micro-USD); hours
//     likewise, rounded half up ("0.000343"); durations in milliseconds
//     are integers.
//   - Free-form payloads (metrics, a failure's payload, an audit event's
//     payload, artifact metadata) appear only as their SHA-256 in 64
//     lowercase hex digits ([PayloadSHA256]); so do artifact checksums.
//   - A body is at most 64 KiB ([MaxBodySize]).
//
// For example, a job_charged receipt (one line, broken here):
//
//	{"actual_cost_usd":"0.000618","actual_hours":"0.000343","actual_ms":1234,
//	"ended_at":"2026-11-30T09:00:01.234000Z","gpu_count":1,"gpu_sku":"rtx-4090",
//	"id":"rcp_0001","job_id":"job_1","kind":"job_charged","policy_version":3,
//	"rate_usd_per_gpu_hour":"1.802000","server_time":"2026-11-30T09:00:01.300000Z",
//	"started_at":"2026-11-30T09:00:00.000000Z","v":1,"worker_id":"wrk_1"}
//
// The kinds and their fields (required; [optional]):
//
//	worker_registered     worker_id node_id key_id [credential_id provisioning_credential_id]
//	artifact_reported     job_id worker_id lease_epoch artifact_id
//	                      [checksum_sha256 size_bytes lease_id artifact_type name uri metadata_sha256]
//	job_completed         job_id worker_id job_type lease_epoch attempt started_at ended_at
//	                      [lease_id output_uri metrics_sha256 actual_ms gpu_count charged]
//	job_charged           job_id worker_id gpu_count rate_usd_per_gpu_hour started_at ended_at
//	                      actual_ms actual_hours actual_cost_usd [lease_id gpu_sku]
//	job_failed            job_id worker_id job_type lease_epoch attempt error_code outcome
//	                      [lease_id started_at ended_at payload_sha256 actual_ms gpu_count charged]
//	envelope_activated    actor reason [until]
//	envelope_deactivated  actor reason
//	credential_minted     credential_id principal_id scopes [actor expires_at]
//	credential_revoked    credential_id [principal_id actor reason]
//	principal_created     principal_id actor [name]
//	worker_banned         worker_id [node_id actor reason]
//	worker_unbanned       worker_id [node_id actor reason]
//	worker_approved       worker_id actor [node_id reason job_types tags]
//	worker_retired        worker_id actor [node_id reason]
//	node_audit            worker_id event_type occurred_at payload_sha256 [node_id]
//	worker_updated        worker_id [node_id old_job_types job_types old_tags tags old_gpus gpus
//	                      old_max_jobs max_jobs old_max_vram_mb max_vram_mb]
//	job_retried           job_id job_type actor [reason error_code]
//	envelope_safe_types_changed
//	                      actor [reason job_types old_job_types]
//
// Fields must also agree ([ErrInconsistent] otherwise): ended_at is not
// before started_at; in job_charged, actual_ms is [DurationMS] of
// started_at and ended_at, actual_hours is [Hours] of actual_ms, and
// actual_cost_usd is [Cost] of actual_ms, gpu_count and the rate; a
// job_failed outcome is requeued, failed or canceled; in job_completed and
// job_failed, charged is "yes" or "no" ([ChargedYes], [ChargedNo]), and
// actual_ms, when present, is [DurationMS] of started_at and ended_at (both
// then required). actual_ms is absent, meaning 0, when the attempt was
// never accepted or ran under a millisecond; receipts minted before these
// three fields existed carry none of them and still verify.
//
// # Money
//
// Amounts are int64 micro-USD. [Cost] is ceil(ms × GPUs × rate per
// GPU-hour / 3,600,000) in 128-bit arithmetic, an error only if the cost
// itself overflows; [Prices] maps GPU SKUs to rates with a default.
//
// # Checkpoints and verification
//
// A checkpoint is a C2SP tlog-checkpoint body of exactly three lines
// (origin, tree size, base64 root hash; see [FormatCheckpoint]) signed as
// a golang.org/x/mod/sumdb/note with Ed25519. The verifier key string
// (name+hash+base64) is what the protocol calls receipt_public_key.
// [Verify] checks a receipt, its inclusion proof and a signed checkpoint
// with nothing else; a [Witness] follows checkpoints over time and
// rejects a rollback, a fork or a bad consistency proof.
//
// The Log and the Sequencer hold the logic; a [Store] (MemoryStore here,
// bunstore for SQLite and PostgreSQL) keeps receipts, stored hashes, the
// tree and checkpoints, and passes the conformance suite in package
// receiptstest.
package receipts
