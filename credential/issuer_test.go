package credential

import (
	"context"
	"crypto/ed25519"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"hash/crc32"
	"os"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nodelane/nodelane/internal/testclock"
)

// countingStore counts the calls that reach the store, and fails those
// that fail says to.
type countingStore struct {
	Store
	calls atomic.Int64
	fail  func(method string) error
}

func (s *countingStore) hit(method string) error {
	s.calls.Add(1)
	if s.fail != nil {
		return s.fail(method)
	}
	return nil
}

func (s *countingStore) CreatePrincipal(ctx context.Context, p *Principal) error {
	if err := s.hit("CreatePrincipal"); err != nil {
		return err
	}
	return s.Store.CreatePrincipal(ctx, p)
}

func (s *countingStore) GetPrincipal(ctx context.Context, id string) (*Principal, error) {
	if err := s.hit("GetPrincipal"); err != nil {
		return nil, err
	}
	return s.Store.GetPrincipal(ctx, id)
}

func (s *countingStore) UpdatePrincipal(ctx context.Context, p *Principal, rev int64) error {
	if err := s.hit("UpdatePrincipal"); err != nil {
		return err
	}
	return s.Store.UpdatePrincipal(ctx, p, rev)
}

func (s *countingStore) CreateCredential(ctx context.Context, c *Credential) error {
	if err := s.hit("CreateCredential"); err != nil {
		return err
	}
	return s.Store.CreateCredential(ctx, c)
}

func (s *countingStore) GetCredential(ctx context.Context, id string) (*Credential, error) {
	if err := s.hit("GetCredential"); err != nil {
		return nil, err
	}
	return s.Store.GetCredential(ctx, id)
}

func (s *countingStore) UpdateCredential(ctx context.Context, c *Credential, rev int64) error {
	if err := s.hit("UpdateCredential"); err != nil {
		return err
	}
	return s.Store.UpdateCredential(ctx, c, rev)
}

func (s *countingStore) ListCredentials(ctx context.Context, f CredentialFilter) ([]*Credential, error) {
	if err := s.hit("ListCredentials"); err != nil {
		return nil, err
	}
	return s.Store.ListCredentials(ctx, f)
}

var testPepper = []byte("nodelane test pepper, 32 bytes..")

type env struct {
	ctx   context.Context
	store *countingStore
	clock *testclock.Clock
	is    *Issuer
}

func newEnv(t testing.TB) *env {
	t.Helper()
	e := &env{
		ctx:   context.Background(),
		store: &countingStore{Store: NewMemoryStore()},
		clock: testclock.New(time.Date(2026, 11, 30, 9, 0, 0, 0, time.UTC)),
	}
	is, err := NewIssuer(e.store, &Config{Peppers: map[int][]byte{1: testPepper}, Now: e.clock.Now})
	if err != nil {
		t.Fatal(err)
	}
	e.is = is
	return e
}

func (e *env) principal(t testing.TB, id string) *Principal {
	t.Helper()
	p, err := e.is.CreatePrincipal(e.ctx, Principal{ID: id, Kind: KindNode})
	if err != nil {
		t.Fatal(err)
	}
	return p
}

func (e *env) mint(t testing.TB, principalID string, ttl time.Duration, scopes ...Scope) (string, *Credential) {
	t.Helper()
	tok, c, err := e.is.Mint(e.ctx, principalID, scopes, ttl)
	if err != nil {
		t.Fatal(err)
	}
	return tok, c
}

// withCRC appends the checksum to head, whatever head is.
func withCRC(head string) string {
	crc := crc32.ChecksumIEEE([]byte(head))
	var b [crcLen]byte
	for i := crcLen - 1; i >= 0; i-- {
		b[i] = base62Alphabet[crc%62]
		crc /= 62
	}
	return head + string(b[:])
}

// flip replaces the byte at i with another base62 digit.
func flip(s string, i int) string {
	c := byte('A')
	if s[i] == 'A' {
		c = 'B'
	}
	return s[:i] + string(c) + s[i+1:]
}

