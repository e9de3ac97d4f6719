package credential

import (
	"cmp"
	"context"
	"crypto/ed25519"
	"crypto/hkdf"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"maps"
	"slices"
	"strings"
	"time"
	"unicode/utf8"
)

// Config holds the Issuer's settings. Peppers is required.
type Config struct {
	// Peppers maps a pepper version (1 or more) to a secret pepper of at
	// least 32 bytes, such as random bytes kept outside the database. A
	// credential verifies only while the pepper it was minted under is
	// configured. Required.
	Peppers map[int][]byte
	// PepperVersion is the version new credentials use; it must be a key
	// of Peppers. Defaults to the highest version in Peppers.
	PepperVersion int
	// DefaultTTL is the lifetime of a credential minted with ttl 0.
	// Defaults to 30 days.
	DefaultTTL time.Duration
	// Now is the clock. Defaults to time.Now.
	Now func() time.Time
	// Rand is the source of ids and secrets. Defaults to crypto/rand.Reader.
	Rand io.Reader
}

// Issuer mints, verifies, rotates and revokes credentials over a Store,
// and manages the principals they speak for. It is safe for concurrent
// use, and several Issuers (on several replicas) may share one Store:
// every update is conditional on the revision it read.
type Issuer struct {
	store Store
	// subkeys maps a pepper version to the HMAC key derived from it; the
	// peppers themselves are not kept.
	subkeys map[int][]byte
	version int
	ttl     time.Duration
	clock   func() time.Time
	rand    io.Reader
}

const (
	minPepperLen = 32
	// hkdfInfo binds the derived key to its one use.
	hkdfInfo = "nodelane credential secret digest v1"
	casTries = 16
	// maxReasonLen bounds a ban reason.
	maxReasonLen = 1024
	// maxNameLen bounds a principal name.
	maxNameLen = 256
)

// NewIssuer returns an Issuer over s. It fails when cfg configures no
// pepper, a pepper shorter than 32 bytes, or a PepperVersion it lacks.
func NewIssuer(s Store, cfg *Config) (*Issuer, error) {
	if s == nil {
		return nil, fmt.Errorf("%w: nil store", ErrInvalidArgument)
	}
	if cfg == nil || len(cfg.Peppers) == 0 {
		return nil, fmt.Errorf("%w: no pepper configured", ErrInvalidArgument)
	}
	is := &Issuer{
		store:   s,
		subkeys: make(map[int][]byte, len(cfg.Peppers)),
		version: cfg.PepperVersion,
		ttl:     cfg.DefaultTTL,
		clock:   cfg.Now,
		rand:    cfg.Rand,
	}
	for v, pepper := range cfg.Peppers {
		if v < 1 {
			return nil, fmt.Errorf("%w: pepper version %d is not positive", ErrInvalidArgument, v)
		}
		if len(pepper) < minPepperLen {
			return nil, fmt.Errorf("%w: pepper %d has %d bytes, want at least %d", ErrInvalidArgument, v, len(pepper), minPepperLen)
		}
		key, err := hkdf.Key(sha256.New, pepper, nil, hkdfInfo, sha256.Size)
		if err != nil {
			return nil, fmt.Errorf("credential: deriving the key of pepper %d: %w", v, err)
		}
		is.subkeys[v] = key
	}
	if is.version == 0 {
		is.version = slices.Max(slices.Collect(maps.Keys(cfg.Peppers)))
	}
	if _, ok := is.subkeys[is.version]; !ok {
		return nil, fmt.Errorf("%w: pepper version %d is not configured", ErrInvalidArgument, is.version)
	}
	if is.ttl <= 0 {
		is.ttl = 30 * 24 * time.Hour
	}
	if is.clock == nil {
		is.clock = time.Now
	}
	if is.rand == nil {
		is.rand = rand.Reader
	}
	return is, nil
}

// now is the Issuer's clock in UTC, truncated to microseconds so that
// every store round-trips it exactly.
func (is *Issuer) now() time.Time { return is.clock().UTC().Truncate(time.Microsecond) }

