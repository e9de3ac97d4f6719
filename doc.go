// Package nodelane is an embeddable control plane for remote GPU worker
// nodes. A host Go service gives it a database and mounts its HTTP
// handlers; worker nodes, often behind NAT, never open a port: they call
// out over HTTPS to register, heartbeat, lease jobs, report progress, logs
// and artifacts, and complete or fail them.
//
// # Packages
//
// The core packages each do one thing behind a small Store interface, with
// a MemoryStore and a conformance suite:
//
//   - [github.com/nodelane/nodelane/lease]: the job lease state machine,
//     with fenced leases, expiry, retries and cancellation.
//   - [github.com/nodelane/nodelane/credential]: scoped credentials,
//     node public keys and bans.
//   - [github.com/nodelane/nodelane/replay]: RFC 9421 request signatures,
//     a timestamp window and single-use nonces.
//   - [github.com/nodelane/nodelane/envelope]: safety gating of blocked
//     job types until an operator activates the runtime.
//   - [github.com/nodelane/nodelane/receipts]: verifiable receipts in a
//     Merkle log with signed checkpoints, and server-side pricing.
//   - [github.com/nodelane/nodelane/fingerprint]: fingerprints of the
//     secrets replicas share, so that a replica with other secrets refuses
//     to start.
//
// [github.com/nodelane/nodelane/bunstore] implements every Store on one
// bun database, SQLite (pure Go, the embedded default) or PostgreSQL
// (several control-plane replicas share one).
//
// [github.com/nodelane/nodelane/workerapi] mounts it all as http.Handlers
// (the worker routes of the protocol and the operator routes) and gives
// workers a Go Client; cmd/ has a runnable server, worker and demo.
//
// # Guarantees
//
// A job never has two live leases, on any store. Every write under a lease
// is fenced by its token and epoch, so a worker whose lease has passed to
// another can never complete it. Times are kept in UTC microseconds so that
// every store round-trips them exactly.
package nodelane
