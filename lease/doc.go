// Package lease is the job lease state machine of nodelane (PROTOCOL.md, section 6 "Jobs and leases").
//
// A job is queued, leased to one worker, accepted (running), and ends
// succeeded, failed or canceled:
//
//	queued -> leased -> running -> succeeded | failed | canceled
//	leased, running -> queued   (TTL or accept deadline passed, release, retryable failure)
//
// Every lease carries a new, strictly increasing epoch (the fencing token)
// and a fresh token (nll_...) that is shown once and stored only as its
// SHA-256. Every write under a lease names the job, the worker and the
// token; a token that is not the job's live lease gets ErrLeaseLost, so a
// worker whose lease passed to another can never complete, fail or log
// for the job again. Stores apply each transition only if the job's
// revision is the one the Manager read, so no two live leases ever exist
// on one job, on any store and across any number of replicas.
//
// Attempts: a job starts on attempt 1. Only a TTL expiry after accept or
// a retryable failure after accept uses an attempt; the job is then
// eligible again after an exponential backoff with jitter, or fails once
// MaxAttempts are used. A lease not accepted in time, a release, or a
// retryable failure before accept requeue at once and use none.
//
// The Manager holds the logic; a Store (MemoryStore here, bunstore for
// SQLite and PostgreSQL) keeps the records and passes the conformance
// suite in package leasetest.
package lease
