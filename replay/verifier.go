package replay

import (
	"context"
	"crypto/ed25519"
	"encoding/base64"
	"errors"
	"fmt"
	"net/http"
	"time"
)

// VerifierConfig holds a Verifier's optional settings. A nil
// *VerifierConfig means all defaults.
type VerifierConfig struct {
	// Window bounds both |now - created| and expires - created (whole
	// seconds of it). Defaults to, and is capped at, MaxWindow (300 s).
	Window time.Duration
	// Now is the clock. Defaults to time.Now.
	Now func() time.Time
}

// Verifier checks signed worker requests against the nodelane profile and
// consumes their nonces. It is safe for concurrent use, and several
// Verifiers (on several replicas) may share one Store.
type Verifier struct {
	nonces Store
	cfg    VerifierConfig
}

// NewVerifier returns a Verifier whose nonces live in nonces. cfg may be nil.
func NewVerifier(nonces Store, cfg *VerifierConfig) *Verifier {
	var c VerifierConfig
	if cfg != nil {
		c = *cfg
	}
	if c.Window <= 0 || c.Window > MaxWindow {
		c.Window = MaxWindow
	}
	if c.Now == nil {
		c.Now = time.Now
	}
	return &Verifier{nonces: nonces, cfg: c}
}

// now is the Verifier's clock in UTC, truncated to microseconds so that
// every store round-trips it exactly.
func (v *Verifier) now() time.Time { return v.cfg.Now().UTC().Truncate(time.Microsecond) }

// Verified describes a signature that verified.
type Verified struct {
	// KeyID is the signer's keyid.
	KeyID string
	// Nonce is the signature's nonce, as sent (unpadded base64url).
	Nonce string
	// Created and Expires are the signature's times, in UTC.
	Created time.Time
	Expires time.Time
}

// Verify checks the signature of r, received by a server with body body,
// for the node nodeID whose registered key is pub, then consumes its nonce
// in the Store with ctx (so within the transaction ctx carries, if
// the store joins it). It is Check then Consume.
func (v *Verifier) Verify(ctx context.Context, r *http.Request, body []byte, nodeID string, pub ed25519.PublicKey) (*Verified, error) {
	vd, err := v.Check(r, body, pub)
	if err != nil {
		return nil, err
	}
	if err := v.Consume(ctx, nodeID, vd.Nonce, vd.Expires); err != nil {
		return nil, err
	}
	return vd, nil
}

// Check does everything Verify does but consume the nonce. Its checks run
// in this order, and the first failure is returned:
//
//   - presence: Signature, Signature-Input and Content-Digest are there
//     (ErrMissingSignature);
//   - syntax and profile: the fields parse without duplicates, one
//     Content-Digest field line, a signature labelled Label covering
//     exactly the profile's components, with exactly the parameters
//     created and expires (integers), nonce (MinNonceSize to MaxNonceSize
//     bytes in canonical unpadded base64url), keyid and tag (Tag)
//     (ErrMalformedSignature);
//   - digest: Content-Digest is body's sha-256 or sha-512, and nothing
//     else (ErrBadDigest);
//   - keyid is KeyID(pub), and the signature verifies (ErrBadSignature);
//   - window: |now - created| <= Window, created < expires <= created +
//     Window, and now < expires (ErrStaleTimestamp).
//
// A caller that must consume the nonce whatever happens next, so that a
// replay never runs late, calls Check, then Consume with the nonce and
// expiry it returns.
func (v *Verifier) Check(r *http.Request, body []byte, pub ed25519.PublicKey) (*Verified, error) {
	return v.check(r, pub, func(field string) error { return CheckContentDigest(field, body) })
}

// CheckStream is Check for a body too large to hold: it checks everything
// Check does, in the same order, but the digest's value, which needs the
// body. The Content-Digest field must parse and name sha-256 or sha-512
// only (the errors of CheckContentDigest); the returned BodyDigest then
// checks the body as the caller streams it through, and its Check tells
// whether the body was the one signed. A caller must not act on the body
// (keep it, answer for it) before BodyDigest.Check returned nil; the
// nonce may be consumed at once, since the headers verified.
func (v *Verifier) CheckStream(r *http.Request, pub ed25519.PublicKey) (*Verified, *BodyDigest, error) {
	var d *BodyDigest
	vd, err := v.check(r, pub, func(field string) error {
		var err error
		d, err = NewBodyDigest(field)
		return err
	})
	if err != nil {
		return nil, nil, err
	}
	return vd, d, nil
}

// check is Check with the digest check digest of the Content-Digest field.
func (v *Verifier) check(r *http.Request, pub ed25519.PublicKey, digest func(field string) error) (*Verified, error) {
	h := r.Header
	if len(h.Values("Signature")) == 0 || len(h.Values("Signature-Input")) == 0 {
		return nil, fmt.Errorf("%w: request needs Signature and Signature-Input", ErrMissingSignature)
	}
	cd := h.Values("Content-Digest")
	if len(cd) == 0 {
		return nil, fmt.Errorf("%w: request needs Content-Digest", ErrMissingSignature)
	}
	ps, err := parseProfile(h)
	if err != nil {
		return nil, err
	}
	if len(cd) > 1 {
		return nil, fmt.Errorf("%w: Content-Digest has %d field lines", ErrMalformedSignature, len(cd))
	}
	if err := digest(cd[0]); err != nil {
		return nil, err
	}
	if len(pub) != ed25519.PublicKeySize {
		return nil, fmt.Errorf("%w: Ed25519 public key has %d bytes, not %d", ErrBadSignature, len(pub), ed25519.PublicKeySize)
	}
	if ps.keyID != KeyID(pub) {
		return nil, fmt.Errorf("%w: keyid %q is not the caller's key", ErrBadSignature, ps.keyID)
	}
	if err := VerifyRequest(r, ps.sig, pub); err != nil {
		return nil, err
	}
	now := v.now()
	created, expires := time.Unix(ps.created, 0).UTC(), time.Unix(ps.expires, 0).UTC()
	w := v.cfg.Window
	if d := now.Sub(created); d > w || d < -w {
		return nil, fmt.Errorf("%w: created %d is more than %s from now", ErrStaleTimestamp, ps.created, w)
	}
	if ps.expires <= ps.created || ps.expires-ps.created > int64(w/time.Second) {
		return nil, fmt.Errorf("%w: expires %d is not within %s after created %d", ErrStaleTimestamp, ps.expires, w, ps.created)
	}
	if !now.Before(expires) {
		return nil, fmt.Errorf("%w: signature expired at %d", ErrStaleTimestamp, ps.expires)
	}
	return &Verified{KeyID: ps.keyID, Nonce: ps.nonce, Created: created, Expires: expires}, nil
}

