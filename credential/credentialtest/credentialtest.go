// Package credentialtest is the conformance suite that every
// credential.Store must pass. An adapter's test calls Run with a function
// that returns a new, empty store:
//
//	func TestCredentialStore(t *testing.T) {
//		credentialtest.Run(t, func(t *testing.T) credential.Store { return newEmptyStore(t) })
//	}
//
// The suite drives the store through credential.Issuer, so it checks
// DESIGN §4 end to end on that store: minting and verifying every scope,
// exact scope matching, expiry to the microsecond, revocation, rotation
// with and without grace, bans, pepper versions, exact timestamps,
// sentinel errors, that an unknown id and a wrong secret look the same,
// that no token or secret reaches a stored row, and concurrent mints,
// rotations, revocations and bans.
package credentialtest

import (
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"hash/crc32"
	"math/big"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"

	"github.com/nodelane/nodelane/credential"
)

// clock is a settable clock.
type clock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *clock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

func (c *clock) Advance(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.t = c.t.Add(d)
}

// epoch has a nanosecond part so that stores that fail to truncate or to
// round-trip microseconds are caught.
var epoch = time.Date(2026, 11, 30, 9, 0, 0, 123456789, time.UTC)

func pepper(b byte) []byte { return []byte(strings.Repeat(string(rune('a'+b%26)), 32)) }

type fixture struct {
	t     *testing.T
	ctx   context.Context
	store credential.Store
	clock *clock
	is    *credential.Issuer
}

func newFixture(t *testing.T, newStore func(t *testing.T) credential.Store) *fixture {
	t.Helper()
	f := &fixture{t: t, ctx: context.Background(), store: newStore(t), clock: &clock{t: epoch}}
	f.is = f.issuer(map[int][]byte{1: pepper(1)}, 1)
	return f
}

// issuer returns another Issuer over the fixture's store and clock.
func (f *fixture) issuer(peppers map[int][]byte, version int) *credential.Issuer {
	f.t.Helper()
	is, err := credential.NewIssuer(f.store, &credential.Config{Peppers: peppers, PepperVersion: version, Now: f.clock.Now, Rand: rand.Reader})
	if err != nil {
		f.t.Fatalf("NewIssuer: %v", err)
	}
	return is
}

func (f *fixture) principal(kind credential.Kind, id string) *credential.Principal {
	f.t.Helper()
	p, err := f.is.CreatePrincipal(f.ctx, credential.Principal{ID: id, Kind: kind, Name: "name of " + id})
	if err != nil {
		f.t.Fatalf("CreatePrincipal(%s, %q): %v", kind, id, err)
	}
	return p
}

func (f *fixture) mint(principalID string, ttl time.Duration, scopes ...credential.Scope) (string, *credential.Credential) {
	f.t.Helper()
	tok, c, err := f.is.Mint(f.ctx, principalID, scopes, ttl)
	if err != nil {
		f.t.Fatalf("Mint(%s, %v): %v", principalID, scopes, err)
	}
	return tok, c
}

// verify checks that tok verifies for scope under is.
func (f *fixture) verify(is *credential.Issuer, what, tok string, scope credential.Scope) (*credential.Principal, *credential.Credential) {
	f.t.Helper()
	p, c, err := is.Verify(f.ctx, tok, scope)
	if err != nil {
		f.t.Fatalf("%s: Verify(%s): %v", what, scope, err)
	}
	if p == nil || c == nil || c.PrincipalID != p.ID {
		f.t.Fatalf("%s: Verify(%s) = %+v, %+v", what, scope, p, c)
	}
	return p, c
}

// refuse checks that tok fails to verify for scope under is with target.
func (f *fixture) refuse(is *credential.Issuer, what, tok string, scope credential.Scope, target error) {
	f.t.Helper()
	p, c, err := is.Verify(f.ctx, tok, scope)
	if !errors.Is(err, target) {
		f.t.Fatalf("%s: Verify(%q) err = %v, want %v", what, scope, err, target)
	}
	if p != nil || c != nil {
		f.t.Fatalf("%s: Verify(%q) failed but returned %+v, %+v", what, scope, p, c)
	}
}

// stored checks that the store gives back exactly the credential written.
func (f *fixture) stored(want *credential.Credential) {
	f.t.Helper()
	got, err := f.store.GetCredential(f.ctx, want.ID)
	if err != nil {
		f.t.Fatalf("GetCredential(%s): %v", want.ID, err)
	}
	if d := cmp.Diff(want, got, cmpopts.EquateEmpty()); d != "" {
		f.t.Fatalf("stored credential differs from the one written (-written +stored):\n%s", d)
	}
}

// storedPrincipal checks that the store gives back exactly the principal written.
func (f *fixture) storedPrincipal(want *credential.Principal) {
	f.t.Helper()
	got, err := f.store.GetPrincipal(f.ctx, want.ID)
	if err != nil {
		f.t.Fatalf("GetPrincipal(%s): %v", want.ID, err)
	}
	if d := cmp.Diff(want, got, cmpopts.EquateEmpty()); d != "" {
		f.t.Fatalf("stored principal differs from the one written (-written +stored):\n%s", d)
	}
}

func wantErr(t *testing.T, what string, err, target error) {
	t.Helper()
	if !errors.Is(err, target) {
		t.Fatalf("%s: err = %v, want %v", what, err, target)
	}
}