// CreatePrincipal stores a new principal and returns it. An empty p.ID is
// assigned. The Issuer sets KeyID from PublicKey and CreatedAt, and
// creates the principal unbanned: Banned, BanReason and BannedAt are
// ignored. ErrInvalidArgument for a bad id, kind, name (over 256 bytes,
// not UTF-8, or holding NUL) or key (an operator has no key); ErrConflict
// if the id is taken.
func (is *Issuer) CreatePrincipal(ctx context.Context, p Principal) (*Principal, error) {
	if p.Kind != KindNode && p.Kind != KindOperator {
		return nil, fmt.Errorf("%w: kind %q is neither %q nor %q", ErrInvalidArgument, p.Kind, KindNode, KindOperator)
	}
	if p.ID != "" && !validPrincipalID(p.ID) {
		return nil, fmt.Errorf("%w: principal id %q is not 1 to 128 bytes of [A-Za-z0-9._:@-] starting with a letter or digit", ErrInvalidArgument, p.ID)
	}
	if len(p.Name) > maxNameLen {
		return nil, fmt.Errorf("%w: name longer than %d bytes", ErrInvalidArgument, maxNameLen)
	}
	if !storable(p.Name) {
		return nil, fmt.Errorf("%w: name is not UTF-8 without NUL", ErrInvalidArgument)
	}
	if p.PublicKey != nil {
		if err := checkKey(&p, p.PublicKey); err != nil {
			return nil, err
		}
	}
	now := is.now()
	if p.ID == "" {
		var b [16]byte
		if _, err := io.ReadFull(is.rand, b[:]); err != nil {
			return nil, fmt.Errorf("credential: reading randomness: %w", err)
		}
		p.ID = "prn_" + hex.EncodeToString(b[:])
	}
	p.PublicKey = slices.Clone(p.PublicKey)
	p.KeyID = KeyID(p.PublicKey)
	p.Banned, p.BanReason, p.BannedAt = false, "", nil
	p.CreatedAt = now
	p.Rev = 1
	if err := is.store.CreatePrincipal(ctx, &p); err != nil {
		return nil, fmt.Errorf("creating principal %q: %w", p.ID, err)
	}
	return &p, nil
}

// validPrincipalID reports whether id is 1 to 128 bytes of [A-Za-z0-9._:@-]
// starting with a letter or digit: safe in URLs, logs and SQL keys.
func validPrincipalID(id string) bool {
	if len(id) == 0 || len(id) > 128 || base62Digit(id[0]) < 0 {
		return false
	}
	for i := 0; i < len(id); i++ {
		if c := id[i]; base62Digit(c) < 0 && c != '.' && c != '_' && c != ':' && c != '@' && c != '-' {
			return false
		}
	}
	return true
}

func checkKey(p *Principal, pub ed25519.PublicKey) error {
	if p.Kind != KindNode {
		return fmt.Errorf("%w: a %s principal has no public key", ErrInvalidArgument, p.Kind)
	}
	if len(pub) != ed25519.PublicKeySize {
		return fmt.Errorf("%w: public key has %d bytes, want %d", ErrInvalidArgument, len(pub), ed25519.PublicKeySize)
	}
	return nil
}

// Principal returns the principal with that id. ErrNotFound.
func (is *Issuer) Principal(ctx context.Context, id string) (*Principal, error) {
	p, err := is.getPrincipal(ctx, id)
	if err != nil {
		return nil, fmt.Errorf("principal %q: %w", id, err)
	}
	return p, nil
}

// SetNodeKey sets the Ed25519 public key of a node principal, replacing
// any earlier key, and its KeyID. ErrNotFound for an unknown principal;
// ErrInvalidArgument for an operator or a key that is not 32 bytes.
func (is *Issuer) SetNodeKey(ctx context.Context, principalID string, pub ed25519.PublicKey) (*Principal, error) {
	return is.updatePrincipal(ctx, principalID, func(p *Principal) (bool, error) {
		if err := checkKey(p, pub); err != nil {
			return false, err
		}
		p.PublicKey = slices.Clone(pub)
		p.KeyID = KeyID(pub)
		return true, nil
	})
}

