package credentialtest

import (
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"

	"github.com/nodelane/nodelane/credential"
)

var recordTests = []test{
	{"Timestamps", testTimestamps},
	{"SentinelErrors", testSentinels},
	{"Listing", testListing},
	{"ListingPages", testListingPages},
	{"ListingMany", testListingMany},
	{"StoreRevisionsAndCopies", testStoreContract},
	{"IDsAreBytes", testIDsAreBytes},
	{"TextRoundTrip", testTextRoundTrip},
}

func testTimestamps(t *testing.T, f *fixture) {
	p := f.principal(credential.KindNode, "n")
	f.storedPrincipal(p)
	tok, c := f.mint(p.ID, 90*time.Minute+1500*time.Nanosecond, credential.ScopeNodePoll)
	f.stored(c)
	f.clock.Advance(1234567 * time.Nanosecond)
	r := f.revoke(c.ID)
	f.stored(r)
	b := f.ban(p.ID, "r")
	f.storedPrincipal(b)
	f.clock.Advance(1500 * time.Nanosecond)
	_, rc := f.mint(p.ID, 0, credential.ScopeNodePoll)
	_, nc, err := f.is.Rotate(f.ctx, rc.ID, 7*time.Second+999*time.Nanosecond)
	if err != nil {
		t.Fatal(err)
	}
	f.stored(nc)
	old := f.credential(rc.ID)
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
	key := newKey(t)
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
			_, err := f.is.CreatePrincipal(f.ctx, credential.Principal{Kind: credential.KindOperator, PublicKey: key})
			return err
		}, credential.ErrInvalidArgument},
		{"short key", func() error {
			_, err := f.is.CreatePrincipal(f.ctx, credential.Principal{Kind: credential.KindNode, PublicKey: make([]byte, 31)})
			return err
		}, credential.ErrInvalidArgument},
		{"set key on operator", func() error { _, err := f.is.SetNodeKey(f.ctx, op.ID, key); return err }, credential.ErrInvalidArgument},
		{"set long key", func() error { _, err := f.is.SetNodeKey(f.ctx, p.ID, make([]byte, 33)); return err }, credential.ErrInvalidArgument},
		{"set nil key", func() error { _, err := f.is.SetNodeKey(f.ctx, p.ID, nil); return err }, credential.ErrInvalidArgument},
		{"set key on unknown", func() error { _, err := f.is.SetNodeKey(f.ctx, "nobody", key); return err }, credential.ErrNotFound},
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
	if got := f.getPrincipal(p.ID); got.Kind != credential.KindNode || got.PublicKey != nil {
		t.Fatalf("failed calls changed the principal: %+v", got)
	}
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

// The Store's own contract, which the Issuer relies on: updates apply only
// to the revision read, ids are unique, and records come back as copies.
func testStoreContract(t *testing.T, f *fixture) {
	p := f.principal(credential.KindNode, "n")
	_, c := f.mint(p.ID, 0, credential.ScopeNodePoll)

	sp := f.rawPrincipal(p.ID)
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

	sc := f.rawCredential(c.ID)
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
	if cs, err := f.store.ListCredentials(f.ctx, credential.CredentialFilter{PrincipalID: "nobody", Limit: 10}); err != nil || len(cs) != 0 {
		t.Fatalf("ListCredentials of an unknown principal = %v, %v", cs, err)
	}

	// Changing what a store returned, or what it was given, changes nothing stored.
	want := *sc
	want.Scopes, want.Digest = slices.Clone(sc.Scopes), slices.Clone(sc.Digest)
	for range 2 {
		got := f.rawCredential(c.ID)
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
		got := f.rawPrincipal(p.ID)
		got.PublicKey[2] ^= 1
	}
	f.storedPrincipal(&wantP)
}

