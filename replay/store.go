package replay

import (
	"context"
	"errors"
	"time"
)

// Errors returned by the Verifier, and by a Store for the last four.
// Each matches one error code of PROTOCOL.md; the errors returned wrap
// them with detail, so callers test them with errors.Is.
var (
	// ErrMissingSignature means the request lacks Signature, Signature-Input or
	// Content-Digest (missing_signature).
	ErrMissingSignature = errors.New("replay: missing signature")
	// ErrMalformedSignature means a signature field or Content-Digest does not
	// parse, has a duplicate member or parameter, or does not follow the
	// profile: label, components, parameters, tag or nonce
	// (malformed_signature).
	ErrMalformedSignature = errors.New("replay: malformed signature")
	// ErrBadDigest means Content-Digest is not the body's digest, or uses an
	// algorithm other than sha-256 and sha-512 (bad_digest).
	ErrBadDigest = errors.New("replay: bad content digest")
	// ErrBadSignature means the signature does not verify, or its keyid is not
	// the caller's key (bad_signature).
	ErrBadSignature = errors.New("replay: bad signature")
	// ErrStaleTimestamp means created or expires is outside the window
	// (stale_timestamp).
	ErrStaleTimestamp = errors.New("replay: stale timestamp")
	// ErrReplayedNonce means the node used the nonce before, within its window
	// (replayed_nonce).
	ErrReplayedNonce = errors.New("replay: replayed nonce")
	// ErrQuota means the node holds too many live nonces, or the store is full
	// (rate_limited, 429).
	ErrQuota = errors.New("replay: nonce quota exceeded")
	// ErrUnavailable means the nonce store could not answer, so the request
	// cannot be admitted (unavailable, 503). The Verifier wraps every
	// other store error in it.
	ErrUnavailable = errors.New("replay: nonce store unavailable")
	// ErrAborted means the database aborted the transaction the context
	// carries (a deadlock, a serialization failure), or kept aborting the
	// store's own; nothing of it is kept, and the whole transaction must
	// be run again, from its beginning. A Store returns it; the
	// Verifier never retries it, and returns it wrapped in ErrUnavailable,
	// so that a caller that does not retry refuses the request
	// (unavailable, 503).
	ErrAborted = errors.New("replay: transaction aborted")
)

// Store remembers the nonces of verified signatures until they
// expire, so that each is used once per node. One store is shared by every
// replica of the control plane. It makes no decisions: the Verifier
// chooses the expiry and the clock.
//
// The contract below holds for every Store; the conformance suite
// replaytest checks it, races included.
//
// Isolation and transactions. Each method is atomic: it applies all of its
// writes or none, and what it decides it decides on committed data (READ
// COMMITTED or stronger) together with the writes of its own transaction,
// never on a read that another writer can invalidate before the write
// that follows it: two Inserts of one node take turns, even in different
// processes. Every method takes the context first and, when the store
// supports transactions, joins the one the context carries (how a
// context carries one is the adapter's business, such as bunstore.WithTx):
// it sees that transaction's own earlier writes, and its writes commit or
// roll back with it. Without one, a method commits before it returns.
//
// Ids. Node ids and nonces are compared as bytes: case-sensitive, no
// Unicode normalisation, no trimming, so "node-a", "Node-A", "node-a " and
// the two spellings of "é" are five nodes. A SQL store declares such
// columns with a binary collation that does not pad: COLLATE "C" on
// PostgreSQL; VARBINARY, or utf8mb4_0900_bin on MySQL 8 and
// utf8mb4_nopad_bin on MariaDB, on MySQL and MariaDB (never utf8mb4_bin,
// which ignores trailing spaces); SQLite's default, BINARY, already is
// one. They are valid UTF-8 without NUL (U+0000), which PostgreSQL text
// cannot hold; in nodelane they are credential principal ids and base64url
// nonces, and a store may fail on others with an error of its own.
//
// Times handed to a Store are UTC and truncated to microseconds; a
// store must compare them exactly.
//
// Errors. Each method returns the sentinels its documentation names, or
// ErrAborted when the database aborted the transaction the context
// carries; any other error means the store could not answer. A store may
// retry internally, a bounded number of times, only when the context
// carries no transaction: a transaction the context carries is the
// caller's to run again, and the Verifier never does. Once a call has
// returned ErrAborted, nothing more of that transaction commits: every
// later call with its context fails (workerapi.Transactor says why this
// takes care on MySQL and MariaDB).
type Store interface {
	// Insert records nonce for nodeID until expires, atomically: of any
	// number of concurrent Inserts of one (nodeID, nonce), at most one
	// succeeds, whether the pair is new or its record has expired; of
	// concurrent Inserts of one node's distinct nonces, no more succeed
	// than its quota has room for. A record of the pair that expired at
	// or before now is replaced. Insert returns ErrReplayedNonce if the pair is recorded
	// and expires after now; otherwise ErrQuota, recording nothing, if
	// nodeID already has its quota of nonces that expire after now (or
	// the store is full: a store may bound all nodes' nonces together, as
	// MemoryConfig.Total does; a SQL store need not), without touching
	// other nodes' nonces. The quota is the store's own setting, not part
	// of this interface (bunstore.NonceConfig.PerNode; replaytest runs on
	// stores whose quota is replaytest.Quota). A store
	// may also refuse, with ErrReplayedNonce, a nonce that expires at or
	// before a time up to which it already deleted expired nonces, since
	// it can no longer tell whether it saw it. Any other error means the
	// store could not answer.
	Insert(ctx context.Context, nodeID, nonce string, expires, now time.Time) error
	// Collect deletes the nonces that expire at or before now and returns
	// how many it deleted.
	Collect(ctx context.Context, now time.Time) (int, error)
}

// NonceStore is the former name of [Store].
//
// Deprecated: use Store.
type NonceStore = Store