// Ban bans a principal: Verify refuses its credentials with ErrBanned
// until Unban. Banning a banned principal replaces the reason and keeps
// BannedAt. ErrNotFound; ErrInvalidArgument for a reason over 1024 bytes,
// or not UTF-8, or holding NUL.
func (is *Issuer) Ban(ctx context.Context, principalID, reason string) (*Principal, error) {
	if len(reason) > maxReasonLen {
		return nil, fmt.Errorf("%w: ban reason longer than %d bytes", ErrInvalidArgument, maxReasonLen)
	}
	if !storable(reason) {
		return nil, fmt.Errorf("%w: ban reason is not UTF-8 without NUL", ErrInvalidArgument)
	}
	now := is.now()
	return is.updatePrincipal(ctx, principalID, func(p *Principal) (bool, error) {
		if p.Banned && p.BanReason == reason {
			return false, nil
		}
		if !p.Banned {
			p.Banned, p.BannedAt = true, &now
		}
		p.BanReason = reason
		return true, nil
	})
}

// Unban lifts a ban; unbanning a principal that is not banned changes
// nothing. ErrNotFound.
func (is *Issuer) Unban(ctx context.Context, principalID string) (*Principal, error) {
	return is.updatePrincipal(ctx, principalID, func(p *Principal) (bool, error) {
		if !p.Banned {
			return false, nil
		}
		p.Banned, p.BanReason, p.BannedAt = false, "", nil
		return true, nil
	})
}

// storable reports whether s may be handed to a Store: valid UTF-8
// without NUL (see Store).
func storable(s string) bool { return utf8.ValidString(s) && !strings.ContainsRune(s, 0) }

// getPrincipal reads a principal from the store. An id no Store can hold
// is no principal's, so it answers ErrNotFound without asking.
func (is *Issuer) getPrincipal(ctx context.Context, id string) (*Principal, error) {
	if !storable(id) {
		return nil, ErrNotFound
	}
	return is.store.GetPrincipal(ctx, id)
}

// getCredential is getPrincipal for credentials.
func (is *Issuer) getCredential(ctx context.Context, id string) (*Credential, error) {
	if !storable(id) {
		return nil, ErrNotFound
	}
	return is.store.GetCredential(ctx, id)
}

// updatePrincipal applies change to the stored principal id, retrying when
// the principal changed under it. change reports whether it changed
// anything; if not, nothing is written.
func (is *Issuer) updatePrincipal(ctx context.Context, id string, change func(*Principal) (bool, error)) (*Principal, error) {
	for range casTries {
		p, err := is.getPrincipal(ctx, id)
		if err != nil {
			return nil, fmt.Errorf("principal %q: %w", id, err)
		}
		changed, err := change(p)
		if err != nil {
			return nil, err
		}
		if !changed {
			return p, nil
		}
		rev := p.Rev
		p.Rev++
		switch err := is.store.UpdatePrincipal(ctx, p, rev); {
		case errors.Is(err, ErrConflict):
			continue
		case err != nil:
			return nil, fmt.Errorf("updating principal %q: %w", id, err)
		}
		return p, nil
	}
	return nil, fmt.Errorf("%w: principal %q kept changing", ErrConflict, id)
}

// Mint creates a credential for the principal with the given scopes,
// living ttl (0 means Config.DefaultTTL), and returns its token, which is
// shown this once and never stored. ErrInvalidArgument for no scopes, an
// unknown scope or a negative ttl; ErrNotFound for an unknown principal.
// A banned principal may be given credentials; Verify refuses them while
// the ban lasts.
func (is *Issuer) Mint(ctx context.Context, principalID string, scopes []Scope, ttl time.Duration) (token string, c *Credential, err error) {
	return is.MintWith(ctx, principalID, scopes, MintOptions{TTL: ttl})
}

