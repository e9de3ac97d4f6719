package credentialtest

import (
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"

	"github.com/nodelane/nodelane/credential"
)

var lifecycleTests = []test{
	{"Expiry", testExpiry},
	{"Revoke", testRevoke},
	{"RotateAtOnce", testRotateAtOnce},
	{"RotateWithGrace", testRotateWithGrace},
	{"RotateRefused", testRotateRefused},
	{"CheckOrder", testCheckOrder},
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
	o := f.credential(old.ID)
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
	f.rotate(short.ID, time.Hour)
	if s := f.credential(short.ID); !s.ExpiresAt.Equal(short.ExpiresAt) {
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
	f.revoke(revoked.ID)
	_, expired := f.mint(p.ID, time.Minute, credential.ScopeNodePoll)
	_, rotated := f.mint(p.ID, time.Hour, credential.ScopeNodePoll)
	f.rotate(rotated.ID, time.Hour)
	_, live := f.mint(p.ID, time.Hour, credential.ScopeNodePoll)
	f.clock.Advance(time.Minute)
	before := f.credentials(p.ID)
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
	after := f.credentials(p.ID)
	if d := cmp.Diff(before, after, cmpopts.EquateEmpty()); d != "" {
		t.Fatalf("refused rotations changed the credentials (-before +after):\n%s", d)
	}
}

// Verify answers with the first failing check: expired, revoked, banned, scope.
func testCheckOrder(t *testing.T, f *fixture) {
	p := f.principal(credential.KindNode, "n")
	expiredRevoked, c1 := f.mint(p.ID, time.Minute, credential.ScopeNodePoll)
	f.revoke(c1.ID)
	revoked, c2 := f.mint(p.ID, time.Hour, credential.ScopeNodePoll)
	f.revoke(c2.ID)
	live, _ := f.mint(p.ID, time.Hour, credential.ScopeNodePoll)
	f.ban(p.ID, "r")
	f.clock.Advance(time.Minute)
	f.refuse(f.is, "expired, revoked, banned, wrong scope", expiredRevoked, credential.ScopeOperatorJobs, credential.ErrExpired)
	f.refuse(f.is, "revoked, banned, wrong scope", revoked, credential.ScopeOperatorJobs, credential.ErrRevoked)
	f.refuse(f.is, "banned, wrong scope", live, credential.ScopeOperatorJobs, credential.ErrBanned)
}
