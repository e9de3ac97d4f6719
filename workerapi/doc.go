// Package workerapi mounts nodelane as http.Handlers in any Go service:
// the worker routes under /workers/ (PROTOCOL.md) and the operator routes
// under /operator/, relative to wherever the host mounts them.
//
// Every worker request is checked in the order PROTOCOL.md gives: framing
// headers (415, 413), credential (401), ban and scope (403), the
// signature fields' presence, size and syntax (401), all before a byte of
// the body is read; then the body (413), signature, digest, window and
// nonce (401), the body's fields within their limits (400,
// workerapi/wire/limits.go), then the operation. A request's
// state change, its nonce and its receipts commit in one transaction
// through the Transactor; once a signature has verified, its nonce is
// consumed whatever the outcome, so no request runs twice.
//
// workerapi declares the small interfaces it needs from storage
// (Transactor, Notifier) and never imports a storage adapter; bunstore
// implements them.
package workerapi