// MintOptions are the settings of a credential that MintWith mints.
type MintOptions struct {
	// TTL is the credential's lifetime; 0 means Config.DefaultTTL.
	TTL time.Duration
	// MaxUses, when above 0, limits how many times Use may count the
	// credential (Credential.MaxUses); 0 means no limit.
	MaxUses int64
}

// MintWith is Mint with options: a credential may also be limited in
// uses. ErrInvalidArgument as Mint, and for a negative MaxUses.
func (is *Issuer) MintWith(ctx context.Context, principalID string, scopes []Scope, opt MintOptions) (token string, c *Credential, err error) {
	return is.mintWith(ctx, principalID, scopes, opt, time.Time{})
}

// mintWith is MintWith of a credential that expires no later than
// notAfter, unless notAfter is zero.
func (is *Issuer) mintWith(ctx context.Context, principalID string, scopes []Scope, opt MintOptions, notAfter time.Time) (token string, c *Credential, err error) {
	sc, err := normalizeScopes(scopes)
	if err != nil {
		return "", nil, err
	}
	ttl := opt.TTL
	if ttl < 0 {
		return "", nil, fmt.Errorf("%w: negative ttl %v", ErrInvalidArgument, ttl)
	}
	if ttl == 0 {
		ttl = is.ttl
	}
	if opt.MaxUses < 0 {
		return "", nil, fmt.Errorf("%w: negative max uses %d", ErrInvalidArgument, opt.MaxUses)
	}
	if _, err := is.getPrincipal(ctx, principalID); err != nil {
		return "", nil, fmt.Errorf("principal %q: %w", principalID, err)
	}
	now := is.now()
	if !notAfter.IsZero() && now.Add(ttl).After(notAfter) {
		ttl = notAfter.Sub(now)
	}
	return is.mint(ctx, principalID, sc, ttl, now, opt.MaxUses, 0)
}

// normalizeScopes checks scopes and returns them distinct, in the order of
// AllScopes.
func normalizeScopes(scopes []Scope) ([]Scope, error) {
	if len(scopes) == 0 {
		return nil, fmt.Errorf("%w: a credential needs at least one scope", ErrInvalidArgument)
	}
	out := make([]Scope, 0, len(scopes))
	for _, s := range scopes {
		if _, err := ParseScope(string(s)); err != nil {
			return nil, err
		}
		out = append(out, s)
	}
	slices.SortFunc(out, func(a, b Scope) int { return cmp.Compare(scopeRank(a), scopeRank(b)) })
	return slices.Compact(out), nil
}

func (is *Issuer) mint(ctx context.Context, principalID string, scopes []Scope, ttl time.Duration, now time.Time, maxUses, uses int64) (string, *Credential, error) {
	var id [idLen]byte
	var secret [secretLen]byte
	if _, err := io.ReadFull(is.rand, id[:]); err != nil {
		return "", nil, fmt.Errorf("credential: reading randomness: %w", err)
	}
	if _, err := io.ReadFull(is.rand, secret[:]); err != nil {
		return "", nil, fmt.Errorf("credential: reading randomness: %w", err)
	}
	c := &Credential{
		ID:            hex.EncodeToString(id[:]),
		PrincipalID:   principalID,
		Scopes:        slices.Clone(scopes),
		Digest:        digest(is.subkeys[is.version], &secret),
		PepperVersion: is.version,
		CreatedAt:     now,
		ExpiresAt:     now.Add(ttl).Truncate(time.Microsecond),
		MaxUses:       maxUses,
		Uses:          uses,
		Rev:           1,
	}
	if err := is.store.CreateCredential(ctx, c); err != nil {
		return "", nil, fmt.Errorf("creating credential: %w", err)
	}
	return formatToken(&id, &secret), c, nil
}

// digest is the HMAC-SHA256 of secret under key.
func digest(key []byte, secret *[secretLen]byte) []byte {
	m := hmac.New(sha256.New, key)
	m.Write(secret[:])
	return m.Sum(nil)
}

