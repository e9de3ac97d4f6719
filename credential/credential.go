package credential

import (
	"crypto/ed25519"
	"crypto/sha256"
	"encoding/base64"
	"errors"
	"fmt"
	"time"
)

// Errors returned by the Issuer and by stores. Callers test them with
// errors.Is; workerapi maps them to the status codes of PROTOCOL.md.
var (
	// ErrNotFound means there is no principal or credential with that id.
	ErrNotFound = errors.New("credential: not found")
	// ErrConflict means an id is already taken, or a store write lost a race
	// (the record changed since it was read). The Issuer retries races;
	// its callers see ErrConflict only for taken ids or constant contention.
	ErrConflict = errors.New("credential: conflict")
	// ErrInvalidArgument means an argument is missing, malformed or out of range.
	ErrInvalidArgument = errors.New("credential: invalid argument")
	// ErrAborted means the database aborted the transaction the context
	// carries (a deadlock, a serialization failure), or kept aborting the
	// store's own; nothing of it is kept, and the whole transaction must
	// be run again, from its beginning. Stores return it; the Issuer never
	// retries it (it retries only ErrConflict, a lost race of one write)
	// and returns it wrapped.
	ErrAborted = errors.New("credential: transaction aborted")
	// ErrMissingCredential means no bearer token was presented (401 missing_credential).
	ErrMissingCredential = errors.New("credential: missing credential")
	// ErrInvalidToken means the token is malformed, names no credential, or
	// carries the wrong secret (401 invalid_token).
	ErrInvalidToken = errors.New("credential: invalid token")
	// ErrExpired means the credential's lifetime, or its grace after a
	// rotation, has passed (401 token_expired).
	ErrExpired = errors.New("credential: token expired")
	// ErrRevoked means the credential was revoked (401 token_revoked).
	ErrRevoked = errors.New("credential: token revoked")
	// ErrExhausted means the credential is limited in uses (MaxUses) and has
	// been used that many times (401 token_exhausted).
	ErrExhausted = errors.New("credential: token exhausted")
	// ErrBanned means the credential's principal is banned (403 worker_banned).
	ErrBanned = errors.New("credential: principal banned")
	// ErrInsufficientScope means the credential lacks the scope asked for
	// (403 insufficient_scope).
	ErrInsufficientScope = errors.New("credential: insufficient scope")
)

// Kind is what a principal is.
type Kind string

// The kinds of principal.
const (
	// KindNode is a worker node; it signs its requests with an Ed25519 key.
	KindNode Kind = "node"
	// KindOperator is a person or program that runs the fleet; it presents
	// only a bearer credential.
	KindOperator Kind = "operator"
)

// Principal is who a credential speaks for.
type Principal struct {
	// ID is chosen by the caller or assigned at creation ("prn_" and 32
	// hex digits). It is 1 to 128 bytes of [A-Za-z0-9._:@-], starting
	// with a letter or digit.
	ID   string
	Kind Kind
	// Name is for people; it is not unique.
	Name string
	// PublicKey is a node's Ed25519 key (32 bytes); nil for operators and
	// for nodes that have not registered a key yet.
	PublicKey ed25519.PublicKey
	// KeyID is KeyID(PublicKey), or "" without a key. The Issuer sets it.
	KeyID     string
	Banned    bool
	BanReason string
	// BannedAt is when the current ban began; nil when not banned.
	BannedAt  *time.Time
	CreatedAt time.Time
	// Rev is the record's revision: 1 at creation, one more after each
	// update. Stores use it to apply updates only to the version read.
	Rev int64
}

