package credential

import "context"

// Store keeps principals and credentials. It makes no decisions: the
// Issuer decides every change and the Store applies it atomically.
//
// The contract below holds for every Store; the conformance suite
// credentialtest checks it.
//
// Isolation and transactions. Each method is atomic: it applies all of its
// writes or none, and it decides (a taken id, a stale revision) on
// committed data, READ COMMITTED or stronger, together with the writes of
// its own transaction, never on a read that another writer can invalidate
// before the write that follows it. Every method takes the context first
// and, when the store supports transactions, joins the one the context
// carries (how a context carries one is the adapter's business, such as
// bunstore.WithTx): it sees that transaction's own earlier writes, and its
// writes commit or roll back with it. Without one, a method commits before
// it returns.
//
// Ids. Principal and credential ids are compared as bytes: case-sensitive,
// no Unicode normalisation, no trimming, so "Op-A" and "op-a" are two
// principals. A SQL store declares id columns with a binary collation that
// does not pad: COLLATE "C" on PostgreSQL; VARBINARY, or utf8mb4_0900_bin
// on MySQL 8 and utf8mb4_nopad_bin on MariaDB, on MySQL and MariaDB (never
// utf8mb4_bin, which ignores trailing spaces); SQLite's default, BINARY,
// already is one. Ids may be any valid UTF-8 without NUL (U+0000), which
// PostgreSQL text cannot hold; the Issuer hands a Store no other string,
// ids or text, although the ids it creates are narrower.
//
// Values. Times handed to a Store are UTC and truncated to microseconds; a
// Store must give them back exactly. Names, ban reasons and every other
// string come back byte for byte, and byte slices (keys, digests) with
// the same bytes (an empty one may come back nil). A Store returns copies: changing a returned record does not
// change the stored one, nor does changing a record after handing it over.
//
// Errors. Each method returns the sentinels its documentation names, or
// ErrAborted when the database aborted the transaction the context
// carries; any other error means the store could not answer. A store may
// retry internally, a bounded number of times, only when the context
// carries no transaction: a transaction the context carries is the
// caller's to run again, and the Issuer never does. Once a call has
// returned ErrAborted, nothing more of that transaction commits: every
// later call with its context fails (workerapi.Transactor says why this
// takes care on MySQL and MariaDB).
type Store interface {
	// CreatePrincipal inserts p. ErrConflict if its id is taken.
	CreatePrincipal(ctx context.Context, p *Principal) error
	// GetPrincipal returns the principal with that id. ErrNotFound.
	GetPrincipal(ctx context.Context, id string) (*Principal, error)
	// UpdatePrincipal replaces the stored principal p.ID with p, only if
	// the stored revision is rev (p.Rev holds the new one). ErrConflict if
	// the revision differs, ErrNotFound if there is no such principal.
	UpdatePrincipal(ctx context.Context, p *Principal, rev int64) error
	// PrincipalsByKey returns every principal whose KeyID is keyID, in
	// any order; none (and no error) when no principal holds that key.
	// keyID is never "". A ban follows a node's key (Issuer.KeyBan), so a
	// SQL store indexes the key id.
	PrincipalsByKey(ctx context.Context, keyID string) ([]*Principal, error)

	// CreateCredential inserts c. ErrConflict if its id is taken.
	CreateCredential(ctx context.Context, c *Credential) error
	// GetCredential returns the credential with that id. ErrNotFound.
	GetCredential(ctx context.Context, id string) (*Credential, error)
	// UpdateCredential replaces the stored credential c.ID with c, only if
	// the stored revision is rev (c.Rev holds the new one). ErrConflict if
	// the revision differs, ErrNotFound if there is no such credential.
	UpdateCredential(ctx context.Context, c *Credential, rev int64) error
	// ListCredentials returns the credentials matching f in ascending
	// byte order of their ids (descending when f.Desc), at most f.Limit:
	// those of f.PrincipalID (every principal's when it is ""), with an id
	// past f.After (above it, or below it when f.Desc; from the first of
	// the order when it is ""). None, and no error, for a principal with
	// no credential or unknown. ErrInvalidArgument if f.Limit < 1.
	ListCredentials(ctx context.Context, f CredentialFilter) ([]*Credential, error)

	// ChargeQuota counts c.N units of the quota (c.PrincipalID, c.Name)
	// in one atomic step, and reports whether it did. When no window of
	// that quota is open at c.Now (none yet, or the last began at or
	// before c.Now minus c.Window), a window begins at c.Now with c.N
	// units used; otherwise the open window's units grow by c.N only if
	// they stay at most c.Limit. It returns the window as it stands after
	// the charge, or, when the charge does not fit, as it stands with
	// false, counting nothing. Concurrent charges of one quota never count
	// past c.Limit. The principal need not exist; quotas are kept apart
	// from principals so that charging one never changes a principal's
	// record (or its revision).
	ChargeQuota(ctx context.Context, c QuotaCharge) (q Quota, ok bool, err error)
}

// CredentialFilter selects a page of credentials (Store.ListCredentials,
// Issuer.ListCredentials).
type CredentialFilter struct {
	// PrincipalID keeps only that principal's credentials; "" keeps all.
	PrincipalID string
	// After is an exclusive lower bound on the credential id, compared as
	// bytes, or with Desc an exclusive upper bound; "" starts from the
	// first id of the order.
	After string
	// Limit caps the page. Issuer.ListCredentials reads 0 as
	// DefaultListLimit and refuses more than MaxListLimit; a Store is
	// always given at least 1.
	Limit int
	// Desc lists in descending byte order of the ids. Credential ids are
	// random, so neither order is the order of creation.
	Desc bool
}