// TestVerifyRefuses checks every way Verify says no, and that a token of
// the wrong shape never reaches the store.
func TestVerifyRefuses(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	p := e.principal(t, "node-1")
	tok, c := e.mint(t, p.ID, time.Hour, ScopeNodePoll)
	revoked, rc := e.mint(t, p.ID, time.Hour, ScopeNodePoll)
	e.is.Revoke(e.ctx, rc.ID)
	expired, _ := e.mint(t, p.ID, time.Minute, ScopeNodePoll)
	rotatedOut, oc := e.mint(t, p.ID, time.Hour, ScopeNodePoll)
	if _, _, err := e.is.Rotate(e.ctx, oc.ID, 30*time.Second); err != nil {
		t.Fatal(err)
	}
	banned := e.principal(t, "node-banned")
	bannedTok, _ := e.mint(t, banned.ID, time.Hour, ScopeNodePoll)
	e.is.Ban(e.ctx, banned.ID, "test")
	e.clock.Advance(time.Minute) // expired and rotatedOut are now past their end

	id, secret, err := parseToken(tok)
	if err != nil {
		t.Fatal(err)
	}
	otherID, otherSecret := id, secret
	otherID[15] ^= 0x80
	otherSecret[0] ^= 0x80
	body := tok[len(TokenPrefix) : TokenLen-crcLen]

	tests := []struct {
		name   string
		token  string
		scope  Scope
		want   error
		shaped bool // reaches the store
	}{
		{"missing", "", ScopeNodePoll, ErrMissingCredential, false},
		{"blank", " ", ScopeNodePoll, ErrInvalidToken, false},
		{"prefix only", TokenPrefix, ScopeNodePoll, ErrInvalidToken, false},
		{"wrong prefix", withCRC("nll_" + body), ScopeNodePoll, ErrInvalidToken, false},
		{"upper-case prefix", withCRC("NLC_" + body), ScopeNodePoll, ErrInvalidToken, false},
		{"bad CRC", flip(tok, TokenLen-1), ScopeNodePoll, ErrInvalidToken, false},
		{"body changed, CRC kept", flip(tok, 20), ScopeNodePoll, ErrInvalidToken, false},
		{"one short", tok[:TokenLen-1], ScopeNodePoll, ErrInvalidToken, false},
		{"one long", tok + "0", ScopeNodePoll, ErrInvalidToken, false},
		{"no checksum", tok[:TokenLen-crcLen], ScopeNodePoll, ErrInvalidToken, false},
		{"non-base62 dash", tok[:10] + "-" + tok[11:], ScopeNodePoll, ErrInvalidToken, false},
		{"non-base62 base64 chars", tok[:10] + "+/" + tok[12:], ScopeNodePoll, ErrInvalidToken, false},
		{"non-base62 in checksum", tok[:TokenLen-1] + "=", ScopeNodePoll, ErrInvalidToken, false},
		{"non-ASCII", tok[:10] + "é" + tok[12:], ScopeNodePoll, ErrInvalidToken, false},
		{"NUL", tok[:10] + "\x00" + tok[11:], ScopeNodePoll, ErrInvalidToken, false},
		{"trailing newline", tok + "\n", ScopeNodePoll, ErrInvalidToken, false},
		{"trailing CRLF", tok + "\r\n", ScopeNodePoll, ErrInvalidToken, false},
		{"newline for last digit", tok[:TokenLen-1] + "\n", ScopeNodePoll, ErrInvalidToken, false},
		{"leading space", " " + tok, ScopeNodePoll, ErrInvalidToken, false},
		{"with Bearer", "Bearer " + tok, ScopeNodePoll, ErrInvalidToken, false},
		{"body over 48 bytes", withCRC(TokenPrefix + strings.Repeat("z", bodyLen)), ScopeNodePoll, ErrInvalidToken, false},
		{"unknown id", formatToken(&otherID, &secret), ScopeNodePoll, ErrInvalidToken, true},
		{"wrong secret", formatToken(&id, &otherSecret), ScopeNodePoll, ErrInvalidToken, true},
		{"revoked", revoked, ScopeNodePoll, ErrRevoked, true},
		{"expired", expired, ScopeNodePoll, ErrExpired, true},
		{"rotated out", rotatedOut, ScopeNodePoll, ErrExpired, true},
		{"banned", bannedTok, ScopeNodePoll, ErrBanned, true},
		{"missing scope", tok, ScopeNodeRegister, ErrInsufficientScope, true},
		{"empty scope", tok, "", ErrInsufficientScope, true},
		{"near miss node:result", tok, "node:result", ErrInsufficientScope, true},
		{"near miss node:*", tok, "node:*", ErrInsufficientScope, true},
		{"near miss NODE:POLL", tok, "NODE:POLL", ErrInsufficientScope, true},
		{"near miss trailing space", tok, "node:poll ", ErrInsufficientScope, true},
		{"near miss prefix", tok, "node:pol", ErrInsufficientScope, true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			before := e.store.calls.Load()
			gotP, gotC, err := e.is.Verify(e.ctx, tc.token, tc.scope)
			calls := e.store.calls.Load() - before
			if !errors.Is(err, tc.want) {
				t.Fatalf("Verify err = %v, want %v", err, tc.want)
			}
			if gotP != nil || gotC != nil {
				t.Fatalf("Verify failed but returned %+v, %+v", gotP, gotC)
			}
			if !tc.shaped && calls != 0 {
				t.Fatalf("a malformed token made %d store calls, want 0", calls)
			}
			if tc.shaped && calls == 0 {
				t.Fatal("a well-formed token made no store call")
			}
		})
	}

	t.Run("unknown id and wrong secret alike", func(t *testing.T) {
		_, _, errID := e.is.Verify(e.ctx, formatToken(&otherID, &secret), ScopeNodePoll)
		_, _, errSecret := e.is.Verify(e.ctx, formatToken(&id, &otherSecret), ScopeNodePoll)
		if errID != errSecret {
			t.Fatalf("unknown id: %v; wrong secret: %v; want the same error value", errID, errSecret)
		}
	})
	t.Run("the good token still verifies", func(t *testing.T) {
		gotP, gotC, err := e.is.Verify(e.ctx, tok, ScopeNodePoll)
		if err != nil || gotP.ID != p.ID || gotC.ID != c.ID {
			t.Fatalf("Verify = %+v, %+v, %v", gotP, gotC, err)
		}
	})
}

