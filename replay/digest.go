package replay

import (
	"crypto/sha256"
	"crypto/sha512"
	"crypto/subtle"
	"encoding/base64"
	"fmt"
	"hash"

	"github.com/dunglas/httpsfv"
)

// Content-Digest algorithms (RFC 9530) that ContentDigest computes and
// CheckContentDigest accepts.
const (
	DigestSHA256 = "sha-256"
	DigestSHA512 = "sha-512"
)

// ContentDigest returns the Content-Digest field value of body for alg,
// DigestSHA256 or DigestSHA512, such as "sha-256=:...:".
func ContentDigest(alg string, body []byte) (string, error) {
	sum, err := digest(alg, body)
	if err != nil {
		return "", err
	}
	return alg + "=:" + base64.StdEncoding.EncodeToString(sum) + ":", nil
}

func digest(alg string, body []byte) ([]byte, error) {
	switch alg {
	case DigestSHA256:
		s := sha256.Sum256(body)
		return s[:], nil
	case DigestSHA512:
		s := sha512.Sum512(body)
		return s[:], nil
	}
	return nil, fmt.Errorf("%w: digest algorithm %q is not sha-256 or sha-512", ErrBadDigest, alg)
}

// CheckContentDigest checks the Content-Digest field value field (its
// field lines combined) against body. Every member must be a sha-256 or
// sha-512 digest of body, and there must be at least one.
//
// It returns ErrMalformedSignature if field does not parse as a
// dictionary of byte sequences without parameters or names an algorithm
// twice, and ErrBadDigest if it has no member, a member of another
// algorithm, or a digest that is not body's.
func CheckContentDigest(field string, body []byte) error {
	want, err := parseContentDigest(field)
	if err != nil {
		return err
	}
	for _, w := range want {
		got, err := digest(w.alg, body)
		if err != nil {
			return err
		}
		// The body is no secret; the constant-time compare is only the
		// shortest correct one.
		if subtle.ConstantTimeCompare(got, w.sum) != 1 {
			return fmt.Errorf("%w: %s digest is not the body's", ErrBadDigest, w.alg)
		}
	}
	return nil
}

// memberDigest is one member of a Content-Digest field.
type memberDigest struct {
	alg string
	sum []byte
}

// parseContentDigest parses a Content-Digest field value and checks that
// it names sha-256 or sha-512 only, at least one, with the errors
// CheckContentDigest documents.
func parseContentDigest(field string) ([]memberDigest, error) {
	d, err := parseDictionary([]string{field})
	if err != nil {
		return nil, fmt.Errorf("%w: Content-Digest: %v", ErrMalformedSignature, err)
	}
	names := d.Names()
	for _, alg := range names {
		m, _ := d.Get(alg)
		it, ok := m.(httpsfv.Item)
		if !ok {
			return nil, fmt.Errorf("%w: Content-Digest member %s is an inner list", ErrMalformedSignature, alg)
		}
		if _, ok := it.Value.([]byte); !ok || (it.Params != nil && len(it.Params.Names()) > 0) {
			return nil, fmt.Errorf("%w: Content-Digest member %s is not a byte sequence without parameters", ErrMalformedSignature, alg)
		}
	}
	if len(names) == 0 {
		return nil, fmt.Errorf("%w: Content-Digest is empty", ErrBadDigest)
	}
	out := make([]memberDigest, 0, len(names))
	for _, alg := range names {
		if alg != DigestSHA256 && alg != DigestSHA512 {
			return nil, fmt.Errorf("%w: digest algorithm %q is not sha-256 or sha-512", ErrBadDigest, alg)
		}
		m, _ := d.Get(alg)
		out = append(out, memberDigest{alg: alg, sum: m.(httpsfv.Item).Value.([]byte)})
	}
	return out, nil
}

// BodyDigest checks a body against a Content-Digest field as the body
// is written to it in pieces, for a body too large to hold (see
// Verifier.CheckStream). It is not safe for concurrent use.
type BodyDigest struct {
	want []memberDigest
	hs   []hash.Hash
}

// NewBodyDigest returns a BodyDigest for the Content-Digest field value
// field, or the error CheckContentDigest gives for a field that does not
// parse or names another algorithm than sha-256 and sha-512.
func NewBodyDigest(field string) (*BodyDigest, error) {
	want, err := parseContentDigest(field)
	if err != nil {
		return nil, err
	}
	d := &BodyDigest{want: want}
	for _, w := range want {
		if w.alg == DigestSHA256 {
			d.hs = append(d.hs, sha256.New())
		} else {
			d.hs = append(d.hs, sha512.New())
		}
	}
	return d, nil
}

// Write adds p to the body; it never fails.
func (d *BodyDigest) Write(p []byte) (int, error) {
	for _, h := range d.hs {
		h.Write(p)
	}
	return len(p), nil
}

// Check reports whether the body written so far is the one the field
// names: nil, or an error wrapping ErrBadDigest.
func (d *BodyDigest) Check() error {
	for i, w := range d.want {
		if subtle.ConstantTimeCompare(d.hs[i].Sum(nil), w.sum) != 1 {
			return fmt.Errorf("%w: %s digest is not the body's", ErrBadDigest, w.alg)
		}
	}
	return nil
}

// Declared returns the digest the field declares for alg (DigestSHA256
// or DigestSHA512), or nil when it declares none for alg.
func (d *BodyDigest) Declared(alg string) []byte {
	for _, w := range d.want {
		if w.alg == alg {
			return append([]byte(nil), w.sum...)
		}
	}
	return nil
}