// Verify checks token and that its credential carries scope, and returns
// the credential and its principal. The checks run in this order, and the
// first failure answers: ErrMissingCredential for an empty token;
// ErrInvalidToken for a malformed token (no store is consulted), an
// unknown id, a wrong secret or a pepper no longer configured, all after
// the same work; ErrExpired; ErrRevoked; ErrExhausted (a credential
// limited in uses that has been used up); ErrBanned; ErrInsufficientScope.
// Any other error is a store's, wrapped: the request must fail, not pass.
func (is *Issuer) Verify(ctx context.Context, token string, scope Scope) (*Principal, *Credential, error) {
	if token == "" {
		return nil, nil, ErrMissingCredential
	}
	id, secret, err := parseToken(token)
	if err != nil {
		return nil, nil, err
	}
	c, err := is.store.GetCredential(ctx, hex.EncodeToString(id[:]))
	if err != nil && !errors.Is(err, ErrNotFound) {
		return nil, nil, fmt.Errorf("credential: reading credential: %w", err)
	}
	// An unknown id, or a pepper no longer configured, is checked against a
	// dummy digest, so that it costs the same HMAC and compare as a wrong
	// secret.
	var dummy [sha256.Size]byte
	key, want, known := is.subkeys[is.version], dummy[:], false
	if err == nil {
		if k, ok := is.subkeys[c.PepperVersion]; ok {
			key, want, known = k, c.Digest, true
		}
	}
	match := subtle.ConstantTimeCompare(digest(key, &secret), want) == 1
	if !known || !match {
		return nil, nil, ErrInvalidToken
	}
	if !is.now().Before(c.ExpiresAt) {
		return nil, nil, ErrExpired
	}
	if c.RevokedAt != nil {
		return nil, nil, ErrRevoked
	}
	if exhausted(c) {
		return nil, nil, ErrExhausted
	}
	p, err := is.store.GetPrincipal(ctx, c.PrincipalID)
	switch {
	case errors.Is(err, ErrNotFound):
		// A credential whose principal is gone speaks for no one.
		return nil, nil, ErrInvalidToken
	case err != nil:
		return nil, nil, fmt.Errorf("credential: reading principal: %w", err)
	}
	if p.Banned {
		return nil, nil, ErrBanned
	}
	if !slices.Contains(c.Scopes, scope) {
		return nil, nil, fmt.Errorf("%w: %q", ErrInsufficientScope, scope)
	}
	return p, c, nil
}

// Credential returns the credential with that id. ErrNotFound.
func (is *Issuer) Credential(ctx context.Context, id string) (*Credential, error) {
	c, err := is.getCredential(ctx, id)
	if err != nil {
		return nil, fmt.Errorf("credential %q: %w", id, err)
	}
	return c, nil
}

// Credentials returns every credential of the principal, live or not,
// oldest first (by CreatedAt, then ID). ErrNotFound for an unknown principal.
func (is *Issuer) Credentials(ctx context.Context, principalID string) ([]*Credential, error) {
	if _, err := is.getPrincipal(ctx, principalID); err != nil {
		return nil, fmt.Errorf("principal %q: %w", principalID, err)
	}
	var cs []*Credential
	for f := (CredentialFilter{PrincipalID: principalID, Limit: MaxListLimit}); ; {
		page, err := is.store.ListCredentials(ctx, f)
		if err != nil {
			return nil, fmt.Errorf("listing credentials of %q: %w", principalID, err)
		}
		cs = append(cs, page...)
		if len(page) < f.Limit {
			break
		}
		last := page[len(page)-1].ID
		if last <= f.After {
			// A store that does not move forward would page for ever.
			return nil, fmt.Errorf("listing credentials of %q: the store answered id %q after %q", principalID, last, f.After)
		}
		f.After = last
	}
	slices.SortFunc(cs, func(a, b *Credential) int {
		if c := a.CreatedAt.Compare(b.CreatedAt); c != 0 {
			return c
		}
		return cmp.Compare(a.ID, b.ID)
	})
	return cs, nil
}

