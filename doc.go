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
//   - credential: scoped credentials (planned).
//   - replay: signed timestamps and single-use nonces (planned).
//   - envelope: safety gating of blocked job types (planned).
//   - receipts: verifiable receipts and server-side pricing (planned).
//
// [github.com/nodelane/nodelane/bunstore] implements every Store on one
// bun database, SQLite (pure Go, the embedded default) or PostgreSQL
// (several control-plane replicas share one).
//
// # Guarantees
//
// A job never has two live leases, on any store. Every write under a lease
// is fenced by its token and epoch, so a worker whose lease has passed to
// another can never complete it. Times are kept in UTC microseconds so that
// every store round-trips them exactly.
package nodelane
