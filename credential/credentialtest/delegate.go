package credentialtest

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/nodelane/nodelane/credential"
)

// testNoEscalation: MintAs mints only scopes the minting credential holds,
// names every scope it lacks, and writes nothing when it refuses.
func testNoEscalation(t *testing.T, f *fixture) {
	var operatorScopes []credential.Scope
	for _, s := range credential.AllScopes() {
		if strings.HasPrefix(string(s), "operator:") {
			operatorScopes = append(operatorScopes, s)
		}
	}
	op := f.principal(credential.KindOperator, "op")
	other := f.principal(credential.KindOperator, "other")
	_, narrow := f.mint(op.ID, time.Hour, credential.ScopeOperatorCredentials)
	_, two := f.mint(op.ID, time.Hour, credential.ScopeOperatorCredentials, credential.ScopeOperatorJobs)
	_, root := f.mint(op.ID, time.Hour, credential.AllScopes()...)
	count := func() int {
		t.Helper()
		return len(f.credentials(op.ID)) + len(f.credentials(other.ID))
	}
	before := count()
	for _, tc := range []struct {
		name    string
		minter  *credential.Credential
		scopes  []credential.Scope
		missing []credential.Scope
	}{
		// The attack: a credential holding only operator:credentials
		// mints itself every operator scope.
		{"every operator scope from operator:credentials", narrow, operatorScopes,
			[]credential.Scope{credential.ScopeOperatorJobs, credential.ScopeOperatorWorkers, credential.ScopeOperatorEnvelope, credential.ScopeOperatorReceipts}},
		{"one scope it lacks", narrow, []credential.Scope{credential.ScopeOperatorReceipts}, []credential.Scope{credential.ScopeOperatorReceipts}},
		{"a node scope", two, []credential.Scope{credential.ScopeNodeRegister, credential.ScopeOperatorJobs}, []credential.Scope{credential.ScopeNodeRegister}},
		{"repeated and out of order", two, []credential.Scope{credential.ScopeOperatorReceipts, credential.ScopeOperatorJobs, credential.ScopeOperatorReceipts, credential.ScopeNodePoll},
			[]credential.Scope{credential.ScopeNodePoll, credential.ScopeOperatorReceipts}},
	} {
		for _, target := range []string{op.ID, other.ID, "nobody"} {
			_, c, err := f.is.MintAs(f.ctx, tc.minter.ID, target, tc.scopes, credential.MintOptions{})
			wantErr(t, tc.name+" for "+target, err, credential.ErrInsufficientScope)
			var se *credential.ScopeError
			if !errors.As(err, &se) || se.CredentialID != tc.minter.ID {
				t.Fatalf("%s: err = %#v, want a *ScopeError of %s", tc.name, err, tc.minter.ID)
			}
			if d := cmp.Diff(tc.missing, se.Missing); d != "" {
				t.Fatalf("%s: missing scopes (-want +got):\n%s", tc.name, d)
			}
			for _, s := range tc.missing {
				if !strings.Contains(err.Error(), string(s)) {
					t.Fatalf("%s: message %q does not name %s", tc.name, err, s)
				}
			}
			if c != nil {
				t.Fatalf("%s: refused, yet returned %+v", tc.name, c)
			}
		}
	}
	if n := count(); n != before {
		t.Fatalf("refused mints left %d credentials, want %d", n, before)
	}

	// What a minter holds, it may give, to itself or to another, in part
	// or whole, once or many times.
	for _, tc := range []struct {
		name   string
		minter *credential.Credential
		target string
		scopes []credential.Scope
	}{
		{"its own scope to itself", narrow, op.ID, []credential.Scope{credential.ScopeOperatorCredentials}},
		{"its own scope to another", narrow, other.ID, []credential.Scope{credential.ScopeOperatorCredentials}},
		{"a subset", two, other.ID, []credential.Scope{credential.ScopeOperatorJobs}},
		{"all it holds, repeated", two, other.ID, []credential.Scope{credential.ScopeOperatorJobs, credential.ScopeOperatorCredentials, credential.ScopeOperatorJobs}},
		{"every scope from every scope", root, other.ID, credential.AllScopes()},
	} {
		tok, c, err := f.is.MintAs(f.ctx, tc.minter.ID, tc.target, tc.scopes, credential.MintOptions{TTL: time.Minute})
		if err != nil {
			t.Fatalf("%s: MintAs = %v", tc.name, err)
		}
		if c.PrincipalID != tc.target || !c.ExpiresAt.Equal(f.clock.Now().UTC().Truncate(time.Microsecond).Add(time.Minute)) {
			t.Fatalf("%s: minted %+v", tc.name, c)
		}
		for _, s := range c.Scopes {
			f.verify(f.is, tc.name, tok, s)
		}
		f.stored(c)
	}

	// A minter that no longer verifies mints nothing; nor does MintAs
	// for an unknown principal or with bad arguments.
	_, revoked := f.mint(op.ID, time.Hour, credential.ScopeOperatorCredentials)
	f.revoke(revoked.ID)
	_, expiring := f.mint(op.ID, time.Minute, credential.ScopeOperatorCredentials)
	banned := f.principal(credential.KindOperator, "banned")
	_, ofBanned := f.mint(banned.ID, time.Hour, credential.ScopeOperatorCredentials)
	f.ban(banned.ID, "left the team")
	f.clock.Advance(time.Minute)
	before = count()
	oc := []credential.Scope{credential.ScopeOperatorCredentials}
	for _, tc := range []struct {
		name, minter, target string
		scopes               []credential.Scope
		opt                  credential.MintOptions
		want                 error
	}{
		{"revoked minter", revoked.ID, other.ID, oc, credential.MintOptions{}, credential.ErrRevoked},
		{"expired minter", expiring.ID, other.ID, oc, credential.MintOptions{}, credential.ErrExpired},
		{"banned minter", ofBanned.ID, other.ID, oc, credential.MintOptions{}, credential.ErrBanned},
		{"unknown minter", strings.Repeat("0", 32), other.ID, oc, credential.MintOptions{}, credential.ErrInvalidToken},
		{"minter id not UTF-8", "\xff", other.ID, oc, credential.MintOptions{}, credential.ErrInvalidToken},
		{"unknown principal", narrow.ID, "nobody", oc, credential.MintOptions{}, credential.ErrNotFound},
		{"no scopes", narrow.ID, other.ID, nil, credential.MintOptions{}, credential.ErrInvalidArgument},
		{"unknown scope", narrow.ID, other.ID, []credential.Scope{"operator:*"}, credential.MintOptions{}, credential.ErrInvalidArgument},
		{"negative ttl", narrow.ID, other.ID, oc, credential.MintOptions{TTL: -time.Second}, credential.ErrInvalidArgument},
	} {
		_, c, err := f.is.MintAs(f.ctx, tc.minter, tc.target, tc.scopes, tc.opt)
		wantErr(t, tc.name, err, tc.want)
		if errors.Is(err, credential.ErrInsufficientScope) || c != nil {
			t.Fatalf("%s: err = %v, credential %+v", tc.name, err, c)
		}
	}
	if n := count(); n != before {
		t.Fatalf("refused mints left %d credentials, want %d", n, before)
	}
	// Mint itself, for callers with authority of their own, checks no minter.
	if _, _, err := f.is.Mint(f.ctx, other.ID, credential.AllScopes(), 0); err != nil {
		t.Fatalf("Mint of every scope: %v", err)
	}
}

