package credentialtest

import (
	"strings"
	"testing"
	"time"

	"github.com/nodelane/nodelane/credential"
)

var principalTests = []test{
	{"Principals", testPrincipals},
	{"BanUnban", testBanUnban},
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
