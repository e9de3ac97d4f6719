package replay

import (
	"crypto/sha256"
	"crypto/sha512"
	"crypto/subtle"
	"encoding/base64"
	"fmt"

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
	d, err := parseDictionary([]string{field})
	if err != nil {
		return fmt.Errorf("%w: Content-Digest: %v", ErrMalformedSignature, err)
	}
	names := d.Names()
	for _, alg := range names {
		m, _ := d.Get(alg)
		it, ok := m.(httpsfv.Item)
		if !ok {
			return fmt.Errorf("%w: Content-Digest member %s is an inner list", ErrMalformedSignature, alg)
		}
		if _, ok := it.Value.([]byte); !ok || (it.Params != nil && len(it.Params.Names()) > 0) {
			return fmt.Errorf("%w: Content-Digest member %s is not a byte sequence without parameters", ErrMalformedSignature, alg)
		}
	}
	if len(names) == 0 {
		return fmt.Errorf("%w: Content-Digest is empty", ErrBadDigest)
	}
	for _, alg := range names {
		m, _ := d.Get(alg)
		got := m.(httpsfv.Item).Value.([]byte)
		want, err := digest(alg, body)
		if err != nil {
			return err
		}
		// The body is no secret; the constant-time compare is only the
		// shortest correct one.
		if subtle.ConstantTimeCompare(got, want) != 1 {
			return fmt.Errorf("%w: %s digest is not the body's", ErrBadDigest, alg)
		}
	}
	return nil
}
