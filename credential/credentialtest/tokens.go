package credentialtest

import (
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"hash/crc32"
	"math/big"
	"strings"
	"testing"
	"time"

	"github.com/nodelane/nodelane/credential"
)

var tokenTests = []test{
	{"TokenFormat", testTokenFormat},
	{"UnknownIDLikeWrongSecret", testUnknownIDLikeWrongSecret},
	{"NoSecretsInRows", testNoSecretsInRows},
	{"PepperVersions", testPepperVersions},
}

// The token format of PROTOCOL.md, section 2.1, checked with an independent decoder.
func testTokenFormat(t *testing.T, f *fixture) {
	p := f.principal(credential.KindNode, "n")
	seen := map[string]bool{}
	for range 20 {
		tok, c := f.mint(p.ID, 0, credential.ScopeNodePoll)
		if len(tok) != credential.TokenLen || !strings.HasPrefix(tok, credential.TokenPrefix) {
			t.Fatalf("token %q: length %d, want %d with prefix %s", tok, len(tok), credential.TokenLen, credential.TokenPrefix)
		}
		if m := credential.TokenPattern.FindAllString("token="+tok+"\n", -1); len(m) != 1 || m[0] != tok {
			t.Fatalf("TokenPattern found %q in a line holding %q", m, tok)
		}
		id, _ := decodeToken(t, tok)
		if hex.EncodeToString(id) != c.ID {
			t.Fatalf("token carries id %x, credential is %s", id, c.ID)
		}
		if pid, err := credential.ParseToken(tok); err != nil || pid != c.ID {
			t.Fatalf("ParseToken = %q, %v; want %s", pid, err, c.ID)
		}
		if seen[tok] || seen[c.ID] {
			t.Fatalf("token or id repeated: %s", c.ID)
		}
		seen[tok], seen[c.ID] = true, true
	}
}

// An unknown id and a wrong secret give the same error, so a caller cannot
// learn which credential ids exist.
func testUnknownIDLikeWrongSecret(t *testing.T, f *fixture) {
	p := f.principal(credential.KindNode, "n")
	tok, _ := f.mint(p.ID, 0, credential.ScopeNodePoll)
	id, secret := decodeToken(t, tok)
	otherID := append([]byte(nil), id...)
	otherID[0] ^= 1
	otherSecret := append([]byte(nil), secret...)
	otherSecret[31] ^= 1
	unknownID := encodeToken(otherID, secret)
	wrongSecret := encodeToken(id, otherSecret)
	if encodeToken(id, secret) != tok {
		t.Fatalf("the suite's encoder disagrees with the Issuer:\n%s\n%s", encodeToken(id, secret), tok)
	}
	_, _, errID := f.is.Verify(f.ctx, unknownID, credential.ScopeNodePoll)
	_, _, errSecret := f.is.Verify(f.ctx, wrongSecret, credential.ScopeNodePoll)
	wantErr(t, "unknown id", errID, credential.ErrInvalidToken)
	wantErr(t, "wrong secret", errSecret, credential.ErrInvalidToken)
	if errID.Error() != errSecret.Error() {
		t.Fatalf("unknown id gives %q, wrong secret %q: they must not differ", errID, errSecret)
	}
	// A wrong secret says nothing about the credential's state either.
	f.revoke(mustParse(t, tok))
	_, _, err := f.is.Verify(f.ctx, wrongSecret, credential.ScopeOperatorJobs)
	wantErr(t, "wrong secret of a revoked credential", err, credential.ErrInvalidToken)
	f.refuse(f.is, "the right secret of a revoked credential", tok, credential.ScopeNodePoll, credential.ErrRevoked)
}

func mustParse(t *testing.T, tok string) string {
	t.Helper()
	id, err := credential.ParseToken(tok)
	if err != nil {
		t.Fatal(err)
	}
	return id
}