// Run runs the conformance suite against stores made by newStore. Each
// subtest gets its own store.
func Run(t *testing.T, newStore func(t *testing.T) credential.Store) {
	tests := []struct {
		name string
		fn   func(t *testing.T, f *fixture)
	}{
		{"Principals", testPrincipals},
		{"TokenFormat", testTokenFormat},
		{"EveryScope", testEveryScope},
		{"ExactScopes", testExactScopes},
		{"Expiry", testExpiry},
		{"Revoke", testRevoke},
		{"RotateAtOnce", testRotateAtOnce},
		{"RotateWithGrace", testRotateWithGrace},
		{"RotateRefused", testRotateRefused},
		{"BanUnban", testBanUnban},
		{"CheckOrder", testCheckOrder},
		{"PepperVersions", testPepperVersions},
		{"Timestamps", testTimestamps},
		{"SentinelErrors", testSentinels},
		{"UnknownIDLikeWrongSecret", testUnknownIDLikeWrongSecret},
		{"Listing", testListing},
		{"NoSecretsInRows", testNoSecretsInRows},
		{"ConcurrentMints", testConcurrentMints},
		{"ConcurrentRotations", testConcurrentRotations},
		{"ConcurrentRevokeRotate", testConcurrentRevokeRotate},
		{"ConcurrentBanSetKey", testConcurrentBanSetKey},
		{"StoreRevisionsAndCopies", testStoreContract},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			tc.fn(t, newFixture(t, newStore))
		})
	}
}

// keyID is an independent computation of the key id of DESIGN §4.
func keyID(pub []byte) string {
	h := sha256.Sum256(pub)
	return base64.RawURLEncoding.EncodeToString(h[:])
}

func newKey(t *testing.T) ed25519.PublicKey {
	t.Helper()
	pub, _, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	return pub
}

func testPrincipals(t *testing.T, f *fixture) {
	pub := newKey(t)
	n, err := f.is.CreatePrincipal(f.ctx, credential.Principal{ID: "studio-gpu-1", Kind: credential.KindNode, Name: "Studio-GPU", PublicKey: pub,
		KeyID: "forged", Banned: true, BanReason: "ignored", BannedAt: &epoch})
	if err != nil {
		t.Fatal(err)
	}
	if n.ID != "studio-gpu-1" || n.KeyID != keyID(pub) || n.KeyID != credential.KeyID(pub) || n.Banned || n.BanReason != "" || n.BannedAt != nil || n.Rev < 1 {
		t.Fatalf("created node = %+v", n)
	}
	f.storedPrincipal(n)

	o, err := f.is.CreatePrincipal(f.ctx, credential.Principal{Kind: credential.KindOperator, Name: "ops"})
	if err != nil {
		t.Fatal(err)
	}
	if o.ID == "" || o.PublicKey != nil || o.KeyID != "" {
		t.Fatalf("created operator = %+v", o)
	}
	f.storedPrincipal(o)
	if o2 := f.principal(credential.KindOperator, ""); o2.ID == o.ID {
		t.Fatalf("two principals got id %s", o.ID)
	}

	pub2 := newKey(t)
	n2, err := f.is.SetNodeKey(f.ctx, n.ID, pub2)
	if err != nil || !pub2.Equal(n2.PublicKey) || n2.KeyID != keyID(pub2) || n2.Rev <= n.Rev {
		t.Fatalf("SetNodeKey = %+v, %v", n2, err)
	}
	f.storedPrincipal(n2)
	got, err := f.is.Principal(f.ctx, n.ID)
	if err != nil || !pub2.Equal(got.PublicKey) {
		t.Fatalf("Principal after SetNodeKey = %+v, %v", got, err)
	}
	keyless := f.principal(credential.KindNode, "keyless")
	if keyless.PublicKey != nil || keyless.KeyID != "" {
		t.Fatalf("keyless node = %+v", keyless)
	}
	if k, err := f.is.SetNodeKey(f.ctx, keyless.ID, pub); err != nil || k.KeyID != keyID(pub) {
		t.Fatalf("SetNodeKey on a keyless node = %+v, %v", k, err)
	}
}

// The token format of DESIGN §4, checked with an independent decoder.
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

func testEveryScope(t *testing.T, f *fixture) {
	all := credential.AllScopes()
	if len(all) != 10 {
		t.Fatalf("AllScopes has %d scopes, want 10", len(all))
	}
	node := f.principal(credential.KindNode, "node")
	op := f.principal(credential.KindOperator, "op")
	for _, s := range all {
		t.Run(string(s), func(t *testing.T) {
			if got, err := credential.ParseScope(string(s)); err != nil || got != s {
				t.Fatalf("ParseScope(%q) = %q, %v", s, got, err)
			}
			owner := node
			if strings.HasPrefix(string(s), "operator:") {
				owner = op
			}
			tok, c := f.mint(owner.ID, 0, s)
			if d := cmp.Diff([]credential.Scope{s}, c.Scopes); d != "" {
				t.Fatalf("scopes (-want +got):\n%s", d)
			}
			p, vc := f.verify(f.is, "own scope", tok, s)
			if p.ID != owner.ID || vc.ID != c.ID {
				t.Fatalf("Verify = principal %s credential %s, want %s %s", p.ID, vc.ID, owner.ID, c.ID)
			}
			for _, other := range all {
				if other != s {
					f.refuse(f.is, "other scope", tok, other, credential.ErrInsufficientScope)
				}
			}
		})
	}
	// Several scopes, given out of order and repeated, are stored distinct and in order.
	tok, c := f.mint(node.ID, 0, credential.ScopeNodePoll, credential.ScopeNodeHeartbeat, credential.ScopeNodePoll)
	if d := cmp.Diff([]credential.Scope{credential.ScopeNodeHeartbeat, credential.ScopeNodePoll}, c.Scopes); d != "" {
		t.Fatalf("scopes (-want +got):\n%s", d)
	}
	f.stored(c)
	f.verify(f.is, "first of two", tok, credential.ScopeNodeHeartbeat)
	f.verify(f.is, "second of two", tok, credential.ScopeNodePoll)
	f.refuse(f.is, "third", tok, credential.ScopeNodeRegister, credential.ErrInsufficientScope)
}