// TestStoreFailure checks that a failing store fails the call, wrapped,
// and never lets a token pass.
func TestStoreFailure(t *testing.T) {
	t.Parallel()
	errDown := errors.New("database is down")
	e := newEnv(t)
	p := e.principal(t, "n")
	tok, c := e.mint(t, p.ID, time.Hour, ScopeNodePoll)
	for _, method := range []string{"GetCredential", "GetPrincipal"} {
		t.Run("Verify/"+method, func(t *testing.T) {
			e.store.fail = func(m string) error {
				if m == method {
					return errDown
				}
				return nil
			}
			defer func() { e.store.fail = nil }()
			gotP, gotC, err := e.is.Verify(e.ctx, tok, ScopeNodePoll)
			if !errors.Is(err, errDown) || gotP != nil || gotC != nil {
				t.Fatalf("Verify = %+v, %+v, %v; want the store error and nothing else", gotP, gotC, err)
			}
			for _, sentinel := range []error{ErrInvalidToken, ErrExpired, ErrRevoked, ErrBanned, ErrInsufficientScope, ErrNotFound} {
				if errors.Is(err, sentinel) {
					t.Fatalf("a store failure reads as %v", sentinel)
				}
			}
		})
	}
	t.Run("Mint", func(t *testing.T) {
		e.store.fail = func(m string) error {
			if m == "CreateCredential" {
				return errDown
			}
			return nil
		}
		defer func() { e.store.fail = nil }()
		tok, c, err := e.is.Mint(e.ctx, p.ID, []Scope{ScopeNodePoll}, 0)
		if !errors.Is(err, errDown) || tok != "" || c != nil {
			t.Fatalf("Mint = %q, %+v, %v", tok, c, err)
		}
	})
	t.Run("Rotate", func(t *testing.T) {
		// The old credential cannot be updated: the new one is revoked
		// rather than left alive beside it.
		updates := 0
		e.store.fail = func(m string) error {
			if m == "UpdateCredential" {
				updates++
				if updates == 1 {
					return errDown
				}
			}
			return nil
		}
		defer func() { e.store.fail = nil }()
		newTok, nc, err := e.is.Rotate(e.ctx, c.ID, 0)
		if !errors.Is(err, errDown) || newTok != "" || nc != nil {
			t.Fatalf("Rotate = %q, %+v, %v", newTok, nc, err)
		}
		e.store.fail = nil
		cs, _ := e.is.Credentials(e.ctx, p.ID)
		if len(cs) != 2 {
			t.Fatalf("%d credentials after a failed rotation, want the old and the revoked new one", len(cs))
		}
		for _, x := range cs {
			if x.ID == c.ID && (x.RotatedTo != "" || x.RevokedAt != nil || !x.ExpiresAt.Equal(c.ExpiresAt)) {
				t.Fatalf("old credential after a failed rotation: %+v", x)
			}
			if x.ID != c.ID && x.RevokedAt == nil {
				t.Fatalf("new credential survived a failed rotation: %+v", x)
			}
		}
		if _, _, err := e.is.Verify(e.ctx, tok, ScopeNodePoll); err != nil {
			t.Fatalf("the old token after a failed rotation: %v", err)
		}
	})
}