// No stored row holds a token or its secret, in any common encoding.
func testNoSecretsInRows(t *testing.T, f *fixture) {
	node := f.principal(credential.KindNode, "node")
	if _, err := f.is.SetNodeKey(f.ctx, node.ID, newKey(t)); err != nil {
		t.Fatal(err)
	}
	op := f.principal(credential.KindOperator, "op")
	var tokens []string
	for _, p := range []*credential.Principal{node, op} {
		for range 3 {
			s := credential.ScopeNodePoll
			if p.Kind == credential.KindOperator {
				s = credential.ScopeOperatorCredentials
			}
			tok, c := f.mint(p.ID, 0, s)
			tokens = append(tokens, tok)
			newTok, _, err := f.is.Rotate(f.ctx, c.ID, time.Minute)
			if err != nil {
				t.Fatal(err)
			}
			tokens = append(tokens, newTok)
		}
	}
	f.ban(node.ID, "audit")
	var rows []any
	for _, p := range []*credential.Principal{node, op} {
		sp, err := f.store.GetPrincipal(f.ctx, p.ID)
		if err != nil {
			t.Fatal(err)
		}
		rows = append(rows, sp)
		cs, err := f.store.ListCredentials(f.ctx, credential.CredentialFilter{PrincipalID: p.ID, Limit: 100})
		if err != nil {
			t.Fatal(err)
		}
		for _, c := range cs {
			gc, err := f.store.GetCredential(f.ctx, c.ID)
			if err != nil {
				t.Fatal(err)
			}
			rows = append(rows, c, gc)
		}
	}
	if len(rows) != 2+2*len(tokens) {
		t.Fatalf("read %d rows, want %d", len(rows), 2+2*len(tokens))
	}
	var dump []string
	for _, r := range rows {
		j, err := json.Marshal(r)
		if err != nil {
			t.Fatal(err)
		}
		dump = append(dump, fmt.Sprintf("%v", r), fmt.Sprintf("%+v", r), fmt.Sprintf("%#v", r), string(j))
	}
	text := strings.Join(dump, "\n")
	for _, tok := range tokens {
		_, secret := decodeToken(t, tok)
		forms := map[string]string{
			"token":                tok,
			"token body":           tok[len(credential.TokenPrefix):],
			"secret hex":           hex.EncodeToString(secret),
			"secret HEX":           strings.ToUpper(hex.EncodeToString(secret)),
			"secret base64":        base64.StdEncoding.EncodeToString(secret),
			"secret base64 raw":    base64.RawStdEncoding.EncodeToString(secret),
			"secret base64url":     base64.URLEncoding.EncodeToString(secret),
			"secret base64url raw": base64.RawURLEncoding.EncodeToString(secret),
			"secret base62":        base62(new(big.Int).SetBytes(secret), 43),
			"secret bytes":         strings.Trim(fmt.Sprint(secret), "[]"),
			"secret raw":           string(secret),
		}
		for name, form := range forms {
			if strings.Contains(text, form) {
				t.Errorf("stored rows contain the %s of a token", name)
			}
		}
		// The digest is keyed: it is not a plain hash an attacker could compute.
		for _, plain := range [][32]byte{sha256.Sum256(secret), sha256.Sum256([]byte(tok))} {
			if strings.Contains(text, hex.EncodeToString(plain[:])) || strings.Contains(text, base64.StdEncoding.EncodeToString(plain[:])) {
				t.Errorf("stored rows contain an unkeyed SHA-256 of a token")
			}
		}
	}
}

