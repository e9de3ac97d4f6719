package credential

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
)

// The page sizes of Issuer.ListCredentials.
const (
	// DefaultListLimit is the page size of a CredentialFilter with Limit 0.
	DefaultListLimit = 100
	// MaxListLimit is the largest page Issuer.ListCredentials answers.
	MaxListLimit = 1000
)

// ScopeError is the error of MintAs when the minting credential lacks some
// of the scopes asked for. It matches ErrInsufficientScope.
type ScopeError struct {
	// CredentialID is the minting credential's id.
	CredentialID string
	// Missing are the scopes asked for that it does not hold, distinct and
	// in the order of AllScopes.
	Missing []Scope
}

func (e *ScopeError) Error() string {
	names := make([]string, len(e.Missing))
	for i, s := range e.Missing {
		names[i] = string(s)
	}
	return fmt.Sprintf("%v: the minting credential lacks %s; a credential mints only scopes it holds",
		ErrInsufficientScope, strings.Join(names, ", "))
}

// Unwrap makes errors.Is(err, ErrInsufficientScope) hold.
func (e *ScopeError) Unwrap() error { return ErrInsufficientScope }

// MintAs is MintWith on behalf of the credential minterID, the one a
// request presented: it mints only scopes the minter holds itself, so no
// credential can make one more powerful than itself (a credential holding
// only operator:credentials mints operator:credentials and nothing else).
// It reads the minter in ctx's transaction, and the minter must still
// verify: ErrExpired, ErrRevoked, ErrBanned (its principal), or
// ErrInvalidToken if it or its principal is gone. A scope it lacks is a
// *ScopeError naming all it lacks, which matches ErrInsufficientScope;
// nothing is written then. Otherwise it is MintWith, with its errors,
// except that the new credential never expires after the minter: a TTL
// (or the default TTL) that would outlive it is cut to the minter's
// remaining life.
//
// Mint and MintWith check no minter: they are for code that holds
// authority of its own, such as a bootstrap that creates the first
// operator.
func (is *Issuer) MintAs(ctx context.Context, minterID, principalID string, scopes []Scope, opt MintOptions) (token string, c *Credential, err error) {
	sc, err := normalizeScopes(scopes)
	if err != nil {
		return "", nil, err
	}
	m, err := is.getCredential(ctx, minterID)
	switch {
	case errors.Is(err, ErrNotFound):
		return "", nil, fmt.Errorf("%w: minting credential %q no longer exists", ErrInvalidToken, minterID)
	case err != nil:
		return "", nil, fmt.Errorf("minting credential %q: %w", minterID, err)
	case !is.now().Before(m.ExpiresAt):
		return "", nil, fmt.Errorf("%w: minting credential %s", ErrExpired, m.ID)
	case m.RevokedAt != nil:
		return "", nil, fmt.Errorf("%w: minting credential %s", ErrRevoked, m.ID)
	}
	switch p, err := is.getPrincipal(ctx, m.PrincipalID); {
	case errors.Is(err, ErrNotFound):
		return "", nil, fmt.Errorf("%w: the principal of minting credential %s no longer exists", ErrInvalidToken, m.ID)
	case err != nil:
		return "", nil, fmt.Errorf("principal of minting credential %s: %w", m.ID, err)
	case p.Banned:
		return "", nil, fmt.Errorf("%w: principal %q of minting credential %s", ErrBanned, p.ID, m.ID)
	}
	var missing []Scope
	for _, s := range sc {
		if !slices.Contains(m.Scopes, s) {
			missing = append(missing, s)
		}
	}
	if len(missing) > 0 {
		return "", nil, &ScopeError{CredentialID: m.ID, Missing: missing}
	}
	// Nor does it outlive its minter: a credential due to expire cannot
	// hand out one that lasts longer than itself.
	return is.mintWith(ctx, principalID, sc, opt, m.ExpiresAt)
}

// ListCredentials returns a page of credentials matching f, in byte order
// of their ids (descending when f.Desc), and the After of the next page ("" after the last; given
// whenever the page is full, so the last page may be empty). Limit 0
// means DefaultListLimit. ErrInvalidArgument for a negative Limit, one
// above MaxListLimit, or an After that is not UTF-8 without NUL;
// ErrNotFound for a PrincipalID that names no principal. Records never
// hold a token or a secret, only the secret's digest.
func (is *Issuer) ListCredentials(ctx context.Context, f CredentialFilter) ([]*Credential, string, error) {
	switch {
	case f.Limit < 0 || f.Limit > MaxListLimit:
		return nil, "", fmt.Errorf("%w: limit %d is not 0 to %d", ErrInvalidArgument, f.Limit, MaxListLimit)
	case f.Limit == 0:
		f.Limit = DefaultListLimit
	}
	if !storable(f.After) {
		return nil, "", fmt.Errorf("%w: after is not UTF-8 without NUL", ErrInvalidArgument)
	}
	if f.PrincipalID != "" {
		if _, err := is.getPrincipal(ctx, f.PrincipalID); err != nil {
			return nil, "", fmt.Errorf("principal %q: %w", f.PrincipalID, err)
		}
	}
	cs, err := is.store.ListCredentials(ctx, f)
	if err != nil {
		return nil, "", fmt.Errorf("listing credentials: %w", err)
	}
	next := ""
	if len(cs) == f.Limit {
		next = cs[len(cs)-1].ID
	}
	return cs, next, nil
}