// Credential is a stored credential. It holds neither the token nor the
// secret, only the secret's digest.
type Credential struct {
	// ID is the token's 16-byte id as 32 lowercase hex digits.
	ID          string
	PrincipalID string
	// Scopes are distinct, valid, and in the order of AllScopes.
	Scopes []Scope
	// Digest is HMAC-SHA256 of the token's 32-byte secret, keyed with a
	// subkey derived by HKDF-SHA256 from the pepper of PepperVersion.
	Digest        []byte
	PepperVersion int
	CreatedAt     time.Time
	// ExpiresAt is the first instant at which the credential no longer
	// verifies. A rotation brings it forward to the end of the grace.
	ExpiresAt time.Time
	// RevokedAt is when the credential was revoked; nil if it was not.
	RevokedAt *time.Time
	// RotatedTo is the id of the credential that replaced this one, or "".
	RotatedTo string
	// MaxUses, when above 0, is how many times Issuer.Use may count the
	// credential (a provisioning credential limited to so many
	// registrations); once Uses reaches it, the credential no longer
	// verifies (ErrExhausted). 0 means no limit.
	MaxUses int64
	// Uses is how many times Issuer.Use counted the credential (for a
	// provisioning credential, the registrations it authorised), limited
	// or not.
	Uses int64
	// Rev is the record's revision, as Principal.Rev.
	Rev int64
}

// KeyID returns the key id of an Ed25519 public key: the SHA-256 of its 32
// raw bytes in unpadded base64url, as in the keyid of a request signature.
// It returns "" when pub is not 32 bytes long.
func KeyID(pub ed25519.PublicKey) string {
	if len(pub) != ed25519.PublicKeySize {
		return ""
	}
	h := sha256.Sum256(pub)
	return base64.RawURLEncoding.EncodeToString(h[:])
}

// Scope is a permission a credential carries. A route requires exactly one.
type Scope string

// The scopes. A worker route needs one node scope, an operator route one
// operator scope (PROTOCOL.md).
const (
	ScopeNodeRegister        Scope = "node:register"
	ScopeNodeHeartbeat       Scope = "node:heartbeat"
	ScopeNodePoll            Scope = "node:poll"
	ScopeNodeResultSubmit    Scope = "node:result:submit"
	ScopeNodeAuditSubmit     Scope = "node:audit:submit"
	ScopeOperatorJobs        Scope = "operator:jobs"
	ScopeOperatorWorkers     Scope = "operator:workers"
	ScopeOperatorCredentials Scope = "operator:credentials"
	ScopeOperatorEnvelope    Scope = "operator:envelope"
	ScopeOperatorReceipts    Scope = "operator:receipts"
)

// AllScopes returns every scope, node scopes first, in a new slice.
func AllScopes() []Scope {
	return []Scope{
		ScopeNodeRegister, ScopeNodeHeartbeat, ScopeNodePoll, ScopeNodeResultSubmit, ScopeNodeAuditSubmit,
		ScopeOperatorJobs, ScopeOperatorWorkers, ScopeOperatorCredentials, ScopeOperatorEnvelope, ScopeOperatorReceipts,
	}
}

// scopeRank is the position of s in AllScopes, or -1 for no scope.
func scopeRank(s Scope) int {
	switch s {
	case ScopeNodeRegister:
		return 0
	case ScopeNodeHeartbeat:
		return 1
	case ScopeNodePoll:
		return 2
	case ScopeNodeResultSubmit:
		return 3
	case ScopeNodeAuditSubmit:
		return 4
	case ScopeOperatorJobs:
		return 5
	case ScopeOperatorWorkers:
		return 6
	case ScopeOperatorCredentials:
		return 7
	case ScopeOperatorEnvelope:
		return 8
	case ScopeOperatorReceipts:
		return 9
	}
	return -1
}

// ParseScope returns s as a Scope if it is exactly one of the scopes, and
// ErrInvalidArgument otherwise: no wildcards, prefixes, case folding or
// surrounding space.
func ParseScope(s string) (Scope, error) {
	if scopeRank(Scope(s)) < 0 {
		return "", fmt.Errorf("%w: unknown scope %q", ErrInvalidArgument, s)
	}
	return Scope(s), nil
}