func testExactScopes(t *testing.T, f *fixture) {
	p := f.principal(credential.KindNode, "n")
	tok, _ := f.mint(p.ID, 0, credential.ScopeNodePoll, credential.ScopeNodeResultSubmit)
	opTok, _ := f.mint(f.principal(credential.KindOperator, "op").ID, 0, credential.ScopeOperatorJobs)
	nearMisses := []string{
		"", "node", "node:", "node:*", "*", "node:result", "node:result:*", "node:result:submit:x",
		"NODE:POLL", "Node:Poll", "node:poll ", " node:poll", "node:poll\n", "node:poll\x00", "node:polls", "node:pol",
		"node/poll", "node.poll", "operator:*", "operator",
	}
	for _, s := range nearMisses {
		t.Run(fmt.Sprintf("%q", s), func(t *testing.T) {
			f.refuse(f.is, "node token", tok, credential.Scope(s), credential.ErrInsufficientScope)
			f.refuse(f.is, "operator token", opTok, credential.Scope(s), credential.ErrInsufficientScope)
			if _, err := credential.ParseScope(s); !errors.Is(err, credential.ErrInvalidArgument) {
				t.Fatalf("ParseScope(%q) err = %v, want ErrInvalidArgument", s, err)
			}
			_, _, err := f.is.Mint(f.ctx, p.ID, []credential.Scope{credential.Scope(s)}, 0)
			wantErr(t, "mint", err, credential.ErrInvalidArgument)
		})
	}
}

func testExpiry(t *testing.T, f *fixture) {
	p := f.principal(credential.KindNode, "n")
	now := epoch.Truncate(time.Microsecond)
	tok, c := f.mint(p.ID, time.Hour, credential.ScopeNodePoll)
	if !c.CreatedAt.Equal(now) || !c.ExpiresAt.Equal(now.Add(time.Hour)) {
		t.Fatalf("created %v expires %v, want %v and an hour later", c.CreatedAt, c.ExpiresAt, now)
	}
	_, def := f.mint(p.ID, 0, credential.ScopeNodePoll)
	if !def.ExpiresAt.Equal(now.Add(30 * 24 * time.Hour)) {
		t.Fatalf("default ttl: expires %v, want 30 days after %v", def.ExpiresAt, now)
	}
	_, odd := f.mint(p.ID, 1500*time.Nanosecond, credential.ScopeNodePoll)
	if !odd.ExpiresAt.Equal(now.Add(time.Microsecond)) {
		t.Fatalf("ttl 1.5µs: expires %v, want %v", odd.ExpiresAt, now.Add(time.Microsecond))
	}
	f.stored(odd)

	f.clock.Advance(c.ExpiresAt.Sub(epoch) - time.Microsecond) // the last microsecond of its life
	f.verify(f.is, "last microsecond", tok, credential.ScopeNodePoll)
	f.clock.Advance(time.Microsecond) // now == ExpiresAt
	f.refuse(f.is, "at ExpiresAt", tok, credential.ScopeNodePoll, credential.ErrExpired)
	f.clock.Advance(365 * 24 * time.Hour)
	f.refuse(f.is, "a year later", tok, credential.ScopeNodePoll, credential.ErrExpired)
}

func testRevoke(t *testing.T, f *fixture) {
	p := f.principal(credential.KindNode, "n")
	tok, c := f.mint(p.ID, 0, credential.ScopeNodePoll)
	other, _ := f.mint(p.ID, 0, credential.ScopeNodePoll)
	f.clock.Advance(time.Second)
	r, err := f.is.Revoke(f.ctx, c.ID)
	if err != nil || r.RevokedAt == nil || !r.RevokedAt.Equal(f.clock.Now().Truncate(time.Microsecond)) {
		t.Fatalf("Revoke = %+v, %v", r, err)
	}
	f.stored(r)
	f.refuse(f.is, "revoked", tok, credential.ScopeNodePoll, credential.ErrRevoked)
	f.verify(f.is, "another credential of the principal", other, credential.ScopeNodePoll)
	f.clock.Advance(time.Second)
	again, err := f.is.Revoke(f.ctx, c.ID)
	if err != nil || !again.RevokedAt.Equal(*r.RevokedAt) {
		t.Fatalf("second Revoke = %+v, %v; want the first revocation time kept", again, err)
	}
	_, err = f.is.Revoke(f.ctx, strings.Repeat("0", 32))
	wantErr(t, "revoke unknown", err, credential.ErrNotFound)
}

