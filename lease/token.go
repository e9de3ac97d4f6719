package lease

import (
	"crypto/sha256"
	"crypto/subtle"
	"encoding/binary"
	"encoding/hex"
	"fmt"
	"hash/crc32"
	"io"
	"math/big"
	"strings"
	"time"
)

// TokenPrefix starts every lease token.
const TokenPrefix = "nll_"

const (
	tokenSecretLen = 32 // bytes of randomness: 256 bits
	tokenBodyLen   = 43 // base62 digits for 32 bytes: 62^43 > 2^256
	tokenCRCLen    = 6  // base62 digits for a CRC32: 62^6 > 2^32
	// TokenLen is the length of every lease token.
	TokenLen = len(TokenPrefix) + tokenBodyLen + tokenCRCLen
)

const base62Alphabet = "0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz"

// newToken returns a fresh lease token and the SHA-256 the store keeps.
func newToken(rand io.Reader) (token string, hash []byte, err error) {
	var secret [tokenSecretLen]byte
	if _, err := io.ReadFull(rand, secret[:]); err != nil {
		return "", nil, fmt.Errorf("lease: reading randomness: %w", err)
	}
	head := TokenPrefix + base62(new(big.Int).SetBytes(secret[:]), tokenBodyLen)
	token = head + base62(big.NewInt(int64(crc32.ChecksumIEEE([]byte(head)))), tokenCRCLen)
	h := sha256.Sum256([]byte(token))
	return token, h[:], nil
}

// checkToken reports whether token has the shape of a lease token and a
// correct checksum. It consults no store.
func checkToken(token string) error {
	if len(token) != TokenLen || !strings.HasPrefix(token, TokenPrefix) {
		return ErrMalformedToken
	}
	v, ok := unbase62(token[len(TokenPrefix) : len(TokenPrefix)+tokenBodyLen])
	if !ok || v.BitLen() > 8*tokenSecretLen {
		return ErrMalformedToken
	}
	crc, ok := unbase62(token[len(TokenPrefix)+tokenBodyLen:])
	if !ok || !crc.IsUint64() || crc.Uint64() != uint64(crc32.ChecksumIEEE([]byte(token[:len(token)-tokenCRCLen]))) {
		return ErrMalformedToken
	}
	return nil
}

// tokenMatches compares token's SHA-256 with hash in constant time.
func tokenMatches(token string, hash []byte) bool {
	h := sha256.Sum256([]byte(token))
	return len(hash) == len(h) && subtle.ConstantTimeCompare(h[:], hash) == 1
}

// base62 writes v as exactly n base62 digits, most significant first.
func base62(v *big.Int, n int) string {
	b := make([]byte, n)
	base := big.NewInt(62)
	v = new(big.Int).Set(v)
	r := new(big.Int)
	for i := n - 1; i >= 0; i-- {
		v.QuoRem(v, base, r)
		b[i] = base62Alphabet[r.Int64()]
	}
	return string(b)
}

func unbase62(s string) (*big.Int, bool) {
	v := new(big.Int)
	base := big.NewInt(62)
	for i := 0; i < len(s); i++ {
		d := strings.IndexByte(base62Alphabet, s[i])
		if d < 0 {
			return nil, false
		}
		v.Mul(v, base).Add(v, big.NewInt(int64(d)))
	}
	return v, true
}

// newID returns prefix + 32 hex digits: 48 bits of milliseconds since the
// Unix epoch, then 80 random bits, so ids sort by creation time.
func newID(prefix string, now time.Time, rand io.Reader) (string, error) {
	var b [16]byte
	binary.BigEndian.PutUint64(b[:8], uint64(now.UnixMilli())<<16) // b[6:8] are overwritten next
	if _, err := io.ReadFull(rand, b[6:]); err != nil {
		return "", fmt.Errorf("lease: reading randomness: %w", err)
	}
	return prefix + hex.EncodeToString(b[:]), nil
}
