package receipts

import (
	"crypto/ed25519"
	"encoding/base64"
	"errors"
	"fmt"
	"io"
	"strconv"
	"strings"
	"unicode"
	"unicode/utf8"

	"golang.org/x/mod/sumdb/note"
	"golang.org/x/mod/sumdb/tlog"
)

// Checkpoint is a signed statement of the log's size and root.
type Checkpoint struct {
	Origin string
	Size   int64
	Root   tlog.Hash
	// Note is the signed note: the checkpoint body, a blank line and the
	// signature lines. It is what the wire calls a checkpoint.
	Note []byte
}

// Tree returns the tree the checkpoint commits to.
func (c *Checkpoint) Tree() Tree { return Tree{Size: c.Size, Root: c.Root} }

// FormatCheckpoint returns the C2SP tlog-checkpoint body that nodelane
// writes: exactly three lines, the origin, the tree size in decimal and
// the root hash in standard base64, each ending in a newline, and no
// extension lines.
func FormatCheckpoint(origin string, t Tree) []byte {
	return fmt.Appendf(nil, "%s\n%d\n%s\n", origin, t.Size, base64.StdEncoding.EncodeToString(t.Root[:]))
}

// ParseCheckpoint parses a checkpoint body and returns its origin and
// tree. It accepts only what FormatCheckpoint writes: a body with
// extension or blank lines, a size with a sign or leading zeros, a root
// that is not 32 bytes of canonical base64, or a missing final newline is
// ErrBadCheckpoint.
func ParseCheckpoint(body []byte) (origin string, t Tree, err error) {
	bad := func(why string) (string, Tree, error) {
		return "", Tree{}, fmt.Errorf("%w: %s", ErrBadCheckpoint, why)
	}
	lines := strings.Split(string(body), "\n")
	if len(lines) != 4 || lines[3] != "" {
		return bad("the body must be exactly three lines: origin, size, root")
	}
	origin = lines[0]
	if err := checkOrigin(origin); err != nil {
		return "", Tree{}, err
	}
	n, err := strconv.ParseInt(lines[1], 10, 64)
	if err != nil || n < 0 || strconv.FormatInt(n, 10) != lines[1] {
		return bad("the size is not a decimal number")
	}
	h, err := base64.StdEncoding.Strict().DecodeString(lines[2])
	if err != nil || len(h) != tlog.HashSize || base64.StdEncoding.EncodeToString(h) != lines[2] {
		return bad("the root is not a base64 SHA-256 hash")
	}
	t = Tree{Size: n}
	copy(t.Root[:], h)
	return origin, t, nil
}

// checkOrigin accepts an origin a checkpoint's first line can carry:
// non-empty UTF-8 without spaces, control characters or pluses (the
// characters a note key name cannot have).
func checkOrigin(origin string) error {
	if origin == "" || !utf8.ValidString(origin) || strings.ContainsFunc(origin, func(r rune) bool {
		return unicode.IsSpace(r) || unicode.IsControl(r) || r == '+'
	}) {
		return fmt.Errorf("%w: origin %q must be non-empty UTF-8 without spaces, control characters or '+'", ErrBadCheckpoint, origin)
	}
	return nil
}

// SignCheckpoint signs the checkpoint of tree t under origin as a note.
func SignCheckpoint(signer note.Signer, origin string, t Tree) (*Checkpoint, error) {
	if err := checkOrigin(origin); err != nil {
		return nil, err
	}
	msg, err := note.Sign(&note.Note{Text: string(FormatCheckpoint(origin, t))}, signer)
	if err != nil {
		return nil, fmt.Errorf("receipts: sign checkpoint: %w", err)
	}
	return &Checkpoint{Origin: origin, Size: t.Size, Root: t.Root, Note: msg}, nil
}

// OpenCheckpoint verifies a signed checkpoint with the note verifier key
// verifierKey (name+hash+base64, what PROTOCOL calls receipt_public_key)
// and parses its body, which must name origin. Signatures by other keys
// (a witness's cosignature, say) are allowed and ignored. Errors:
// ErrUnknownKey if no signature is by the key, ErrBadSignature if the
// key's signature does not verify, ErrBadCheckpoint if the note or its
// body is malformed or names another origin, ErrInvalidArgument if
// verifierKey is not a verifier key.
func OpenCheckpoint(signed []byte, verifierKey, origin string) (*Checkpoint, error) {
	v, err := note.NewVerifier(verifierKey)
	if err != nil {
		return nil, fmt.Errorf("%w: verifier key: %v", ErrInvalidArgument, err)
	}
	return openCheckpoint(signed, v, origin)
}

func openCheckpoint(signed []byte, v note.Verifier, origin string) (*Checkpoint, error) {
	n, err := note.Open(signed, note.VerifierList(v))
	if err != nil {
		var unverified *note.UnverifiedNoteError
		var invalid *note.InvalidSignatureError
		switch {
		case errors.As(err, &unverified):
			return nil, fmt.Errorf("%w: no signature by %s+%08x", ErrUnknownKey, v.Name(), v.KeyHash())
		case errors.As(err, &invalid):
			return nil, fmt.Errorf("%w: by %s+%08x", ErrBadSignature, invalid.Name, invalid.Hash)
		}
		return nil, fmt.Errorf("%w: %v", ErrBadCheckpoint, err)
	}
	got, t, err := ParseCheckpoint([]byte(n.Text))
	if err != nil {
		return nil, err
	}
	if got != origin {
		return nil, fmt.Errorf("%w: origin is %q, want %q", ErrBadCheckpoint, got, origin)
	}
	return &Checkpoint{Origin: got, Size: t.Size, Root: t.Root, Note: signed}, nil
}

// GenerateKey returns a new Ed25519 note signer key (secret) and its
// verifier key (the receipt_public_key), named name; the origin is the
// usual name.
func GenerateKey(rand io.Reader, name string) (signerKey, verifierKey string, err error) {
	if err := checkOrigin(name); err != nil {
		return "", "", fmt.Errorf("%w: key name: %v", ErrInvalidArgument, err)
	}
	return note.GenerateKey(rand, name)
}

// VerifierKey returns the verifier key of an Ed25519 note signer key, so
// that a host that keeps only the signer key can publish the other.
func VerifierKey(signerKey string) (string, error) {
	// PRIVATE+KEY+<name>+<hash>+<base64(0x01 || seed)>
	parts := strings.SplitN(signerKey, "+", 5) // base64 has '+' too
	if len(parts) != 5 || parts[0] != "PRIVATE" || parts[1] != "KEY" {
		return "", fmt.Errorf("%w: not a note signer key", ErrInvalidArgument)
	}
	if _, err := note.NewSigner(signerKey); err != nil {
		return "", fmt.Errorf("%w: signer key: %v", ErrInvalidArgument, err)
	}
	key, err := base64.StdEncoding.DecodeString(parts[4])
	if err != nil || len(key) != 1+ed25519.SeedSize || key[0] != 1 {
		return "", fmt.Errorf("%w: not an Ed25519 note signer key", ErrInvalidArgument)
	}
	pub := ed25519.NewKeyFromSeed(key[1:]).Public().(ed25519.PublicKey)
	return note.NewEd25519VerifierKey(parts[2], pub)
}
