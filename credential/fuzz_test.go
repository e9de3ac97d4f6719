package credential

import (
	"crypto/sha512"
	"errors"
	"math/big"
	"regexp"
	"strings"
	"testing"
	"unicode"
)

// FuzzParseToken checks that parsing never panics, accepts only
// well-formed tokens, and round-trips: what it accepts it formats back to
// the same string, and what formatToken writes it accepts.
func FuzzParseToken(f *testing.F) {
	// testdata/fuzz/FuzzParseToken holds the seed corpus; these add a few
	// made here.
	var id [idLen]byte
	var secret [secretLen]byte
	f.Add(formatToken(&id, &secret))
	f.Add("")
	f.Add(TokenPrefix)
	shape := regexp.MustCompile(`^nlc_[0-9A-Za-z]{71}$`)
	f.Fuzz(func(t *testing.T, s string) {
		id, secret, err := parseToken(s)
		cid, perr := ParseToken(s)
		if (err == nil) != (perr == nil) {
			t.Fatalf("parseToken err %v, ParseToken err %v", err, perr)
		}
		if err != nil {
			if !errors.Is(err, ErrInvalidToken) {
				t.Fatalf("parseToken(%q) err = %v, want ErrInvalidToken", s, err)
			}
		} else {
			if !shape.MatchString(s) || TokenPattern.FindString(s) != s {
				t.Fatalf("parseToken accepted %q, which has not the token shape", s)
			}
			if got := formatToken(&id, &secret); got != s {
				t.Fatalf("parseToken(%q) formats back to %q", s, got)
			}
			if len(cid) != 2*idLen {
				t.Fatalf("ParseToken(%q) = %q", s, cid)
			}
		}
		// With its checksum repaired, a string of the right shape parses
		// exactly when its body fits in 48 bytes: this lets the fuzzer
		// reach the body checks, which a random checksum almost never passes.
		if shape.MatchString(s) {
			fixed := withCRC(s[:TokenLen-crcLen])
			// math/big's base 62 orders its digits 0-9a-zA-Z; ours are 0-9A-Za-z.
			swapped := strings.Map(func(r rune) rune {
				switch {
				case unicode.IsUpper(r):
					return unicode.ToLower(r)
				case unicode.IsLower(r):
					return unicode.ToUpper(r)
				}
				return r
			}, s[len(TokenPrefix):TokenLen-crcLen])
			v, _ := new(big.Int).SetString(swapped, 62)
			fits := v.BitLen() <= 8*rawLen
			if _, _, err := parseToken(fixed); (err == nil) != fits {
				t.Fatalf("parseToken(%q) err = %v, body of %d bits", fixed, err, v.BitLen())
			}
		}
		// Any id and secret, here derived from s, make a token that parses back.
		sum := sha512.Sum512([]byte(s))
		copy(id[:], sum[:idLen])
		copy(secret[:], sum[idLen:])
		tok := formatToken(&id, &secret)
		gotID, gotSecret, err := parseToken(tok)
		if err != nil || gotID != id || gotSecret != secret {
			t.Fatalf("formatToken(%x, %x) = %q parses to %x, %x, %v", id, secret, tok, gotID, gotSecret, err)
		}
	})
}
