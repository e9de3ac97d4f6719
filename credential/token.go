package credential

import (
	"encoding/hex"
	"fmt"
	"hash/crc32"
	"regexp"
)

// TokenPrefix starts every credential token.
const TokenPrefix = "nlc_"

const (
	idLen     = 16                // bytes of the credential id
	secretLen = 32                // bytes of the secret: 256 bits
	rawLen    = idLen + secretLen // bytes the body encodes
	bodyLen   = 65                // base62 digits for 48 bytes: 62^64 < 2^384 <= 62^65
	crcLen    = 6                 // base62 digits for a CRC32: 62^6 > 2^32

	// TokenLen is the length of every credential token: the prefix, 65
	// digits of body and 6 of checksum.
	TokenLen = len(TokenPrefix) + bodyLen + crcLen
)

// TokenPattern matches credential tokens in free text. It is for secret
// scanners, which look for leaked tokens in code, logs and chat; a match
// whose checksum ParseToken rejects is a look-alike, not a token.
//
// The expression is RE2 syntax, which gitleaks and trufflehog both use.
// In a gitleaks configuration (.gitleaks.toml):
//
//	[[rules]]
//	id = "nodelane-credential"
//	description = "nodelane credential token"
//	regex = '''\bnlc_[0-9A-Za-z]{71}\b'''
//	keywords = ["nlc_"]
//
// As a trufflehog custom detector:
//
//	detectors:
//	  - name: nodelane-credential
//	    keywords: ["nlc_"]
//	    regex:
//	      token: '\bnlc_[0-9A-Za-z]{71}\b'
//
// In Go, TokenPattern.FindAllString(text, -1) lists the candidates.
var TokenPattern = regexp.MustCompile(`\bnlc_[0-9A-Za-z]{71}\b`)

const base62Alphabet = "0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz"

// ParseToken checks the shape and checksum of token, consulting no store,
// and returns the id of the credential it names. It is for logs and audit
// trails, which may name the credential but never show the token. It
// returns ErrInvalidToken for anything but a well-formed token.
func ParseToken(token string) (credentialID string, err error) {
	id, _, err := parseToken(token)
	if err != nil {
		return "", err
	}
	return hex.EncodeToString(id[:]), nil
}

// formatToken encodes id and secret as a token.
func formatToken(id *[idLen]byte, secret *[secretLen]byte) string {
	var raw [rawLen]byte
	copy(raw[:idLen], id[:])
	copy(raw[idLen:], secret[:])
	var b [TokenLen]byte
	copy(b[:], TokenPrefix)
	base62Encode(b[len(TokenPrefix):len(TokenPrefix)+bodyLen], raw[:])
	crc := crc32.ChecksumIEEE(b[:TokenLen-crcLen])
	for i := TokenLen - 1; i >= TokenLen-crcLen; i-- {
		b[i] = base62Alphabet[crc%62]
		crc /= 62
	}
	return string(b[:])
}

// parseToken checks the shape and checksum of token and returns the id
// and secret it carries.
func parseToken(token string) (id [idLen]byte, secret [secretLen]byte, err error) {
	if len(token) != TokenLen {
		return id, secret, fmt.Errorf("%w: length %d, want %d", ErrInvalidToken, len(token), TokenLen)
	}
	if token[:len(TokenPrefix)] != TokenPrefix {
		return id, secret, fmt.Errorf("%w: prefix is not %s", ErrInvalidToken, TokenPrefix)
	}
	for i := len(TokenPrefix); i < TokenLen; i++ {
		if base62Digit(token[i]) < 0 {
			return id, secret, fmt.Errorf("%w: byte %d is not a base62 digit", ErrInvalidToken, i)
		}
	}
	var raw [rawLen]byte
	if !base62Decode(raw[:], token[len(TokenPrefix):TokenLen-crcLen]) {
		return id, secret, fmt.Errorf("%w: body exceeds %d bytes", ErrInvalidToken, rawLen)
	}
	var crc uint64
	for i := TokenLen - crcLen; i < TokenLen; i++ {
		crc = crc*62 + uint64(base62Digit(token[i]))
	}
	var head [TokenLen - crcLen]byte
	copy(head[:], token)
	if crc != uint64(crc32.ChecksumIEEE(head[:])) {
		return id, secret, fmt.Errorf("%w: bad checksum", ErrInvalidToken)
	}
	copy(id[:], raw[:idLen])
	copy(secret[:], raw[idLen:])
	return id, secret, nil
}

// base62Encode writes the big-endian number src as exactly len(dst)
// base62 digits, most significant first, dropping any higher digits.
func base62Encode(dst, src []byte) {
	var buf [rawLen]byte
	n := buf[:copy(buf[:], src)]
	for i := len(dst) - 1; i >= 0; i-- {
		var rem uint
		for j := range n {
			v := rem<<8 | uint(n[j])
			n[j] = byte(v / 62)
			rem = v % 62
		}
		dst[i] = base62Alphabet[rem]
	}
}

// base62Decode reads the base62 digits src as a big-endian number into
// dst. It reports false if a byte is not a digit or the number does not
// fit in len(dst) bytes.
func base62Decode(dst []byte, src string) bool {
	clear(dst)
	for i := 0; i < len(src); i++ {
		d := base62Digit(src[i])
		if d < 0 {
			return false
		}
		carry := uint(d)
		for j := len(dst) - 1; j >= 0; j-- {
			v := uint(dst[j])*62 + carry
			dst[j] = byte(v)
			carry = v >> 8
		}
		if carry != 0 {
			return false
		}
	}
	return true
}

// base62Digit returns the value of the base62 digit c, or -1.
func base62Digit(c byte) int {
	switch {
	case '0' <= c && c <= '9':
		return int(c - '0')
	case 'A' <= c && c <= 'Z':
		return int(c-'A') + 10
	case 'a' <= c && c <= 'z':
		return int(c-'a') + 36
	}
	return -1
}