func testRotateAtOnce(t *testing.T, f *fixture) {
	p := f.principal(credential.KindNode, "n")
	oldTok, old := f.mint(p.ID, 2*time.Hour, credential.ScopeNodePoll, credential.ScopeNodeHeartbeat)
	f.clock.Advance(time.Hour)
	now := f.clock.Now().Truncate(time.Microsecond)
	newTok, nc, err := f.is.Rotate(f.ctx, old.ID, 0)
	if err != nil {
		t.Fatal(err)
	}
	if newTok == oldTok || nc.ID == old.ID || nc.PrincipalID != p.ID || !cmp.Equal(nc.Scopes, old.Scopes) {
		t.Fatalf("rotated credential = %+v", nc)
	}
	if !nc.CreatedAt.Equal(now) || !nc.ExpiresAt.Equal(now.Add(2*time.Hour)) {
		t.Fatalf("rotated credential lives %v to %v, want the old lifetime (2h) from %v", nc.CreatedAt, nc.ExpiresAt, now)
	}
	f.stored(nc)
	o, err := f.is.Credential(f.ctx, old.ID)
	if err != nil || o.RotatedTo != nc.ID || !o.ExpiresAt.Equal(now) || o.RevokedAt != nil {
		t.Fatalf("old credential after rotation = %+v, %v", o, err)
	}
	f.refuse(f.is, "rotated out", oldTok, credential.ScopeNodePoll, credential.ErrExpired)
	f.verify(f.is, "new token", newTok, credential.ScopeNodePoll)
	f.verify(f.is, "new token", newTok, credential.ScopeNodeHeartbeat)
	f.refuse(f.is, "new token, other scope", newTok, credential.ScopeNodeRegister, credential.ErrInsufficientScope)
}

func testRotateWithGrace(t *testing.T, f *fixture) {
	p := f.principal(credential.KindNode, "n")
	oldTok, old := f.mint(p.ID, time.Hour, credential.ScopeNodePoll)
	start := f.clock.Now().Truncate(time.Microsecond)
	newTok, nc, err := f.is.Rotate(f.ctx, old.ID, 5*time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	o, _ := f.is.Credential(f.ctx, old.ID)
	if o.RotatedTo != nc.ID || !o.ExpiresAt.Equal(start.Add(5*time.Minute)) {
		t.Fatalf("old credential after rotation = %+v", o)
	}
	f.clock.Advance(5*time.Minute - time.Microsecond)
	f.verify(f.is, "old token in grace", oldTok, credential.ScopeNodePoll)
	f.verify(f.is, "new token in grace", newTok, credential.ScopeNodePoll)
	f.clock.Advance(time.Microsecond)
	f.refuse(f.is, "old token after grace", oldTok, credential.ScopeNodePoll, credential.ErrExpired)
	f.verify(f.is, "new token after grace", newTok, credential.ScopeNodePoll)

	// A grace longer than the credential's remaining life does not extend it.
	_, short := f.mint(p.ID, time.Minute, credential.ScopeNodePoll)
	if _, _, err := f.is.Rotate(f.ctx, short.ID, time.Hour); err != nil {
		t.Fatal(err)
	}
	if s, _ := f.is.Credential(f.ctx, short.ID); !s.ExpiresAt.Equal(short.ExpiresAt) {
		t.Fatalf("grace extended a credential from %v to %v", short.ExpiresAt, s.ExpiresAt)
	}
	// The successor can be rotated in turn.
	if _, _, err := f.is.Rotate(f.ctx, nc.ID, 0); err != nil {
		t.Fatalf("rotating the successor: %v", err)
	}
}

func testRotateRefused(t *testing.T, f *fixture) {
	p := f.principal(credential.KindNode, "n")
	_, revoked := f.mint(p.ID, 0, credential.ScopeNodePoll)
	f.is.Revoke(f.ctx, revoked.ID)
	_, expired := f.mint(p.ID, time.Minute, credential.ScopeNodePoll)
	_, rotated := f.mint(p.ID, time.Hour, credential.ScopeNodePoll)
	f.is.Rotate(f.ctx, rotated.ID, time.Hour)
	_, live := f.mint(p.ID, time.Hour, credential.ScopeNodePoll)
	f.clock.Advance(time.Minute)
	before, _ := f.is.Credentials(f.ctx, p.ID)
	tests := []struct {
		name  string
		id    string
		grace time.Duration
		want  error
	}{
		{"revoked", revoked.ID, 0, credential.ErrRevoked},
		{"expired", expired.ID, 0, credential.ErrExpired},
		{"already rotated", rotated.ID, 0, credential.ErrInvalidArgument},
		{"negative grace", live.ID, -time.Second, credential.ErrInvalidArgument},
		{"unknown", strings.Repeat("f", 32), 0, credential.ErrNotFound},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			tok, c, err := f.is.Rotate(f.ctx, tc.id, tc.grace)
			wantErr(t, "Rotate", err, tc.want)
			if tok != "" || c != nil {
				t.Fatalf("failed Rotate returned %q, %+v", tok, c)
			}
		})
	}
	after, _ := f.is.Credentials(f.ctx, p.ID)
	if d := cmp.Diff(before, after, cmpopts.EquateEmpty()); d != "" {
		t.Fatalf("refused rotations changed the credentials (-before +after):\n%s", d)
	}
}

