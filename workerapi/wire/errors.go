package wire

import (
	"errors"
	"fmt"
	"net/http"
	"strings"
	"time"
)

// ErrorBody is every error answer.
type ErrorBody struct {
	Error ErrorDetail `json:"error"`
}

// ErrorDetail says what went wrong.
type ErrorDetail struct {
	Code       string    `json:"code"`
	Message    string    `json:"message"`
	ServerTime time.Time `json:"server_time"`
}

// Error codes of PROTOCOL.md.
const (
	CodeInvalidRequest       = "invalid_request"
	CodeMissingCredential    = "missing_credential"
	CodeInvalidToken         = "invalid_token"
	CodeTokenExpired         = "token_expired"
	CodeTokenRevoked         = "token_revoked"
	CodeTokenExhausted       = "token_exhausted"
	CodeMissingSignature     = "missing_signature"
	CodeMalformedSignature   = "malformed_signature"
	CodeBadDigest            = "bad_digest"
	CodeBadSignature         = "bad_signature"
	CodeStaleTimestamp       = "stale_timestamp"
	CodeReplayedNonce        = "replayed_nonce"
	CodeInsufficientScope    = "insufficient_scope"
	CodeWorkerBanned         = "worker_banned"
	CodeBlockedByEnvelope    = "blocked_by_envelope"
	CodeNotFound             = "not_found"
	CodeMethodNotAllowed     = "method_not_allowed"
	CodeLeaseLost            = "lease_lost"
	CodeInvalidTransition    = "invalid_transition"
	CodeJobCanceled          = "job_canceled"
	CodeNodeExists           = "node_exists"
	CodePrincipalExists      = "principal_exists"
	CodePayloadTooLarge      = "payload_too_large"
	CodeUnsupportedMediaType = "unsupported_media_type"
	CodeRateLimited          = "rate_limited"
	CodeUnavailable          = "unavailable"
	// CodeIdempotencyMismatch (422): a request_id, idempotency_key or
	// lease token was sent before with another body: it names a
	// request already answered, which this one is not a repeat of.
	CodeIdempotencyMismatch = "idempotency_mismatch"

	// Artifact bytes (PROTOCOL.md §5.19 to §5.21).

	// CodeArtifactStorageOff (404): the server stores no artifact bytes;
	// report the artifact as metadata only.
	CodeArtifactStorageOff = "artifact_storage_off"
	// CodeArtifactTooLarge (413): size_bytes is over the bytes per
	// artifact; the message names the limit.
	CodeArtifactTooLarge = "artifact_too_large"
	// CodeTooManyArtifacts (409): the job has its artifacts per job.
	CodeTooManyArtifacts = "too_many_artifacts"
	// CodeTooManyUploads (429): the worker streams its concurrent parts
	// per worker already; retry after Retry-After.
	CodeTooManyUploads = "too_many_uploads"
	// CodeUploadInvalid (409): the upload_id is not one this server
	// issued for this job and lease.
	CodeUploadInvalid = "upload_invalid"
	// CodeUploadExpired (409): the upload_id's time ran out; ask again.
	CodeUploadExpired = "upload_expired"
	// CodeUploadOutOfOrder (409): part n arrived before part n-1 was
	// stored.
	CodeUploadOutOfOrder = "upload_out_of_order"
	// CodeUploadIncomplete (409): finishing an upload whose part the
	// message names is not stored.
	CodeUploadIncomplete = "upload_incomplete"
	// CodeArtifactMismatch (422): the stored bytes are not the declared
	// size or sha256; they are deleted and nothing is recorded.
	CodeArtifactMismatch = "artifact_mismatch"

	// Quotas of what a node writes that is never deleted (PROTOCOL.md
	// §5.13).

	// CodeQuotaExceeded (429): the node has minted its audit receipts
	// for the hour; retry after Retry-After, when the hour ends.
	CodeQuotaExceeded = "quota_exceeded"
	// CodeApprovalPending (403): the node awaits an operator's approval,
	// and a pending node mints no audit receipt.
	CodeApprovalPending = "approval_pending"
)

// The shares of what every caller shares (PROTOCOL.md §3, "Shares").
const (
	// CodeTooManyLongPolls (429): the node has its long-polls open at
	// once already; retry after Retry-After, or once one of them ends.
	CodeTooManyLongPolls = "too_many_long_polls"
	// CodeServerBusy (503): the server's budget of request-body bytes,
	// or of long-polls, is spent; nothing was done: retry after
	// Retry-After.
	CodeServerBusy = "server_busy"
)

// Error is an error answer of a route as a Go error: what a client of
// the routes returns for an answer that is not a success, so that its
// caller reads it with errors.As. Status is the HTTP status; Code,
// Message and ServerTime are the ErrorBody's, Code "" when the body was
// not one (say, a proxy's page, when Message says so).
type Error struct {
	Status     int
	Code       string
	Message    string
	ServerTime time.Time
	// Route is the request's method and path, such as
	// "GET /operator/jobs/job_1".
	Route string
	// RequestID is the X-Request-Id the server answered with, "" when
	// none.
	RequestID string
	// RetryAfter is the server's Retry-After (sent with 429 and 503), or 0.
	RetryAfter time.Duration
}

// Error says the route, the status, the code and the message.
func (e *Error) Error() string {
	code := e.Code
	if code == "" {
		code = strings.ToLower(http.StatusText(e.Status))
	}
	msg := fmt.Sprintf("%s: %d %s", e.Route, e.Status, code)
	if e.Message != "" {
		msg += ": " + e.Message
	}
	return msg
}

// Temporary reports whether the same request may succeed later: a 5xx or
// 429 answer.
func (e *Error) Temporary() bool {
	return e.Status >= 500 || e.Status == http.StatusTooManyRequests
}

// IsCode reports whether err is, or wraps, an *Error with code.
func IsCode(err error, code string) bool {
	var e *Error
	return errors.As(err, &e) && e.Code == code
}