// testIDsAreBytes: ids are compared as bytes. Ids that differ only in case
// are different principals, through the Issuer; at the Store, ids that
// differ only in case, Unicode form or trailing space are too, as a
// case-insensitive, accent-insensitive or PAD SPACE collation would not
// have them.
func testIDsAreBytes(t *testing.T, f *fixture) {
	ids := []string{"Op-A", "op-a", "OP-A", "oP-a"}
	toks := make(map[string]string)
	for i, id := range ids {
		kind := credential.KindOperator
		if i%2 == 1 {
			kind = credential.KindNode
		}
		p := f.principal(kind, id)
		if p.ID != id {
			t.Fatalf("CreatePrincipal(%q) created %q", id, p.ID)
		}
		toks[id], _ = f.mint(id, 0, credential.ScopeNodePoll, credential.ScopeOperatorJobs)
	}
	_, err := f.is.CreatePrincipal(f.ctx, credential.Principal{ID: "Op-A", Kind: credential.KindNode})
	wantErr(t, "CreatePrincipal of a taken id", err, credential.ErrConflict)
	f.ban("Op-A", "only this one")
	for _, id := range ids {
		p := f.getPrincipal(id)
		if p.ID != id || p.Banned != (id == "Op-A") {
			t.Fatalf("Principal(%q) = %+v", id, p)
		}
		if id == "Op-A" {
			f.refuse(f.is, "the banned one", toks[id], credential.ScopeNodePoll, credential.ErrBanned)
			continue
		}
		if got, _ := f.verify(f.is, "principal "+id, toks[id], credential.ScopeNodePoll); got.ID != id {
			t.Fatalf("the token of %q verifies as %q's", id, got.ID)
		}
		cs := f.credentials(id)
		if len(cs) != 1 || cs[0].PrincipalID != id {
			t.Fatalf("Credentials(%q) = %d credentials, of %q", id, len(cs), cs[0].PrincipalID)
		}
	}

	// At the Store itself, any UTF-8 id without NUL.
	raw := []string{"nœud-é", "nœud-e\u0301", "NŒUD-É", "nœud-É", "узел-1", "УЗЕЛ-1", "节点-1", "node-a", "node-a ", "node-ä", "🚀-1"}
	for i, id := range raw {
		p := &credential.Principal{ID: id, Kind: credential.KindNode, Name: fmt.Sprint("raw ", i), CreatedAt: epoch.Truncate(time.Microsecond), Rev: 1}
		if err := f.store.CreatePrincipal(f.ctx, p); err != nil {
			t.Fatalf("Store.CreatePrincipal(%q): %v", id, err)
		}
		c := &credential.Credential{ID: fmt.Sprintf("%032x", i+1), PrincipalID: id, Scopes: []credential.Scope{credential.ScopeNodePoll},
			Digest: []byte{byte(i)}, PepperVersion: 1, CreatedAt: p.CreatedAt, ExpiresAt: p.CreatedAt.Add(time.Hour), Rev: 1}
		if err := f.store.CreateCredential(f.ctx, c); err != nil {
			t.Fatalf("Store.CreateCredential of %q: %v", id, err)
		}
	}
	for i, id := range raw {
		if got := f.rawPrincipal(id); got.ID != id || got.Name != fmt.Sprint("raw ", i) {
			t.Fatalf("Store.GetPrincipal(%q) = principal %q named %q", id, got.ID, got.Name)
		}
		dup := &credential.Principal{ID: id, Kind: credential.KindOperator, Rev: 1}
		wantErr(t, fmt.Sprintf("Store.CreatePrincipal(%q) again", id), f.store.CreatePrincipal(f.ctx, dup), credential.ErrConflict)
		cs, err := f.store.ListCredentials(f.ctx, credential.CredentialFilter{PrincipalID: id, Limit: 10})
		if err != nil {
			t.Fatal(err)
		}
		if len(cs) != 1 || cs[0].ID != fmt.Sprintf("%032x", i+1) || cs[0].PrincipalID != id {
			t.Fatalf("Store.ListCredentials(%q) = %d credentials, want its own one", id, len(cs))
		}
	}
	for _, id := range []string{"nœud-E\u0301", "NODE-A", "node-a  ", " node-a", "op-A"} {
		if _, err := f.store.GetPrincipal(f.ctx, id); !errors.Is(err, credential.ErrNotFound) {
			t.Fatalf("Store.GetPrincipal(%q), an id never stored = %v, want ErrNotFound", id, err)
		}
	}
	// The Credential ids the Issuer makes are lowercase hex; an uppercase
	// spelling is another id.
	if _, err := f.store.GetCredential(f.ctx, fmt.Sprintf("%032X", 10)); !errors.Is(err, credential.ErrNotFound) {
		t.Fatalf("Store.GetCredential of an id in uppercase = %v, want ErrNotFound", err)
	}
}

// testTextRoundTrip: names and ban reasons come back byte for byte; text
// no Store could keep (not UTF-8, or holding NUL) is refused, and ids that
// no Store could hold are no principal's.
func testTextRoundTrip(t *testing.T, f *fixture) {
	texts := []string{
		"  Studio GPU “α” — ünïcode\t\n  ",
		"e\u0301 and \u00e9", // decomposed and precomposed: not normalised
		"O'Brien\"; DROP TABLE nodelane_principals; --",
		`back\slash, 100% _wild_ \\`,
		"🚀\u200b\ufeff",
		" ",
		strings.Repeat("é", 128), // 256 bytes, the longest name
	}
	for i, text := range texts {
		p, err := f.is.CreatePrincipal(f.ctx, credential.Principal{ID: fmt.Sprintf("text-%d", i), Kind: credential.KindNode, Name: text})
		if err != nil {
			t.Fatalf("CreatePrincipal named %q: %v", text, err)
		}
		if got := f.rawPrincipal(p.ID); got.Name != text {
			t.Fatalf("name %q came back as %q", text, got.Name)
		}
		b := f.ban(p.ID, text+text)
		f.storedPrincipal(b)
		if got := f.rawPrincipal(p.ID); got.BanReason != text+text {
			t.Fatalf("ban reason %q came back as %q", text+text, got.BanReason)
		}
	}
	for _, bad := range []string{"bad \xff", "nul \x00 inside"} {
		_, err := f.is.CreatePrincipal(f.ctx, credential.Principal{Kind: credential.KindNode, Name: bad})
		wantErr(t, fmt.Sprintf("CreatePrincipal named %q", bad), err, credential.ErrInvalidArgument)
		_, err = f.is.Ban(f.ctx, "text-0", bad)
		wantErr(t, fmt.Sprintf("Ban for %q", bad), err, credential.ErrInvalidArgument)
		_, err = f.is.Principal(f.ctx, "text-0"+bad)
		wantErr(t, fmt.Sprintf("Principal(%q)", "text-0"+bad), err, credential.ErrNotFound)
		_, err = f.is.Credential(f.ctx, bad)
		wantErr(t, fmt.Sprintf("Credential(%q)", bad), err, credential.ErrNotFound)
		_, _, err = f.is.Mint(f.ctx, "text-0"+bad, []credential.Scope{credential.ScopeNodePoll}, 0)
		wantErr(t, fmt.Sprintf("Mint for %q", "text-0"+bad), err, credential.ErrNotFound)
	}
}