// testNoOutliving: MintAs cuts the new credential's life to its minter's,
// whatever TTL is asked for, the default included, and leaves a shorter
// one alone.
func testNoOutliving(t *testing.T, f *fixture) {
	op := f.principal(credential.KindOperator, "op")
	other := f.principal(credential.KindOperator, "other")
	_, minter := f.mint(op.ID, time.Hour, credential.ScopeOperatorCredentials)
	f.clock.Advance(10 * time.Minute)
	oc := []credential.Scope{credential.ScopeOperatorCredentials}
	for _, tc := range []struct {
		name string
		ttl  time.Duration
		want time.Time
	}{
		{"longer ttl", 365 * 24 * time.Hour, minter.ExpiresAt},
		{"default ttl", 0, minter.ExpiresAt},
		{"shorter ttl", time.Minute, f.clock.Now().UTC().Add(time.Minute).Truncate(time.Microsecond)},
	} {
		_, c, err := f.is.MintAs(f.ctx, minter.ID, other.ID, oc, credential.MintOptions{TTL: tc.ttl})
		if err != nil {
			t.Fatalf("%s: MintAs = %v", tc.name, err)
		}
		if !c.ExpiresAt.Equal(tc.want) {
			t.Fatalf("%s: expires %v, want %v (minter expires %v)", tc.name, c.ExpiresAt, tc.want, minter.ExpiresAt)
		}
		f.stored(c)
	}
}