// Revoke revokes a credential at once and returns it. Revoking a revoked
// credential changes nothing. ErrNotFound.
func (is *Issuer) Revoke(ctx context.Context, credentialID string) (*Credential, error) {
	now := is.now()
	return is.updateCredential(ctx, credentialID, func(c *Credential) (bool, error) {
		if c.RevokedAt != nil {
			return false, nil
		}
		c.RevokedAt = &now
		return true, nil
	})
}

// Rotate replaces a credential with a new one for the same principal,
// with the same scopes, lifetime and limit of uses (the uses counted so
// far carry over), and returns the new token. The old
// credential records the new one's id in RotatedTo and keeps working for
// grace (0: it stops at once), or until it would have expired anyway;
// after that Verify returns ErrExpired for it. ErrNotFound; ErrRevoked or
// ErrExpired for a credential that no longer verifies; ErrInvalidArgument
// for a negative grace or a credential already rotated.
func (is *Issuer) Rotate(ctx context.Context, credentialID string, grace time.Duration) (newToken string, c *Credential, err error) {
	if grace < 0 {
		return "", nil, fmt.Errorf("%w: negative grace %v", ErrInvalidArgument, grace)
	}
	old, err := is.getCredential(ctx, credentialID)
	if err != nil {
		return "", nil, fmt.Errorf("credential %q: %w", credentialID, err)
	}
	now := is.now()
	if err := rotatable(old, now); err != nil {
		return "", nil, err
	}
	// The new credential is created first: if the process dies between the
	// two writes, an extra credential exists, rather than none that works.
	token, nc, err := is.mint(ctx, old.PrincipalID, old.Scopes, old.ExpiresAt.Sub(old.CreatedAt), now, old.MaxUses, old.Uses)
	if err != nil {
		return "", nil, err
	}
	end := now.Add(grace).Truncate(time.Microsecond)
	_, err = is.updateCredential(ctx, credentialID, func(c *Credential) (bool, error) {
		if err := rotatable(c, now); err != nil {
			return false, err
		}
		c.RotatedTo = nc.ID
		if end.Before(c.ExpiresAt) {
			c.ExpiresAt = end
		}
		return true, nil
	})
	if err != nil {
		// The old credential changed under us (revoked, rotated by another
		// caller): the new one must not outlive the failed rotation.
		if _, rerr := is.Revoke(ctx, nc.ID); rerr != nil {
			err = errors.Join(err, fmt.Errorf("revoking the unused credential %s: %w", nc.ID, rerr))
		}
		return "", nil, err
	}
	return token, nc, nil
}

func rotatable(c *Credential, now time.Time) error {
	switch {
	case c.RevokedAt != nil:
		return fmt.Errorf("%w: credential %s", ErrRevoked, c.ID)
	case !now.Before(c.ExpiresAt):
		return fmt.Errorf("%w: credential %s", ErrExpired, c.ID)
	case c.RotatedTo != "":
		return fmt.Errorf("%w: credential %s was already rotated to %s", ErrInvalidArgument, c.ID, c.RotatedTo)
	}
	return nil
}

// updateCredential is updatePrincipal for credentials.
func (is *Issuer) updateCredential(ctx context.Context, id string, change func(*Credential) (bool, error)) (*Credential, error) {
	for range casTries {
		c, err := is.getCredential(ctx, id)
		if err != nil {
			return nil, fmt.Errorf("credential %q: %w", id, err)
		}
		changed, err := change(c)
		if err != nil {
			return nil, err
		}
		if !changed {
			return c, nil
		}
		rev := c.Rev
		c.Rev++
		switch err := is.store.UpdateCredential(ctx, c, rev); {
		case errors.Is(err, ErrConflict):
			continue
		case err != nil:
			return nil, fmt.Errorf("updating credential %q: %w", id, err)
		}
		return c, nil
	}
	return nil, fmt.Errorf("%w: credential %q kept changing", ErrConflict, id)
}