func testBanUnban(t *testing.T, f *fixture) {
	p := f.principal(credential.KindNode, "n")
	tok, _ := f.mint(p.ID, 0, credential.ScopeNodeHeartbeat)
	other := f.principal(credential.KindNode, "other")
	otherTok, _ := f.mint(other.ID, 0, credential.ScopeNodeHeartbeat)
	f.clock.Advance(time.Second)
	banAt := f.clock.Now().Truncate(time.Microsecond)
	b, err := f.is.Ban(f.ctx, p.ID, "crypto miner")
	if err != nil || !b.Banned || b.BanReason != "crypto miner" || b.BannedAt == nil || !b.BannedAt.Equal(banAt) {
		t.Fatalf("Ban = %+v, %v", b, err)
	}
	f.storedPrincipal(b)
	f.refuse(f.is, "banned", tok, credential.ScopeNodeHeartbeat, credential.ErrBanned)
	f.refuse(f.is, "banned, wrong scope", tok, credential.ScopeNodePoll, credential.ErrBanned)
	f.verify(f.is, "another principal", otherTok, credential.ScopeNodeHeartbeat)
	// Credentials minted while banned are refused too.
	newTok, _ := f.mint(p.ID, 0, credential.ScopeNodeHeartbeat)
	f.refuse(f.is, "minted while banned", newTok, credential.ScopeNodeHeartbeat, credential.ErrBanned)

	f.clock.Advance(time.Second)
	b2, err := f.is.Ban(f.ctx, p.ID, "still mining")
	if err != nil || b2.BanReason != "still mining" || !b2.BannedAt.Equal(banAt) {
		t.Fatalf("second Ban = %+v, %v; want the new reason and the first BannedAt", b2, err)
	}
	u, err := f.is.Unban(f.ctx, p.ID)
	if err != nil || u.Banned || u.BanReason != "" || u.BannedAt != nil {
		t.Fatalf("Unban = %+v, %v", u, err)
	}
	f.storedPrincipal(u)
	f.verify(f.is, "unbanned", tok, credential.ScopeNodeHeartbeat)
	f.verify(f.is, "unbanned, minted while banned", newTok, credential.ScopeNodeHeartbeat)
	if u2, err := f.is.Unban(f.ctx, p.ID); err != nil || u2.Banned {
		t.Fatalf("second Unban = %+v, %v", u2, err)
	}
	_, err = f.is.Ban(f.ctx, "nobody", "x")
	wantErr(t, "ban unknown", err, credential.ErrNotFound)
	_, err = f.is.Unban(f.ctx, "nobody")
	wantErr(t, "unban unknown", err, credential.ErrNotFound)
	_, err = f.is.Ban(f.ctx, p.ID, strings.Repeat("x", 1025))
	wantErr(t, "long reason", err, credential.ErrInvalidArgument)
}

