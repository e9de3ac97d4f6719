package credential

import (
	"cmp"
	"context"
	"crypto/ed25519"
	"errors"
	"fmt"
	"time"
)

// Least privilege for nodes: a credential limited in uses, a ban that
// follows a node's key rather than its id, and a renewal that needs no
// credential but the one being renewed.

// exhausted reports whether c is limited in uses and has used them all.
func exhausted(c *Credential) bool { return c.MaxUses > 0 && c.Uses >= c.MaxUses }

// Use counts one use of the credential and returns it as stored: every
// credential is counted, so that Uses tells, say, how many nodes a
// provisioning credential registered, and one limited in uses (MaxUses
// above 0) is refused once they are spent. Call it in the transaction of the operation
// the use stands for (a registration, for a provisioning credential), so
// that the use counts only if that operation commits: the count is a
// conditional update of the credential's revision, so concurrent uses,
// on any number of Issuers sharing the store, never count past MaxUses.
//
// ErrNotFound; ErrExpired or ErrRevoked for a credential that no longer
// verifies; ErrExhausted when its uses are spent.
func (is *Issuer) Use(ctx context.Context, credentialID string) (*Credential, error) {
	now := is.now()
	return is.updateCredential(ctx, credentialID, func(c *Credential) (bool, error) {
		switch {
		case c.RevokedAt != nil:
			return false, fmt.Errorf("%w: credential %s", ErrRevoked, c.ID)
		case !now.Before(c.ExpiresAt):
			return false, fmt.Errorf("%w: credential %s", ErrExpired, c.ID)
		case exhausted(c):
			return false, fmt.Errorf("%w: credential %s was used %d of %d times", ErrExhausted, c.ID, c.Uses, c.MaxUses)
		}
		c.Uses++
		return true, nil
	})
}

// KeyBan returns a banned principal that holds the node key pub, or nil
// when none does. A ban follows the key: a caller refuses a banned key
// under any principal id, so that a banned node cannot come back under a
// new node id with the same key. When several banned principals hold the
// key, the one with the smallest id is returned. ErrInvalidArgument for a
// key that is not 32 bytes.
func (is *Issuer) KeyBan(ctx context.Context, pub ed25519.PublicKey) (*Principal, error) {
	id := KeyID(pub)
	if id == "" {
		return nil, fmt.Errorf("%w: public key has %d bytes, want %d", ErrInvalidArgument, len(pub), ed25519.PublicKeySize)
	}
	ps, err := is.store.PrincipalsByKey(ctx, id)
	if err != nil {
		return nil, fmt.Errorf("principals of key %s: %w", id, err)
	}
	var banned *Principal
	for _, p := range ps {
		if p.Banned && p.KeyID == id && (banned == nil || cmp.Less(p.ID, banned.ID)) {
			banned = p
		}
	}
	return banned, nil
}

// KeySharers returns the principals other than p that hold p's node
// key, in the store's order (none for a principal without a key). A ban
// follows the key: whoever bans or unbans p should do the same to these,
// so that no principal keeps working under a key that was banned.
func (is *Issuer) KeySharers(ctx context.Context, p *Principal) ([]*Principal, error) {
	if p.KeyID == "" {
		return nil, nil
	}
	ps, err := is.store.PrincipalsByKey(ctx, p.KeyID)
	if err != nil {
		return nil, fmt.Errorf("principals of key %s: %w", p.KeyID, err)
	}
	out := ps[:0]
	for _, q := range ps {
		if q.ID != p.ID && q.KeyID == p.KeyID {
			out = append(out, q)
		}
	}
	return out, nil
}

// Renew replaces a credential with a new one for the same principal and
// scopes, living ttl (0 means Config.DefaultTTL), and
// returns the new token, as Rotate does: the old credential records the
// new one in RotatedTo and keeps working for grace, or until it would
// have expired anyway. Unlike Rotate, a credential renewed already may be
// renewed again while it still verifies (within its grace, as when the
// answer to the first renewal was lost): the credential the earlier
// renewal made is revoked, so that one successor at most lives, and the
// old credential's end is never pushed back. The limit of uses and the
// uses counted carry over.
//
// ErrNotFound; ErrRevoked or ErrExpired for a credential that no longer
// verifies; ErrInvalidArgument for a negative ttl or grace.
func (is *Issuer) Renew(ctx context.Context, credentialID string, ttl, grace time.Duration) (newToken string, c *Credential, err error) {
	if ttl < 0 || grace < 0 {
		return "", nil, fmt.Errorf("%w: negative ttl %v or grace %v", ErrInvalidArgument, ttl, grace)
	}
	old, err := is.getCredential(ctx, credentialID)
	if err != nil {
		return "", nil, fmt.Errorf("credential %q: %w", credentialID, err)
	}
	now := is.now()
	if err := renewable(old, now); err != nil {
		return "", nil, err
	}
	if ttl == 0 {
		ttl = is.ttl
	}
	token, nc, err := is.mint(ctx, old.PrincipalID, old.Scopes, ttl, now, old.MaxUses, old.Uses)
	if err != nil {
		return "", nil, err
	}
	end := now.Add(grace).Truncate(time.Microsecond)
	var superseded string
	_, err = is.updateCredential(ctx, credentialID, func(c *Credential) (bool, error) {
		if err := renewable(c, now); err != nil {
			return false, err
		}
		superseded = c.RotatedTo
		c.RotatedTo = nc.ID
		if end.Before(c.ExpiresAt) {
			c.ExpiresAt = end
		}
		return true, nil
	})
	if err == nil && superseded != "" {
		_, err = is.Revoke(ctx, superseded)
	}
	if err != nil {
		if _, rerr := is.Revoke(ctx, nc.ID); rerr != nil {
			err = errors.Join(err, fmt.Errorf("revoking the unused credential %s: %w", nc.ID, rerr))
		}
		return "", nil, err
	}
	return token, nc, nil
}

func renewable(c *Credential, now time.Time) error {
	switch {
	case c.RevokedAt != nil:
		return fmt.Errorf("%w: credential %s", ErrRevoked, c.ID)
	case !now.Before(c.ExpiresAt):
		return fmt.Errorf("%w: credential %s", ErrExpired, c.ID)
	}
	return nil
}
