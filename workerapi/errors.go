package workerapi

import (
	"errors"
	"net/http"

	"github.com/nodelane/nodelane/credential"
	"github.com/nodelane/nodelane/envelope"
	"github.com/nodelane/nodelane/lease"
	"github.com/nodelane/nodelane/receipts"
	"github.com/nodelane/nodelane/replay"
)

// Error codes of PROTOCOL.md.
const (
	CodeInvalidRequest       = "invalid_request"
	CodeMissingCredential    = "missing_credential"
	CodeInvalidToken         = "invalid_token"
	CodeTokenExpired         = "token_expired"
	CodeTokenRevoked         = "token_revoked"
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
	CodeNodeExists           = "node_exists"
	CodePayloadTooLarge      = "payload_too_large"
	CodeUnsupportedMediaType = "unsupported_media_type"
	CodeRateLimited          = "rate_limited"
	CodeUnavailable          = "unavailable"
)

// Errors of workerapi's own.
var (
	// ErrInvalidRequest: the body is malformed, of the wrong type, or misses
	// a required field.
	ErrInvalidRequest = errors.New("invalid request")
	// ErrNodeExists: the node id is registered with another key.
	ErrNodeExists = errors.New("node registered with another key")
	// ErrNotFound: no such route, job, worker or receipt.
	ErrNotFound = errors.New("not found")
	// ErrMethodNotAllowed: the route exists, but not for this method.
	ErrMethodNotAllowed = errors.New("method not allowed")
	// ErrPayloadTooLarge: the body is over Config.BodyLimit.
	ErrPayloadTooLarge = errors.New("payload too large")
	// ErrUnsupportedMediaType: the body is not application/json.
	ErrUnsupportedMediaType = errors.New("content type must be application/json")
)

// status pairs an HTTP status with a PROTOCOL.md code.
type status struct {
	http int
	code string
}

// errorTable maps the cores' sentinel errors to statuses. It is the one
// place where errors meet HTTP; the first match wins, so more specific
// errors come first.
var errorTable = []struct {
	err error
	st  status
}{
	{ErrInvalidRequest, status{http.StatusBadRequest, CodeInvalidRequest}},
	{lease.ErrMalformedToken, status{http.StatusBadRequest, CodeInvalidRequest}},
	{lease.ErrInvalidArgument, status{http.StatusBadRequest, CodeInvalidRequest}},
	{credential.ErrInvalidArgument, status{http.StatusBadRequest, CodeInvalidRequest}},
	{envelope.ErrInvalidArgument, status{http.StatusBadRequest, CodeInvalidRequest}},
	{receipts.ErrInvalidArgument, status{http.StatusBadRequest, CodeInvalidRequest}},
	{credential.ErrMissingCredential, status{http.StatusUnauthorized, CodeMissingCredential}},
	{credential.ErrInvalidToken, status{http.StatusUnauthorized, CodeInvalidToken}},
	{credential.ErrExpired, status{http.StatusUnauthorized, CodeTokenExpired}},
	{credential.ErrRevoked, status{http.StatusUnauthorized, CodeTokenRevoked}},
	{replay.ErrMissingSignature, status{http.StatusUnauthorized, CodeMissingSignature}},
	{replay.ErrMalformedSignature, status{http.StatusUnauthorized, CodeMalformedSignature}},
	{replay.ErrBadDigest, status{http.StatusUnauthorized, CodeBadDigest}},
	{replay.ErrBadSignature, status{http.StatusUnauthorized, CodeBadSignature}},
	{replay.ErrStaleTimestamp, status{http.StatusUnauthorized, CodeStaleTimestamp}},
	{replay.ErrReplayedNonce, status{http.StatusUnauthorized, CodeReplayedNonce}},
	{credential.ErrInsufficientScope, status{http.StatusForbidden, CodeInsufficientScope}},
	{credential.ErrBanned, status{http.StatusForbidden, CodeWorkerBanned}},
	{envelope.ErrBlocked, status{http.StatusForbidden, CodeBlockedByEnvelope}},
	{ErrNotFound, status{http.StatusNotFound, CodeNotFound}},
	{lease.ErrNotFound, status{http.StatusNotFound, CodeNotFound}},
	{credential.ErrNotFound, status{http.StatusNotFound, CodeNotFound}},
	{receipts.ErrNotFound, status{http.StatusNotFound, CodeNotFound}},
	{ErrMethodNotAllowed, status{http.StatusMethodNotAllowed, CodeMethodNotAllowed}},
	{lease.ErrLeaseLost, status{http.StatusConflict, CodeLeaseLost}},
	{lease.ErrInvalidTransition, status{http.StatusConflict, CodeInvalidTransition}},
	{ErrNodeExists, status{http.StatusConflict, CodeNodeExists}},
	{ErrPayloadTooLarge, status{http.StatusRequestEntityTooLarge, CodePayloadTooLarge}},
	{ErrUnsupportedMediaType, status{http.StatusUnsupportedMediaType, CodeUnsupportedMediaType}},
	{replay.ErrQuota, status{http.StatusTooManyRequests, CodeRateLimited}},
	{replay.ErrUnavailable, status{http.StatusServiceUnavailable, CodeUnavailable}},
}

// statusOf maps err to its status. An error the table does not know is a
// store or infrastructure failure: 503, so that nothing is reported as
// accepted and the client retries.
func statusOf(err error) status {
	for _, e := range errorTable {
		if errors.Is(err, e.err) {
			return e.st
		}
	}
	return status{http.StatusServiceUnavailable, CodeUnavailable}
}
