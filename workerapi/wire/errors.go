package wire

import "time"

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
)
