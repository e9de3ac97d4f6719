package credential

import "context"

// Store keeps principals and credentials. It makes no decisions: the
// Issuer decides every change and the Store applies it atomically. Every
// method takes the context first and, when the store supports
// transactions, joins the one the context carries.
//
// Times handed to a Store are UTC and truncated to microseconds; a Store
// must give them back exactly. A Store returns copies: changing a returned
// record does not change the stored one.
type Store interface {
	// CreatePrincipal inserts p. ErrConflict if its id is taken.
	CreatePrincipal(ctx context.Context, p *Principal) error
	// GetPrincipal returns the principal with that id. ErrNotFound.
	GetPrincipal(ctx context.Context, id string) (*Principal, error)
	// UpdatePrincipal replaces the stored principal p.ID with p, only if
	// the stored revision is rev (p.Rev holds the new one). ErrConflict if
	// the revision differs, ErrNotFound if there is no such principal.
	UpdatePrincipal(ctx context.Context, p *Principal, rev int64) error

	// CreateCredential inserts c. ErrConflict if its id is taken.
	CreateCredential(ctx context.Context, c *Credential) error
	// GetCredential returns the credential with that id. ErrNotFound.
	GetCredential(ctx context.Context, id string) (*Credential, error)
	// UpdateCredential replaces the stored credential c.ID with c, only if
	// the stored revision is rev (c.Rev holds the new one). ErrConflict if
	// the revision differs, ErrNotFound if there is no such credential.
	UpdateCredential(ctx context.Context, c *Credential, rev int64) error
	// ListCredentials returns every credential of the principal, in any
	// order; none (and no error) for an unknown principal.
	ListCredentials(ctx context.Context, principalID string) ([]*Credential, error)
}
