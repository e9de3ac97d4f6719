package replay

import (
	"crypto/ed25519"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"fmt"
	"io"
	"net/http"
	"time"
)

// The nodelane profile of RFC 9421 (PROTOCOL.md, section 4.3).
const (
	// Label is the label of the one signature the profile reads.
	Label = "nodelane"
	// Tag is the value of the tag parameter.
	Tag = "nodelane-worker/v1"
	// MaxWindow is the longest time between created and expires, and the
	// largest difference between created and the verifier's clock.
	MaxWindow = 300 * time.Second
	// MinNonceSize and MaxNonceSize bound the bytes of a nonce.
	MinNonceSize = 16
	MaxNonceSize = 64
)

// profileComponents are the covered components of the profile, in order.
var profileComponents = [...]string{
	ComponentMethod, ComponentAuthority, ComponentPath, ComponentQuery, "content-digest", "content-type",
}

// Components returns the covered components of the profile, in order.
func Components() []string { return append([]string(nil), profileComponents[:]...) }

// KeyID returns the keyid of an Ed25519 public key: the unpadded base64url
// SHA-256 of its 32 raw bytes.
func KeyID(pub ed25519.PublicKey) string {
	sum := sha256.Sum256(pub)
	return base64.RawURLEncoding.EncodeToString(sum[:])
}

// SignerConfig holds a Signer's optional settings. A nil *SignerConfig
// means all defaults.
type SignerConfig struct {
	// Lifetime is expires minus created. Defaults to, and is capped at,
	// MaxWindow (300 s).
	Lifetime time.Duration
	// NonceSize is how many random bytes a nonce has, from MinNonceSize to
	// MaxNonceSize. Defaults to 16.
	NonceSize int
	// Now is the clock. Defaults to time.Now.
	Now func() time.Time
	// Rand is the source of nonces. Defaults to crypto/rand.Reader.
	Rand io.Reader
}

// Signer signs a worker's requests with its Ed25519 key, following the
// nodelane profile. It is safe for concurrent use if its Rand is.
type Signer struct {
	key      ed25519.PrivateKey
	keyID    string
	lifetime int64 // seconds
	cfg      SignerConfig
}

// NewSigner returns a Signer for key. cfg may be nil.
func NewSigner(key ed25519.PrivateKey, cfg *SignerConfig) *Signer {
	var c SignerConfig
	if cfg != nil {
		c = *cfg
	}
	if c.Lifetime <= 0 || c.Lifetime > MaxWindow {
		c.Lifetime = MaxWindow
	}
	if c.NonceSize < MinNonceSize || c.NonceSize > MaxNonceSize {
		c.NonceSize = MinNonceSize
	}
	if c.Now == nil {
		c.Now = time.Now
	}
	if c.Rand == nil {
		c.Rand = rand.Reader
	}
	s := &Signer{key: key, lifetime: max(int64(c.Lifetime/time.Second), 1), cfg: c}
	if len(key) == ed25519.PrivateKeySize {
		s.keyID = KeyID(key.Public().(ed25519.PublicKey))
	}
	return s
}

// KeyID returns the keyid of the Signer's key.
func (s *Signer) KeyID() string { return s.keyID }

// Sign signs r, whose body is body, created now with a fresh random
// nonce. It sets Content-Digest (sha-256), Signature-Input and Signature.
// Content-Type must already be set; r.Body is left to the caller.
func (s *Signer) Sign(r *http.Request, body []byte) error {
	nonce := make([]byte, s.cfg.NonceSize)
	if _, err := io.ReadFull(s.cfg.Rand, nonce); err != nil {
		return fmt.Errorf("replay: reading a nonce: %w", err)
	}
	return s.SignAt(r, body, s.cfg.Now(), nonce)
}

// SignAt is Sign with an explicit created time (whole seconds count) and
// nonce of MinNonceSize to MaxNonceSize bytes. Ed25519 is deterministic,
// so given the same request it gives the same signature: it reproduces
// the worked cases of the profile.
func (s *Signer) SignAt(r *http.Request, body []byte, created time.Time, nonce []byte) error {
	cd, err := ContentDigest(DigestSHA256, body)
	if err != nil {
		return err
	}
	return s.signAt(r, cd, created, nonce)
}

// SignStream is Sign for a request whose body is streamed rather than
// held in memory: sum is the SHA-256 of the body the request will carry
// (computed by a first read of it), which becomes its Content-Digest.
// The verifier checks the digest as the body arrives (Verifier.CheckStream).
func (s *Signer) SignStream(r *http.Request, sum [sha256.Size]byte) error {
	nonce := make([]byte, s.cfg.NonceSize)
	if _, err := io.ReadFull(s.cfg.Rand, nonce); err != nil {
		return fmt.Errorf("replay: reading a nonce: %w", err)
	}
	return s.signAt(r, DigestSHA256+"=:"+base64.StdEncoding.EncodeToString(sum[:])+":", s.cfg.Now(), nonce)
}

// signAt signs r, whose Content-Digest field value is cd.
func (s *Signer) signAt(r *http.Request, cd string, created time.Time, nonce []byte) error {
	if len(s.key) != ed25519.PrivateKeySize {
		return fmt.Errorf("replay: Ed25519 private key has %d bytes, not %d", len(s.key), ed25519.PrivateKeySize)
	}
	if len(nonce) < MinNonceSize || len(nonce) > MaxNonceSize {
		return fmt.Errorf("replay: nonce has %d bytes, not %d to %d", len(nonce), MinNonceSize, MaxNonceSize)
	}
	if len(r.Header.Values("Content-Type")) == 0 {
		return fmt.Errorf("replay: request has no Content-Type")
	}
	r.Header.Set("Content-Digest", cd)
	c := created.Unix()
	p := &SignatureParams{
		Components: profileComponents[:],
		Params: []Param{
			{"created", c},
			{"expires", c + s.lifetime},
			{"nonce", base64.RawURLEncoding.EncodeToString(nonce)},
			{"keyid", s.keyID},
			{"tag", Tag},
		},
	}
	return SignRequest(r, Label, p, s.key)
}