// Verify answers with the first failing check: expired, revoked, banned, scope.
func testCheckOrder(t *testing.T, f *fixture) {
	p := f.principal(credential.KindNode, "n")
	expiredRevoked, c1 := f.mint(p.ID, time.Minute, credential.ScopeNodePoll)
	f.is.Revoke(f.ctx, c1.ID)
	revoked, c2 := f.mint(p.ID, time.Hour, credential.ScopeNodePoll)
	f.is.Revoke(f.ctx, c2.ID)
	live, _ := f.mint(p.ID, time.Hour, credential.ScopeNodePoll)
	f.is.Ban(f.ctx, p.ID, "r")
	f.clock.Advance(time.Minute)
	f.refuse(f.is, "expired, revoked, banned, wrong scope", expiredRevoked, credential.ScopeOperatorJobs, credential.ErrExpired)
	f.refuse(f.is, "revoked, banned, wrong scope", revoked, credential.ScopeOperatorJobs, credential.ErrRevoked)
	f.refuse(f.is, "banned, wrong scope", live, credential.ScopeOperatorJobs, credential.ErrBanned)
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
	if _, c, _ := pinned.Mint(f.ctx, p.ID, []credential.Scope{credential.ScopeNodePoll}, 0); c == nil || c.PepperVersion != 1 {
		t.Fatalf("Mint pinned to version 1 = %+v", c)
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

func testTimestamps(t *testing.T, f *fixture) {
	p := f.principal(credential.KindNode, "n")
	f.storedPrincipal(p)
	tok, c := f.mint(p.ID, 90*time.Minute+1500*time.Nanosecond, credential.ScopeNodePoll)
	f.stored(c)
	f.clock.Advance(1234567 * time.Nanosecond)
	r, _ := f.is.Revoke(f.ctx, c.ID)
	f.stored(r)
	b, _ := f.is.Ban(f.ctx, p.ID, "r")
	f.storedPrincipal(b)
	f.clock.Advance(1500 * time.Nanosecond)
	_, rc := f.mint(p.ID, 0, credential.ScopeNodePoll)
	_, nc, err := f.is.Rotate(f.ctx, rc.ID, 7*time.Second+999*time.Nanosecond)
	if err != nil {
		t.Fatal(err)
	}
	f.stored(nc)
	old, _ := f.is.Credential(f.ctx, rc.ID)
	f.stored(old)
	for _, ts := range []time.Time{p.CreatedAt, c.CreatedAt, c.ExpiresAt, *r.RevokedAt, *b.BannedAt, nc.CreatedAt, old.ExpiresAt} {
		if ts.Nanosecond()%1000 != 0 || ts.Location() != time.UTC {
			t.Fatalf("time %v is not UTC microseconds", ts)
		}
	}
	if _, _, err := f.is.Verify(f.ctx, tok, credential.ScopeNodePoll); !errors.Is(err, credential.ErrRevoked) {
		t.Fatalf("Verify = %v", err)
	}
}

func testSentinels(t *testing.T, f *fixture) {
	p := f.principal(credential.KindNode, "n")
	op := f.principal(credential.KindOperator, "op")
	poll := []credential.Scope{credential.ScopeNodePoll}
	tests := []struct {
		name string
		call func() error
		want error
	}{
		{"principal unknown", func() error { _, err := f.is.Principal(f.ctx, "nobody"); return err }, credential.ErrNotFound},
		{"credential unknown", func() error { _, err := f.is.Credential(f.ctx, "nothing"); return err }, credential.ErrNotFound},
		{"credentials of unknown", func() error { _, err := f.is.Credentials(f.ctx, "nobody"); return err }, credential.ErrNotFound},
		{"mint for unknown", func() error { _, _, err := f.is.Mint(f.ctx, "nobody", poll, 0); return err }, credential.ErrNotFound},
		{"mint no scopes", func() error { _, _, err := f.is.Mint(f.ctx, p.ID, nil, 0); return err }, credential.ErrInvalidArgument},
		{"mint empty scopes", func() error { _, _, err := f.is.Mint(f.ctx, p.ID, []credential.Scope{}, 0); return err }, credential.ErrInvalidArgument},
		{"mint one unknown scope", func() error {
			_, _, err := f.is.Mint(f.ctx, p.ID, []credential.Scope{credential.ScopeNodePoll, "node:all"}, 0)
			return err
		}, credential.ErrInvalidArgument},
		{"mint negative ttl", func() error { _, _, err := f.is.Mint(f.ctx, p.ID, poll, -time.Second); return err }, credential.ErrInvalidArgument},
		{"duplicate principal", func() error {
			_, err := f.is.CreatePrincipal(f.ctx, credential.Principal{ID: p.ID, Kind: credential.KindOperator})
			return err
		}, credential.ErrConflict},
		{"bad kind", func() error {
			_, err := f.is.CreatePrincipal(f.ctx, credential.Principal{Kind: "admin"})
			return err
		}, credential.ErrInvalidArgument},
		{"bad id", func() error {
			_, err := f.is.CreatePrincipal(f.ctx, credential.Principal{ID: "a b", Kind: credential.KindNode})
			return err
		}, credential.ErrInvalidArgument},
		{"long id", func() error {
			_, err := f.is.CreatePrincipal(f.ctx, credential.Principal{ID: strings.Repeat("a", 129), Kind: credential.KindNode})
			return err
		}, credential.ErrInvalidArgument},
		{"operator with key", func() error {
			_, err := f.is.CreatePrincipal(f.ctx, credential.Principal{Kind: credential.KindOperator, PublicKey: newKey(t)})
			return err
		}, credential.ErrInvalidArgument},
		{"short key", func() error {
			_, err := f.is.CreatePrincipal(f.ctx, credential.Principal{Kind: credential.KindNode, PublicKey: make([]byte, 31)})
			return err
		}, credential.ErrInvalidArgument},
		{"set key on operator", func() error { _, err := f.is.SetNodeKey(f.ctx, op.ID, newKey(t)); return err }, credential.ErrInvalidArgument},
		{"set long key", func() error { _, err := f.is.SetNodeKey(f.ctx, p.ID, make([]byte, 33)); return err }, credential.ErrInvalidArgument},
		{"set nil key", func() error { _, err := f.is.SetNodeKey(f.ctx, p.ID, nil); return err }, credential.ErrInvalidArgument},
		{"set key on unknown", func() error { _, err := f.is.SetNodeKey(f.ctx, "nobody", newKey(t)); return err }, credential.ErrNotFound},
		{"revoke unknown", func() error { _, err := f.is.Revoke(f.ctx, "nothing"); return err }, credential.ErrNotFound},
		{"rotate unknown", func() error { _, _, err := f.is.Rotate(f.ctx, "nothing", 0); return err }, credential.ErrNotFound},
		{"verify empty", func() error { _, _, err := f.is.Verify(f.ctx, "", credential.ScopeNodePoll); return err }, credential.ErrMissingCredential},
		{"verify garbage", func() error { _, _, err := f.is.Verify(f.ctx, "nlc_x", credential.ScopeNodePoll); return err }, credential.ErrInvalidToken},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			wantErr(t, tc.name, tc.call(), tc.want)
		})
	}
	if n, err := f.is.Credentials(f.ctx, p.ID); err != nil || len(n) != 0 {
		t.Fatalf("failed mints left %d credentials (%v)", len(n), err)
	}
	if got, _ := f.is.Principal(f.ctx, p.ID); got.Kind != credential.KindNode || got.PublicKey != nil {
		t.Fatalf("failed calls changed the principal: %+v", got)
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
	f.is.Revoke(f.ctx, mustParse(t, tok))
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

func testListing(t *testing.T, f *fixture) {
	a := f.principal(credential.KindNode, "a")
	b := f.principal(credential.KindNode, "b")
	var want []string
	for i := range 5 {
		_, c := f.mint(a.ID, 0, credential.ScopeNodePoll)
		want = append(want, c.ID)
		f.mint(b.ID, 0, credential.ScopeNodePoll)
		if i%2 == 0 {
			f.clock.Advance(time.Millisecond)
		}
	}
	_, rotated := f.mint(a.ID, 0, credential.ScopeNodeHeartbeat)
	f.clock.Advance(time.Millisecond)
	_, nc, err := f.is.Rotate(f.ctx, rotated.ID, time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	want = append(want, rotated.ID, nc.ID)
	got, err := f.is.Credentials(f.ctx, a.ID)
	if err != nil {
		t.Fatal(err)
	}
	var ids []string
	for i, c := range got {
		ids = append(ids, c.ID)
		if c.PrincipalID != a.ID {
			t.Fatalf("credential %s of %s listed for %s", c.ID, c.PrincipalID, a.ID)
		}
		if i > 0 && (c.CreatedAt.Before(got[i-1].CreatedAt) || c.CreatedAt.Equal(got[i-1].CreatedAt) && c.ID < got[i-1].ID) {
			t.Fatalf("credentials out of order at %d: %v", i, ids)
		}
	}
	if d := cmp.Diff(want, ids, cmpopts.SortSlices(func(x, y string) bool { return x < y })); d != "" {
		t.Fatalf("listed credentials (-want +got):\n%s", d)
	}
	for _, c := range got {
		f.stored(c)
	}
	none := f.principal(credential.KindOperator, "none")
	if got, err := f.is.Credentials(f.ctx, none.ID); err != nil || len(got) != 0 {
		t.Fatalf("Credentials of a principal without any = %v, %v", got, err)
	}
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
	f.is.Ban(f.ctx, node.ID, "audit")
	var rows []any
	for _, p := range []*credential.Principal{node, op} {
		sp, err := f.store.GetPrincipal(f.ctx, p.ID)
		if err != nil {
			t.Fatal(err)
		}
		rows = append(rows, sp)
		cs, err := f.store.ListCredentials(f.ctx, p.ID)
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
	var dump strings.Builder
	for _, r := range rows {
		fmt.Fprintf(&dump, "%v\n%+v\n%#v\n", r, r, r)
		j, err := json.Marshal(r)
		if err != nil {
			t.Fatal(err)
		}
		dump.Write(j)
		dump.WriteByte('\n')
	}
	text := dump.String()
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

func testConcurrentMints(t *testing.T, f *fixture) {
	const goroutines, each = 16, 25
	p := f.principal(credential.KindNode, "n")
	var (
		mu     sync.Mutex
		tokens = map[string]string{} // token -> credential id
		wg     sync.WaitGroup
		errs   = make(chan error, goroutines)
	)
	for range goroutines {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range each {
				tok, c, err := f.is.Mint(f.ctx, p.ID, []credential.Scope{credential.ScopeNodePoll}, 0)
				if err != nil {
					errs <- err
					return
				}
				if _, _, err := f.is.Verify(f.ctx, tok, credential.ScopeNodePoll); err != nil {
					errs <- fmt.Errorf("verify a fresh token: %w", err)
					return
				}
				mu.Lock()
				tokens[tok] = c.ID
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	ids := map[string]bool{}
	for _, id := range tokens {
		ids[id] = true
	}
	if len(tokens) != goroutines*each || len(ids) != goroutines*each {
		t.Fatalf("%d distinct tokens and %d distinct ids, want %d", len(tokens), len(ids), goroutines*each)
	}
	list, err := f.is.Credentials(f.ctx, p.ID)
	if err != nil || len(list) != goroutines*each {
		t.Fatalf("Credentials = %d, %v; want %d", len(list), err, goroutines*each)
	}
	for _, c := range list {
		if !ids[c.ID] {
			t.Fatalf("listed credential %s was not minted", c.ID)
		}
	}
}

// Two rotations of one credential at once: exactly one wins, and the
// loser leaves no live credential behind.
func testConcurrentRotations(t *testing.T, f *fixture) {
	p := f.principal(credential.KindNode, "n")
	for i := range 20 {
		_, c := f.mint(p.ID, 0, credential.ScopeNodePoll)
		var (
			wg   sync.WaitGroup
			toks [2]string
			errs [2]error
		)
		for g := range 2 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				toks[g], _, errs[g] = f.is.Rotate(f.ctx, c.ID, time.Hour)
			}()
		}
		wg.Wait()
		won := 0
		for g := range 2 {
			if errs[g] == nil {
				won++
				f.verify(f.is, "winner", toks[g], credential.ScopeNodePoll)
			} else if !errors.Is(errs[g], credential.ErrInvalidArgument) {
				t.Fatalf("round %d: losing rotation: %v", i, errs[g])
			}
		}
		if won != 1 {
			t.Fatalf("round %d: %d rotations succeeded (%v), want 1", i, won, errs)
		}
		f.is.Revoke(f.ctx, c.ID)
	}
	// Each round leaves one live credential: the winner's.
	list, _ := f.is.Credentials(f.ctx, p.ID)
	live := 0
	for _, c := range list {
		if c.RevokedAt == nil {
			live++
		}
	}
	if live != 20 {
		t.Fatalf("%d live credentials after 20 rounds, want 20", live)
	}
}

// A revocation racing a rotation is never lost.
func testConcurrentRevokeRotate(t *testing.T, f *fixture) {
	for i := range 20 {
		p := f.principal(credential.KindNode, fmt.Sprintf("n%d", i))
		tok, c := f.mint(p.ID, 0, credential.ScopeNodePoll)
		var (
			wg        sync.WaitGroup
			revokeErr error
			rotateErr error
			newTok    string
		)
		wg.Add(2)
		go func() { defer wg.Done(); _, revokeErr = f.is.Revoke(f.ctx, c.ID) }()
		go func() { defer wg.Done(); newTok, _, rotateErr = f.is.Rotate(f.ctx, c.ID, time.Hour) }()
		wg.Wait()
		if revokeErr != nil {
			t.Fatalf("round %d: Revoke: %v", i, revokeErr)
		}
		f.refuse(f.is, "revoked while rotating", tok, credential.ScopeNodePoll, credential.ErrRevoked)
		live := 0
		list, _ := f.is.Credentials(f.ctx, p.ID)
		for _, lc := range list {
			if lc.RevokedAt == nil {
				live++
			}
		}
		switch {
		case rotateErr == nil:
			f.verify(f.is, "successor", newTok, credential.ScopeNodePoll)
			if live != 1 {
				t.Fatalf("round %d: %d live credentials after a rotation, want 1", i, live)
			}
		case errors.Is(rotateErr, credential.ErrRevoked):
			if live != 0 {
				t.Fatalf("round %d: a refused rotation left %d live credentials", i, live)
			}
		default:
			t.Fatalf("round %d: Rotate: %v", i, rotateErr)
		}
	}
}

// A ban racing a key change is never lost, nor is the key.
func testConcurrentBanSetKey(t *testing.T, f *fixture) {
	for i := range 20 {
		p := f.principal(credential.KindNode, fmt.Sprintf("n%d", i))
		key := newKey(t)
		var wg sync.WaitGroup
		var banErr, keyErr error
		wg.Add(2)
		go func() { defer wg.Done(); _, banErr = f.is.Ban(f.ctx, p.ID, "race") }()
		go func() { defer wg.Done(); _, keyErr = f.is.SetNodeKey(f.ctx, p.ID, key) }()
		wg.Wait()
		if banErr != nil || keyErr != nil {
			t.Fatalf("round %d: Ban: %v, SetNodeKey: %v", i, banErr, keyErr)
		}
		got, _ := f.is.Principal(f.ctx, p.ID)
		if !got.Banned || !key.Equal(got.PublicKey) {
			t.Fatalf("round %d: lost an update: banned %v, key set %v", i, got.Banned, key.Equal(got.PublicKey))
		}
	}
}

// The Store's own contract, which the Issuer relies on: updates apply only
// to the revision read, ids are unique, and records come back as copies.
func testStoreContract(t *testing.T, f *fixture) {
	p := f.principal(credential.KindNode, "n")
	_, c := f.mint(p.ID, 0, credential.ScopeNodePoll)

	sp, _ := f.store.GetPrincipal(f.ctx, p.ID)
	stale := *sp
	sp.Name, sp.Rev = "renamed", sp.Rev+1
	if err := f.store.UpdatePrincipal(f.ctx, sp, stale.Rev); err != nil {
		t.Fatalf("UpdatePrincipal at the current revision: %v", err)
	}
	f.storedPrincipal(sp)
	stale.Name, stale.Rev = "stale", stale.Rev+1
	wantErr(t, "UpdatePrincipal at a stale revision", f.store.UpdatePrincipal(f.ctx, &stale, stale.Rev-1), credential.ErrConflict)
	f.storedPrincipal(sp)
	ghost := *sp
	ghost.ID = "ghost"
	wantErr(t, "UpdatePrincipal of an unknown id", f.store.UpdatePrincipal(f.ctx, &ghost, ghost.Rev-1), credential.ErrNotFound)
	_, err := f.store.GetPrincipal(f.ctx, "ghost")
	wantErr(t, "GetPrincipal of an unknown id", err, credential.ErrNotFound)

	sc, _ := f.store.GetCredential(f.ctx, c.ID)
	old := *sc
	sc.RotatedTo, sc.Rev = "next", sc.Rev+1
	if err := f.store.UpdateCredential(f.ctx, sc, old.Rev); err != nil {
		t.Fatalf("UpdateCredential at the current revision: %v", err)
	}
	f.stored(sc)
	now := f.clock.Now().UTC().Truncate(time.Microsecond)
	old.RevokedAt, old.Rev = &now, old.Rev+1
	wantErr(t, "UpdateCredential at a stale revision", f.store.UpdateCredential(f.ctx, &old, old.Rev-1), credential.ErrConflict)
	f.stored(sc)
	gc := *sc
	gc.ID = strings.Repeat("0", 32)
	wantErr(t, "UpdateCredential of an unknown id", f.store.UpdateCredential(f.ctx, &gc, gc.Rev-1), credential.ErrNotFound)
	_, err = f.store.GetCredential(f.ctx, gc.ID)
	wantErr(t, "GetCredential of an unknown id", err, credential.ErrNotFound)
	dup := *sc
	dup.Rev = 1
	wantErr(t, "CreateCredential with a taken id", f.store.CreateCredential(f.ctx, &dup), credential.ErrConflict)
	f.stored(sc)
	if cs, err := f.store.ListCredentials(f.ctx, "nobody"); err != nil || len(cs) != 0 {
		t.Fatalf("ListCredentials of an unknown principal = %v, %v", cs, err)
	}

	// Changing what a store returned, or what it was given, changes nothing stored.
	want := *sc
	want.Scopes, want.Digest = slices.Clone(sc.Scopes), slices.Clone(sc.Digest)
	for range 2 {
		got, _ := f.store.GetCredential(f.ctx, c.ID)
		got.Scopes[0], got.Digest[0], got.ExpiresAt = credential.ScopeOperatorJobs, got.Digest[0]^1, epoch
		sc.Scopes[0], sc.Digest[0] = credential.ScopeOperatorReceipts, sc.Digest[0]^2
	}
	f.stored(&want)
	key := newKey(t)
	kp, err := f.is.SetNodeKey(f.ctx, p.ID, key)
	if err != nil {
		t.Fatal(err)
	}
	wantP := *kp
	wantP.PublicKey = slices.Clone(kp.PublicKey)
	key[0] ^= 1
	kp.PublicKey[1] ^= 1
	for range 2 {
		got, _ := f.store.GetPrincipal(f.ctx, p.ID)
		got.PublicKey[2] ^= 1
	}
	f.storedPrincipal(&wantP)
}

// decodeToken is an independent reading of the token format of DESIGN §4
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