// TestRaceRetries checks that an update that loses a race is retried
// on a fresh read.
func TestRaceRetries(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	p := e.principal(t, "n")
	_, c := e.mint(t, p.ID, time.Hour, ScopeNodePoll)
	losses := 0
	e.store.fail = func(m string) error {
		if m == "UpdateCredential" || m == "UpdatePrincipal" {
			if losses++; losses%2 == 1 {
				return ErrConflict
			}
		}
		return nil
	}
	if r, err := e.is.Revoke(e.ctx, c.ID); err != nil || r.RevokedAt == nil {
		t.Fatalf("Revoke = %+v, %v", r, err)
	}
	if b, err := e.is.Ban(e.ctx, p.ID, "x"); err != nil || !b.Banned {
		t.Fatalf("Ban = %+v, %v", b, err)
	}
	e.store.fail = func(m string) error {
		if m == "UpdatePrincipal" {
			return ErrConflict
		}
		return nil
	}
	if _, err := e.is.Unban(e.ctx, p.ID); !errors.Is(err, ErrConflict) {
		t.Fatalf("Unban under constant contention: %v, want ErrConflict", err)
	}
}

func TestNewIssuer(t *testing.T) {
	t.Parallel()
	long := testPepper
	tests := []struct {
		name string
		cfg  *Config
		ok   bool
	}{
		{"nil config", nil, false},
		{"no peppers", &Config{}, false},
		{"short pepper", &Config{Peppers: map[int][]byte{1: long[:31]}}, false},
		{"version zero", &Config{Peppers: map[int][]byte{0: long}}, false},
		{"negative version", &Config{Peppers: map[int][]byte{-1: long}}, false},
		{"version not configured", &Config{Peppers: map[int][]byte{1: long}, PepperVersion: 2}, false},
		{"one pepper", &Config{Peppers: map[int][]byte{1: long}}, true},
		{"chosen version", &Config{Peppers: map[int][]byte{1: long, 2: long}, PepperVersion: 1}, true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			is, err := NewIssuer(NewMemoryStore(), tc.cfg)
			if tc.ok != (err == nil) || tc.ok != (is != nil) {
				t.Fatalf("NewIssuer = %v, %v; want ok %v", is, err, tc.ok)
			}
			if err != nil && !errors.Is(err, ErrInvalidArgument) {
				t.Fatalf("err = %v, want ErrInvalidArgument", err)
			}
		})
	}
	if _, err := NewIssuer(nil, &Config{Peppers: map[int][]byte{1: long}}); err == nil {
		t.Fatal("NewIssuer accepted a nil store")
	}
	is, _ := NewIssuer(NewMemoryStore(), &Config{Peppers: map[int][]byte{3: long, 7: long, 5: long}})
	if is.version != 7 || is.ttl != 30*24*time.Hour {
		t.Fatalf("defaults: version %d ttl %v; want 7 and 30 days", is.version, is.ttl)
	}
	// The Issuer keeps its own copy of the derived keys, not the caller's pepper.
	p := append([]byte(nil), long...)
	is, _ = NewIssuer(NewMemoryStore(), &Config{Peppers: map[int][]byte{1: p}})
	key := append([]byte(nil), is.subkeys[1]...)
	clear(p)
	if string(is.subkeys[1]) != string(key) {
		t.Fatal("changing the caller's pepper changed the Issuer's key")
	}
}

// vectors is testdata/vectors.json, computed by an independent implementation.
type vectors struct {
	ID        string `json:"id"`
	Secret    string `json:"secret"`
	Token     string `json:"token"`
	Pepper    string `json:"pepper"`
	Subkey    string `json:"subkey"`
	Digest    string `json:"digest"`
	PublicKey string `json:"public_key"`
	KeyID     string `json:"key_id"`
}