func testPepperVersions(t *testing.T, f *fixture) {
	p := f.principal(credential.KindNode, "n")
	v1 := f.is // {1: pepper(1)}
	tok1, c1 := f.mint(p.ID, 0, credential.ScopeNodePoll)
	if c1.PepperVersion != 1 {
		t.Fatalf("PepperVersion = %d, want 1", c1.PepperVersion)
	}
	both := f.issuer(map[int][]byte{1: pepper(1), 2: pepper(2)}, 0) // defaults to 2
	tok2, c2, err := both.Mint(f.ctx, p.ID, []credential.Scope{credential.ScopeNodePoll}, 0)
	if err != nil || c2.PepperVersion != 2 {
		t.Fatalf("Mint under two peppers = %+v, %v; want version 2", c2, err)
	}
	f.stored(c2)
	f.verify(both, "v1 token, both peppers", tok1, credential.ScopeNodePoll)
	f.verify(both, "v2 token, both peppers", tok2, credential.ScopeNodePoll)
	f.verify(v1, "v1 token, pepper 1", tok1, credential.ScopeNodePoll)
	f.refuse(v1, "v2 token, pepper 1 only", tok2, credential.ScopeNodePoll, credential.ErrInvalidToken)
	only2 := f.issuer(map[int][]byte{2: pepper(2)}, 2)
	f.refuse(only2, "v1 token after pepper 1 is dropped", tok1, credential.ScopeNodePoll, credential.ErrInvalidToken)
	f.verify(only2, "v2 token, pepper 2 only", tok2, credential.ScopeNodePoll)
	wrong := f.issuer(map[int][]byte{1: pepper(3)}, 1)
	f.refuse(wrong, "v1 token, another pepper 1", tok1, credential.ScopeNodePoll, credential.ErrInvalidToken)
	// Minting under version 1 explicitly, with both configured.
	pinned := f.issuer(map[int][]byte{1: pepper(1), 2: pepper(2)}, 1)
	if _, c, err := pinned.Mint(f.ctx, p.ID, []credential.Scope{credential.ScopeNodePoll}, 0); err != nil || c.PepperVersion != 1 {
		t.Fatalf("Mint pinned to version 1 = %+v, %v", c, err)
	}
	// Rotation moves a credential to the current pepper.
	newTok, nc, err := both.Rotate(f.ctx, c1.ID, 0)
	if err != nil || nc.PepperVersion != 2 {
		t.Fatalf("Rotate = %+v, %v; want version 2", nc, err)
	}
	f.verify(only2, "rotated to v2", newTok, credential.ScopeNodePoll)
	// The same secret under two peppers gives two digests.
	if string(c1.Digest) == string(c2.Digest) || len(c1.Digest) != sha256.Size || len(c2.Digest) != sha256.Size {
		t.Fatalf("digests %x and %x", c1.Digest, c2.Digest)
	}
}

// decodeToken is an independent reading of the token format of PROTOCOL.md, section 2.1
// (math/big rather than the package's codec): it checks the shape and
// returns the 16-byte id and the 32-byte secret.
func decodeToken(t *testing.T, tok string) (id, secret []byte) {
	t.Helper()
	body, ok := strings.CutPrefix(tok, "nlc_")
	if !ok || len(body) != 71 {
		t.Fatalf("token %q is not nlc_ and 71 digits", tok)
	}
	v, crc := unbase62(t, body[:65]), unbase62(t, body[65:])
	if crc.Cmp(big.NewInt(int64(crc32.ChecksumIEEE([]byte(tok[:len(tok)-6]))))) != 0 {
		t.Fatalf("token %q: bad checksum", tok)
	}
	if v.BitLen() > 48*8 {
		t.Fatalf("token %q: body exceeds 48 bytes", tok)
	}
	raw := v.FillBytes(make([]byte, 48))
	return raw[:16], raw[16:]
}

// encodeToken is the inverse of decodeToken.
func encodeToken(id, secret []byte) string {
	head := "nlc_" + base62(new(big.Int).SetBytes(append(append([]byte(nil), id...), secret...)), 65)
	return head + base62(big.NewInt(int64(crc32.ChecksumIEEE([]byte(head)))), 6)
}

const alphabet = "0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz"

func base62(v *big.Int, n int) string {
	b := make([]byte, n)
	v = new(big.Int).Set(v)
	r := new(big.Int)
	for i := n - 1; i >= 0; i-- {
		v.QuoRem(v, big.NewInt(62), r)
		b[i] = alphabet[r.Int64()]
	}
	return string(b)
}

func unbase62(t *testing.T, s string) *big.Int {
	t.Helper()
	v := new(big.Int)
	for i := 0; i < len(s); i++ {
		d := strings.IndexByte(alphabet, s[i])
		if d < 0 {
			t.Fatalf("%q is not base62", s)
		}
		v.Mul(v, big.NewInt(62)).Add(v, big.NewInt(int64(d)))
	}
	return v
}
