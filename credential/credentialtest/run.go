// Package credentialtest is the conformance suite that every
// credential.Store must pass. An adapter's test calls Run with a function
// that returns a new, empty store:
//
//	func TestCredentialStore(t *testing.T) {
//		credentialtest.Run(t, func(t *testing.T) credential.Store { return newEmptyStore(t) })
//	}
//
// The suite's tests run in parallel, each on a store of its own: the
// function is called concurrently, from parallel subtests, and must
// return a store independent of every other it returned (a database, or
// a schema, of its own), so that no test sees another's writes.
//
// The suite drives the store through credential.Issuer, so it checks
// credentials end to end on that store: minting and verifying every scope,
// exact scope matching, expiry to the microsecond, revocation, rotation
// with and without grace, bans, pepper versions, exact timestamps,
// sentinel errors, that an unknown id and a wrong secret look the same,
// that no token or secret reaches a stored row, and concurrent mints,
// rotations, revocations and bans.
//
// The tests are grouped by area, one file each: principals.go (nodes,
// operators, keys, bans), tokens.go (the token format, peppers, what rows
// hold), scopes.go, lifecycle.go (expiry, revocation, rotation),
// records.go (what the store keeps and the errors it gives),
// concurrency.go and limits.go (credentials limited in uses, quotas, bans that
// follow a node's key, renewal).
package credentialtest

import (
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"

	"github.com/nodelane/nodelane/credential"
	"github.com/nodelane/nodelane/internal/testclock"
)

// Run runs the conformance suite against stores made by newStore. Each
// test gets its own store, and every test runs in parallel with the
// others (a test whose subtests share its store runs them one after
// another), so newStore is called concurrently, from parallel subtests,
// and must return independent stores: what one test writes must never
// show in another's store.
func Run(t *testing.T, newStore func(t *testing.T) credential.Store) {
	groups := []struct {
		name  string
		tests []test
	}{
		{"Principals", principalTests},
		{"Tokens", tokenTests},
		{"Scopes", scopeTests},
		{"Lifecycle", lifecycleTests},
		{"Records", recordTests},
		{"Concurrency", concurrencyTests},
		{"Limits", limitTests},
	}
	for _, g := range groups {
		t.Run(g.name, func(t *testing.T) {
			t.Parallel()
			runGroup(t, newStore, g.tests)
		})
	}
}

// test is one test of the suite. It gets a fixture over a fresh store.
type test struct {
	name string
	fn   func(t *testing.T, f *fixture)
}

// runGroup runs each test of tests in parallel, each on a fresh store.
func runGroup(t *testing.T, newStore func(t *testing.T) credential.Store, tests []test) {
	t.Helper()
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			tc.fn(t, newFixture(t, newStore))
		})
	}
}

// epoch has a nanosecond part so that stores that fail to truncate or to
// round-trip microseconds are caught.
var epoch = time.Date(2026, 11, 30, 9, 0, 0, 123456789, time.UTC)

func pepper(b byte) []byte { return []byte(strings.Repeat(string(rune('a'+b%26)), 32)) }

// fixture is one test's store, clock and Issuer. Its helpers fail t.
type fixture struct {
	t     *testing.T
	ctx   context.Context
	store credential.Store
	clock *testclock.Clock
	is    *credential.Issuer
}

func newFixture(t *testing.T, newStore func(t *testing.T) credential.Store) *fixture {
	t.Helper()
	f := &fixture{t: t, ctx: context.Background(), store: newStore(t), clock: testclock.New(epoch)}
	f.is = f.issuer(map[int][]byte{1: pepper(1)}, 1)
	return f
}

// sub returns the fixture for the subtest t: the same store, clock and
// Issuer, whose helpers fail t rather than its parent.
func (f *fixture) sub(t *testing.T) *fixture {
	g := *f
	g.t = t
	return &g
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

// keyID is an independent computation of the key id (PROTOCOL.md, section 4.1).
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

// The helpers below fail the test on any error, so that no error goes
// unchecked where a test only sets the stage.

func (f *fixture) credential(id string) *credential.Credential {
	f.t.Helper()
	c, err := f.is.Credential(f.ctx, id)
	if err != nil {
		f.t.Fatalf("Credential(%s): %v", id, err)
	}
	return c
}

func (f *fixture) credentials(principalID string) []*credential.Credential {
	f.t.Helper()
	cs, err := f.is.Credentials(f.ctx, principalID)
	if err != nil {
		f.t.Fatalf("Credentials(%s): %v", principalID, err)
	}
	return cs
}

func (f *fixture) revoke(id string) *credential.Credential {
	f.t.Helper()
	c, err := f.is.Revoke(f.ctx, id)
	if err != nil {
		f.t.Fatalf("Revoke(%s): %v", id, err)
	}
	return c
}

func (f *fixture) rotate(id string, grace time.Duration) (string, *credential.Credential) {
	f.t.Helper()
	tok, c, err := f.is.Rotate(f.ctx, id, grace)
	if err != nil {
		f.t.Fatalf("Rotate(%s, %v): %v", id, grace, err)
	}
	return tok, c
}

func (f *fixture) ban(id, reason string) *credential.Principal {
	f.t.Helper()
	p, err := f.is.Ban(f.ctx, id, reason)
	if err != nil {
		f.t.Fatalf("Ban(%s): %v", id, err)
	}
	return p
}

func (f *fixture) getPrincipal(id string) *credential.Principal {
	f.t.Helper()
	p, err := f.is.Principal(f.ctx, id)
	if err != nil {
		f.t.Fatalf("Principal(%s): %v", id, err)
	}
	return p
}

// live counts the credentials of principalID that are not revoked.
func (f *fixture) live(principalID string) int {
	f.t.Helper()
	n := 0
	for _, c := range f.credentials(principalID) {
		if c.RevokedAt == nil {
			n++
		}
	}
	return n
}

// rawPrincipal reads a principal from the store itself, past the Issuer.
func (f *fixture) rawPrincipal(id string) *credential.Principal {
	f.t.Helper()
	p, err := f.store.GetPrincipal(f.ctx, id)
	if err != nil {
		f.t.Fatalf("GetPrincipal(%s): %v", id, err)
	}
	return p
}

// rawCredential reads a credential from the store itself, past the Issuer.
func (f *fixture) rawCredential(id string) *credential.Credential {
	f.t.Helper()
	c, err := f.store.GetCredential(f.ctx, id)
	if err != nil {
		f.t.Fatalf("GetCredential(%s): %v", id, err)
	}
	return c
}