func TestVectors(t *testing.T) {
	t.Parallel()
	b, err := os.ReadFile("testdata/vectors.json")
	if err != nil {
		t.Fatal(err)
	}
	var v vectors
	if err := json.Unmarshal(b, &v); err != nil {
		t.Fatal(err)
	}
	var id [idLen]byte
	var secret [secretLen]byte
	hex.Decode(id[:], []byte(v.ID))
	hex.Decode(secret[:], []byte(v.Secret))
	if got := formatToken(&id, &secret); got != v.Token {
		t.Fatalf("formatToken = %s, want %s", got, v.Token)
	}
	gotID, gotSecret, err := parseToken(v.Token)
	if err != nil || gotID != id || gotSecret != secret {
		t.Fatalf("parseToken = %x, %x, %v", gotID, gotSecret, err)
	}
	if cid, err := ParseToken(v.Token); err != nil || cid != v.ID {
		t.Fatalf("ParseToken = %s, %v; want %s", cid, err, v.ID)
	}
	is, err := NewIssuer(NewMemoryStore(), &Config{Peppers: map[int][]byte{1: []byte(v.Pepper)}})
	if err != nil {
		t.Fatal(err)
	}
	if got := hex.EncodeToString(is.subkeys[1]); got != v.Subkey {
		t.Fatalf("subkey = %s, want %s", got, v.Subkey)
	}
	if got := hex.EncodeToString(digest(is.subkeys[1], &secret)); got != v.Digest {
		t.Fatalf("digest = %s, want %s", got, v.Digest)
	}
	pub, _ := hex.DecodeString(v.PublicKey)
	if got := KeyID(ed25519.PublicKey(pub)); got != v.KeyID {
		t.Fatalf("KeyID = %s, want %s", got, v.KeyID)
	}
	if KeyID(pub[:31]) != "" || KeyID(nil) != "" {
		t.Fatal("KeyID of a key that is not 32 bytes is not empty")
	}
}

func TestTokenEdges(t *testing.T) {
	t.Parallel()
	var zeroID [idLen]byte
	var zeroSecret [secretLen]byte
	maxID, maxSecret := zeroID, zeroSecret
	for i := range maxID {
		maxID[i] = 0xff
	}
	for i := range maxSecret {
		maxSecret[i] = 0xff
	}
	for _, tc := range []struct {
		name   string
		id     *[idLen]byte
		secret *[secretLen]byte
	}{{"zero", &zeroID, &zeroSecret}, {"max", &maxID, &maxSecret}} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			tok := formatToken(tc.id, tc.secret)
			id, secret, err := parseToken(tok)
			if err != nil || id != *tc.id || secret != *tc.secret {
				t.Fatalf("round trip of %s: %x %x %v", tok, id, secret, err)
			}
			if TokenPattern.FindString(tok) != tok {
				t.Fatalf("TokenPattern misses %s", tok)
			}
		})
	}
	// The largest 48-byte value plus one no longer fits.
	maxBody := formatToken(&maxID, &maxSecret)[len(TokenPrefix) : TokenLen-crcLen]
	over := []byte(maxBody)
	for i := len(over) - 1; ; i-- { // add one, in base62
		if over[i] != 'z' {
			over[i] = base62Alphabet[base62Digit(over[i])+1]
			break
		}
		over[i] = '0'
	}
	if _, _, err := parseToken(withCRC(TokenPrefix + string(over))); !errors.Is(err, ErrInvalidToken) {
		t.Fatalf("parsed a body of 2^384 (%s): %v", over, err)
	}
	digits := TokenPrefix + strings.Repeat("0", bodyLen)
	if _, _, err := parseToken(withCRC(digits)); err != nil {
		t.Fatalf("all-zero token: %v", err)
	}
	if want := fmt.Sprintf(`\bnlc_[0-9A-Za-z]{%d}\b`, bodyLen+crcLen); TokenPattern.String() != want {
		t.Fatalf("TokenPattern = %s, want %s", TokenPattern, want)
	}
	text := "a=" + withCRC(digits) + ", b=x" + withCRC(digits) + ", c=" + withCRC(digits) + "0"
	if m := TokenPattern.FindAllString(text, -1); len(m) != 1 {
		t.Fatalf("TokenPattern found %q, want only the first, delimited, token", m)
	}
}