// Consume records nonce as used by nodeID until expires, in the Store
// with ctx. It returns an error wrapping ErrReplayedNonce or ErrQuota as
// the store reports them, and ErrUnavailable wrapping any other store
// error: a store that cannot answer never lets a request pass. When the
// store reports ErrAborted the error matches it as well: the transaction
// ctx carries is lost, and the caller may run it again whole; Consume
// never retries.
func (v *Verifier) Consume(ctx context.Context, nodeID, nonce string, expires time.Time) error {
	err := v.nonces.Insert(ctx, nodeID, nonce, expires.UTC().Truncate(time.Microsecond), v.now())
	switch {
	case err == nil:
		return nil
	case errors.Is(err, ErrReplayedNonce), errors.Is(err, ErrQuota), errors.Is(err, ErrUnavailable):
		return err
	}
	return fmt.Errorf("%w: %w", ErrUnavailable, err)
}

// Collect deletes the nonces that expired more than one Window ago, and
// returns how many. Keeping them that long past their expiry lets a
// replica whose clock runs up to one Window behind still see them. A
// maintainer calls it now and then; a MemoryStore also collects as it
// goes.
func (v *Verifier) Collect(ctx context.Context) (int, error) {
	n, err := v.nonces.Collect(ctx, v.now().Add(-v.cfg.Window))
	if err != nil && !errors.Is(err, ErrUnavailable) {
		err = fmt.Errorf("%w: %w", ErrUnavailable, err)
	}
	return n, err
}

// profileSignature is a signature that follows the profile's syntax.
type profileSignature struct {
	sig              *Signature
	created, expires int64
	nonce, keyID     string
}

// nonceEncoding rejects padding and non-canonical trailing bits, so that
// one nonce has one spelling.
var nonceEncoding = base64.RawURLEncoding.Strict()

// parseProfile reads the Label signature of h and checks it against the
// profile, but neither the digest nor the signature nor the times. Every
// error wraps ErrMissingSignature or ErrMalformedSignature.
func parseProfile(h http.Header) (*profileSignature, error) {
	sig, err := ParseSignature(h, Label)
	if err != nil {
		return nil, err
	}
	p := sig.Params
	if len(p.Components) != len(profileComponents) {
		return nil, fmt.Errorf("%w: signature covers %q, not %q", ErrMalformedSignature, p.Components, profileComponents)
	}
	for i, c := range p.Components {
		if c != profileComponents[i] {
			return nil, fmt.Errorf("%w: signature covers %q, not %q", ErrMalformedSignature, p.Components, profileComponents)
		}
	}
	ps := &profileSignature{sig: sig}
	var seen [5]bool
	var tag string
	for _, x := range p.Params {
		var i int
		var ok bool
		switch x.Name {
		case "created":
			i = 0
			ps.created, ok = x.Value.(int64)
		case "expires":
			i = 1
			ps.expires, ok = x.Value.(int64)
		case "nonce":
			i = 2
			ps.nonce, ok = x.Value.(string)
		case "keyid":
			i = 3
			ps.keyID, ok = x.Value.(string)
		case "tag":
			i = 4
			tag, ok = x.Value.(string)
		default:
			return nil, fmt.Errorf("%w: parameter %q is not allowed", ErrMalformedSignature, x.Name)
		}
		if !ok {
			return nil, fmt.Errorf("%w: parameter %s has a value of the wrong type", ErrMalformedSignature, x.Name)
		}
		if seen[i] {
			return nil, fmt.Errorf("%w: parameter %s is repeated", ErrMalformedSignature, x.Name)
		}
		seen[i] = true
	}
	for i, name := range [...]string{"created", "expires", "nonce", "keyid", "tag"} {
		if !seen[i] {
			return nil, fmt.Errorf("%w: parameter %s is missing", ErrMalformedSignature, name)
		}
	}
	if tag != Tag {
		return nil, fmt.Errorf("%w: tag %q is not %q", ErrMalformedSignature, tag, Tag)
	}
	if err := checkNonce(ps.nonce); err != nil {
		return nil, err
	}
	return ps, nil
}

func checkNonce(n string) error {
	if len(n) < nonceEncoding.EncodedLen(MinNonceSize) || len(n) > nonceEncoding.EncodedLen(MaxNonceSize) {
		return fmt.Errorf("%w: nonce has %d characters, not %d to %d", ErrMalformedSignature, len(n),
			nonceEncoding.EncodedLen(MinNonceSize), nonceEncoding.EncodedLen(MaxNonceSize))
	}
	var buf [MaxNonceSize]byte
	if _, err := nonceEncoding.Decode(buf[:], []byte(n)); err != nil {
		return fmt.Errorf("%w: nonce is not canonical unpadded base64url: %v", ErrMalformedSignature, err)
	}
	return nil
}
