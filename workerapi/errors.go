package workerapi

import (
	"errors"
	"net/http"

	"github.com/nodelane/nodelane/credential"
	"github.com/nodelane/nodelane/envelope"
	"github.com/nodelane/nodelane/lease"
	"github.com/nodelane/nodelane/receipts"
	"github.com/nodelane/nodelane/replay"
	"github.com/nodelane/nodelane/workerapi/wire"
)

// Errors of workerapi's own.
var (
	// ErrInvalidRequest means the body is malformed, of the wrong type, or misses
	// a required field.
	ErrInvalidRequest = errors.New("invalid request")
	// ErrNodeExists means the node id is registered with another key.
	ErrNodeExists = errors.New("node registered with another key")
	// ErrPrincipalExists means a principal with that id exists already.
	ErrPrincipalExists = errors.New("principal exists")
	// ErrNotFound means there is no such route, job, worker or receipt.
	ErrNotFound = errors.New("not found")
	// ErrMethodNotAllowed means the route exists, but not for this method.
	ErrMethodNotAllowed = errors.New("method not allowed")
	// ErrPayloadTooLarge means the body is over Config.BodyLimit.
	ErrPayloadTooLarge = errors.New("payload too large")
	// ErrUnsupportedMediaType means the body is not application/json.
	ErrUnsupportedMediaType = errors.New("content type must be application/json")
	// ErrIdempotencyMismatch means a request_id, idempotency_key or lease
	// token names a request answered before, with another body.
	ErrIdempotencyMismatch = errors.New("the key was used before with another body")
	// ErrOutcomeUnknown means the request's transaction was sent to commit
	// and no store can tell whether it did: repeating the request tells.
	ErrOutcomeUnknown = errors.New("a store cannot answer; the request may have been accepted: repeat it to learn its outcome")

	// ErrArtifactStorageOff means the Server keeps no artifact bytes
	// (Config.Artifacts.Store is nil).
	ErrArtifactStorageOff = errors.New("artifact storage is off: report the artifact as metadata only")
	// ErrArtifactTooLarge means an upload's size is over
	// Config.Artifacts.MaxBytes.
	ErrArtifactTooLarge = errors.New("artifact too large")
	// ErrTooManyArtifacts means the job has Config.Artifacts.MaxPerJob
	// artifacts already.
	ErrTooManyArtifacts = errors.New("too many artifacts")
	// ErrTooManyUploads means the worker streams
	// Config.Artifacts.MaxUploadsPerWorker parts already.
	ErrTooManyUploads = errors.New("too many uploads at once")
	// ErrUploadInvalid means an upload_id is not one this control plane
	// issued for the job and its lease, or is finished already.
	ErrUploadInvalid = errors.New("invalid upload")
	// ErrUploadExpired means an upload_id's time ran out.
	ErrUploadExpired = errors.New("upload expired")
	// ErrUploadOutOfOrder means part n came before part n-1 was stored.
	ErrUploadOutOfOrder = errors.New("upload part out of order")
	// ErrUploadIncomplete means an upload was finished before all its
	// parts were stored.
	ErrUploadIncomplete = errors.New("upload incomplete")
	// ErrArtifactMismatch means the stored bytes are not the size or the
	// sha256 declared: they were deleted, and nothing was recorded.
	ErrArtifactMismatch = errors.New("artifact mismatch")
	// ErrApprovalPending means the node awaits an operator's approval,
	// and the route is closed to it until then (403 approval_pending).
	ErrApprovalPending = errors.New("the node awaits an operator's approval")
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
	{ErrInvalidRequest, status{http.StatusBadRequest, wire.CodeInvalidRequest}},
	{lease.ErrMalformedToken, status{http.StatusBadRequest, wire.CodeInvalidRequest}},
	{lease.ErrInvalidArgument, status{http.StatusBadRequest, wire.CodeInvalidRequest}},
	{credential.ErrInvalidArgument, status{http.StatusBadRequest, wire.CodeInvalidRequest}},
	{envelope.ErrInvalidArgument, status{http.StatusBadRequest, wire.CodeInvalidRequest}},
	{receipts.ErrInvalidArgument, status{http.StatusBadRequest, wire.CodeInvalidRequest}},
	{credential.ErrMissingCredential, status{http.StatusUnauthorized, wire.CodeMissingCredential}},
	{credential.ErrInvalidToken, status{http.StatusUnauthorized, wire.CodeInvalidToken}},
	{credential.ErrExpired, status{http.StatusUnauthorized, wire.CodeTokenExpired}},
	{credential.ErrRevoked, status{http.StatusUnauthorized, wire.CodeTokenRevoked}},
	{credential.ErrExhausted, status{http.StatusUnauthorized, wire.CodeTokenExhausted}},
	{replay.ErrMissingSignature, status{http.StatusUnauthorized, wire.CodeMissingSignature}},
	{replay.ErrMalformedSignature, status{http.StatusUnauthorized, wire.CodeMalformedSignature}},
	{replay.ErrBadDigest, status{http.StatusUnauthorized, wire.CodeBadDigest}},
	{replay.ErrBadSignature, status{http.StatusUnauthorized, wire.CodeBadSignature}},
	{replay.ErrStaleTimestamp, status{http.StatusUnauthorized, wire.CodeStaleTimestamp}},
	{replay.ErrReplayedNonce, status{http.StatusUnauthorized, wire.CodeReplayedNonce}},
	{credential.ErrInsufficientScope, status{http.StatusForbidden, wire.CodeInsufficientScope}},
	{credential.ErrBanned, status{http.StatusForbidden, wire.CodeWorkerBanned}},
	{ErrApprovalPending, status{http.StatusForbidden, wire.CodeApprovalPending}},
	{credential.ErrQuotaExceeded, status{http.StatusTooManyRequests, wire.CodeQuotaExceeded}},
	{envelope.ErrBlocked, status{http.StatusForbidden, wire.CodeBlockedByEnvelope}},
	{ErrArtifactStorageOff, status{http.StatusNotFound, wire.CodeArtifactStorageOff}},
	{ErrArtifactTooLarge, status{http.StatusRequestEntityTooLarge, wire.CodeArtifactTooLarge}},
	{ErrTooManyArtifacts, status{http.StatusConflict, wire.CodeTooManyArtifacts}},
	{ErrTooManyUploads, status{http.StatusTooManyRequests, wire.CodeTooManyUploads}},
	{ErrTooManyLongPolls, status{http.StatusTooManyRequests, wire.CodeTooManyLongPolls}},
	{ErrServerBusy, status{http.StatusServiceUnavailable, wire.CodeServerBusy}},
	{ErrUploadInvalid, status{http.StatusConflict, wire.CodeUploadInvalid}},
	{ErrUploadExpired, status{http.StatusConflict, wire.CodeUploadExpired}},
	{ErrUploadOutOfOrder, status{http.StatusConflict, wire.CodeUploadOutOfOrder}},
	{ErrUploadIncomplete, status{http.StatusConflict, wire.CodeUploadIncomplete}},
	{ErrArtifactMismatch, status{http.StatusUnprocessableEntity, wire.CodeArtifactMismatch}},
	{ErrNotFound, status{http.StatusNotFound, wire.CodeNotFound}},
	{lease.ErrNotFound, status{http.StatusNotFound, wire.CodeNotFound}},
	{credential.ErrNotFound, status{http.StatusNotFound, wire.CodeNotFound}},
	{receipts.ErrNotFound, status{http.StatusNotFound, wire.CodeNotFound}},
	{ErrMethodNotAllowed, status{http.StatusMethodNotAllowed, wire.CodeMethodNotAllowed}},
	// Complete after a cancel request: the one refusal that changes
	// state, since the job ends canceled (see complete).
	{lease.ErrCanceled, status{http.StatusConflict, wire.CodeJobCanceled}},
	{lease.ErrLeaseLost, status{http.StatusConflict, wire.CodeLeaseLost}},
	{lease.ErrInvalidTransition, status{http.StatusConflict, wire.CodeInvalidTransition}},
	{ErrNodeExists, status{http.StatusConflict, wire.CodeNodeExists}},
	{ErrPrincipalExists, status{http.StatusConflict, wire.CodePrincipalExists}},
	{ErrIdempotencyMismatch, status{http.StatusUnprocessableEntity, wire.CodeIdempotencyMismatch}},
	{ErrOutcomeUnknown, status{http.StatusServiceUnavailable, wire.CodeUnavailable}},
	{ErrPayloadTooLarge, status{http.StatusRequestEntityTooLarge, wire.CodePayloadTooLarge}},
	{ErrUnsupportedMediaType, status{http.StatusUnsupportedMediaType, wire.CodeUnsupportedMediaType}},
	{replay.ErrQuota, status{http.StatusTooManyRequests, wire.CodeRateLimited}},
	{replay.ErrUnavailable, status{http.StatusServiceUnavailable, wire.CodeUnavailable}},
	// The database aborted the request's transaction (a deadlock, a
	// serialization failure): nothing was kept, and the client's retry, a
	// new signed request, runs it again whole.
	{lease.ErrAborted, status{http.StatusServiceUnavailable, wire.CodeUnavailable}},
	{credential.ErrAborted, status{http.StatusServiceUnavailable, wire.CodeUnavailable}},
	{envelope.ErrAborted, status{http.StatusServiceUnavailable, wire.CodeUnavailable}},
	{receipts.ErrAborted, status{http.StatusServiceUnavailable, wire.CodeUnavailable}},
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
	return status{http.StatusServiceUnavailable, wire.CodeUnavailable}
}
