package credentialtest

import (
	"errors"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/nodelane/nodelane/credential"
)

// limitTests: credentials limited in uses, bans that follow a node's key,
// and renewal.
var limitTests = []test{
	{"MaxUsesRoundTrip", testMaxUsesRoundTrip},
	{"UseCounts", testUseCounts},
	{"UseUnlimited", testUseUnlimited},
	{"ConcurrentUses", testConcurrentUses},
	{"PrincipalsByKey", testPrincipalsByKey},
	{"KeyBan", testKeyBan},
	{"Renew", testRenew},
	{"RenewAgainWithinGrace", testRenewAgain},
	{"Quota", testQuota},
	{"ConcurrentCharges", testConcurrentCharges},
}

func (f *fixture) mintLimited(principalID string, maxUses int64, scopes ...credential.Scope) (string, *credential.Credential) {
	f.t.Helper()
	tok, c, err := f.is.MintWith(f.ctx, principalID, scopes, credential.MintOptions{TTL: time.Hour, MaxUses: maxUses})
	if err != nil {
		f.t.Fatalf("MintWith(%s, max uses %d): %v", principalID, maxUses, err)
	}
	return tok, c
}

func testMaxUsesRoundTrip(t *testing.T, f *fixture) {
	p := f.principal(credential.KindOperator, "provisioner")
	_, c := f.mintLimited(p.ID, 3, credential.ScopeNodeRegister)
	if c.MaxUses != 3 || c.Uses != 0 {
		t.Fatalf("minted MaxUses %d, Uses %d; want 3, 0", c.MaxUses, c.Uses)
	}
	f.stored(c)
	u, err := f.is.Use(f.ctx, c.ID)
	if err != nil {
		t.Fatal(err)
	}
	if u.Uses != 1 || u.MaxUses != 3 || u.Rev != c.Rev+1 {
		t.Fatalf("after a use: Uses %d, MaxUses %d, Rev %d", u.Uses, u.MaxUses, u.Rev)
	}
	f.stored(u)
	// A large limit round-trips too.
	_, big := f.mintLimited(p.ID, 1<<53, credential.ScopeNodeRegister)
	f.stored(big)
	wantErr(t, "MintWith negative MaxUses", func() error {
		_, _, err := f.is.MintWith(f.ctx, p.ID, []credential.Scope{credential.ScopeNodeRegister}, credential.MintOptions{MaxUses: -1})
		return err
	}(), credential.ErrInvalidArgument)
}

func testUseCounts(t *testing.T, f *fixture) {
	p := f.principal(credential.KindOperator, "provisioner")
	tok, c := f.mintLimited(p.ID, 2, credential.ScopeNodeRegister)
	for i := range 2 {
		f.verify(f.is, "before the last use", tok, credential.ScopeNodeRegister)
		if _, err := f.is.Use(f.ctx, c.ID); err != nil {
			t.Fatalf("use %d: %v", i+1, err)
		}
	}
	before := f.rawCredential(c.ID)
	_, err := f.is.Use(f.ctx, c.ID)
	wantErr(t, "a use past MaxUses", err, credential.ErrExhausted)
	f.stored(before) // a refused use writes nothing
	f.refuse(f.is, "used up", tok, credential.ScopeNodeRegister, credential.ErrExhausted)
	// Expiry and revocation answer before exhaustion, as in Verify.
	_, c2 := f.mintLimited(p.ID, 1, credential.ScopeNodeRegister)
	f.revoke(c2.ID)
	_, err = f.is.Use(f.ctx, c2.ID)
	wantErr(t, "use of a revoked credential", err, credential.ErrRevoked)
	_, c3 := f.mintLimited(p.ID, 1, credential.ScopeNodeRegister)
	f.clock.Advance(time.Hour)
	_, err = f.is.Use(f.ctx, c3.ID)
	wantErr(t, "use of an expired credential", err, credential.ErrExpired)
	_, err = f.is.Use(f.ctx, "nothing")
	wantErr(t, "use of an unknown credential", err, credential.ErrNotFound)
}

// testUseUnlimited: a credential without a limit is counted too (how many
// nodes a provisioning credential registered), and never refused for it.
func testUseUnlimited(t *testing.T, f *fixture) {
	p := f.principal(credential.KindOperator, "provisioner")
	tok, c := f.mint(p.ID, time.Hour, credential.ScopeNodeRegister)
	for i := range 3 {
		u, err := f.is.Use(f.ctx, c.ID)
		if err != nil {
			t.Fatal(err)
		}
		if u.Uses != int64(i+1) || u.MaxUses != 0 || u.Rev != c.Rev+int64(i+1) {
			t.Fatalf("use %d of an unlimited credential: Uses %d, MaxUses %d, Rev %d", i+1, u.Uses, u.MaxUses, u.Rev)
		}
		f.stored(u)
	}
	f.verify(f.is, "unlimited", tok, credential.ScopeNodeRegister)
}

// testConcurrentUses: uses racing on one credential, through several
// Issuers, never count past its limit.
func testConcurrentUses(t *testing.T, f *fixture) {
	const goroutines, limit = 12, 5
	p := f.principal(credential.KindOperator, "provisioner")
	tok, c := f.mintLimited(p.ID, limit, credential.ScopeNodeRegister)
	var (
		wg       sync.WaitGroup
		mu       sync.Mutex
		ok, used int
		others   []error
	)
	for i := range goroutines {
		is := f.is
		if i%2 == 1 {
			is = f.issuer(map[int][]byte{1: pepper(1)}, 1)
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			_, err := is.Use(f.ctx, c.ID)
			mu.Lock()
			defer mu.Unlock()
			switch {
			case err == nil:
				ok++
			case errors.Is(err, credential.ErrExhausted):
				used++
			default:
				others = append(others, err)
			}
		}()
	}
	wg.Wait()
	if len(others) > 0 {
		t.Fatalf("unexpected errors: %v", others)
	}
	if ok != limit || used != goroutines-limit {
		t.Fatalf("%d uses counted and %d refused, want %d and %d", ok, used, limit, goroutines-limit)
	}
	if got := f.rawCredential(c.ID); got.Uses != limit {
		t.Fatalf("stored Uses %d, want %d", got.Uses, limit)
	}
	f.refuse(f.is, "used up", tok, credential.ScopeNodeRegister, credential.ErrExhausted)
}

func testPrincipalsByKey(t *testing.T, f *fixture) {
	key, other := newKey(t), newKey(t)
	var want []string
	for _, id := range []string{"node-b", "node-a", "node-d"} {
		p, err := f.is.CreatePrincipal(f.ctx, credential.Principal{ID: id, Kind: credential.KindNode, PublicKey: key})
		if err != nil {
			t.Fatal(err)
		}
		want = append(want, p.ID)
	}
	if _, err := f.is.CreatePrincipal(f.ctx, credential.Principal{ID: "node-c", Kind: credential.KindNode, PublicKey: other}); err != nil {
		t.Fatal(err)
	}
	f.principal(credential.KindNode, "keyless")
	f.principal(credential.KindOperator, "op")
	ps, err := f.store.PrincipalsByKey(f.ctx, keyID(key))
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, p := range ps {
		if !slices.Equal(p.PublicKey, key) || p.KeyID != keyID(key) {
			t.Errorf("principal %s holds key %x (%s), not the one asked for", p.ID, p.PublicKey, p.KeyID)
		}
		got = append(got, p.ID)
		f.storedPrincipal(p)
	}
	slices.Sort(got)
	slices.Sort(want)
	if !slices.Equal(got, want) {
		t.Fatalf("PrincipalsByKey = %v, want %v", got, want)
	}
	if ps, err := f.store.PrincipalsByKey(f.ctx, keyID(newKey(t))); err != nil || len(ps) != 0 {
		t.Fatalf("PrincipalsByKey of a key no one holds = %v, %v", ps, err)
	}
	// A key set later is found under its new id, and no longer under the old.
	if _, err := f.is.SetNodeKey(f.ctx, "node-c", key); err != nil {
		t.Fatal(err)
	}
	if ps, err := f.store.PrincipalsByKey(f.ctx, keyID(other)); err != nil || len(ps) != 0 {
		t.Fatalf("PrincipalsByKey of a replaced key = %v, %v", ps, err)
	}
	if ps, err := f.store.PrincipalsByKey(f.ctx, keyID(key)); err != nil || len(ps) != 4 {
		t.Fatalf("PrincipalsByKey after SetNodeKey: %d principals, %v; want 4", len(ps), err)
	}
}

func testKeyBan(t *testing.T, f *fixture) {
	key := newKey(t)
	for _, id := range []string{"old-node", "new-node"} {
		if _, err := f.is.CreatePrincipal(f.ctx, credential.Principal{ID: id, Kind: credential.KindNode, PublicKey: key}); err != nil {
			t.Fatal(err)
		}
	}
	if b, err := f.is.KeyBan(f.ctx, key); err != nil || b != nil {
		t.Fatalf("KeyBan before any ban = %+v, %v", b, err)
	}
	f.ban("old-node", "stolen")
	b, err := f.is.KeyBan(f.ctx, key)
	if err != nil || b == nil || b.ID != "old-node" || !b.Banned || b.BanReason != "stolen" {
		t.Fatalf("KeyBan = %+v, %v; want old-node, banned", b, err)
	}
	if b, err := f.is.KeyBan(f.ctx, newKey(t)); err != nil || b != nil {
		t.Fatalf("KeyBan of another key = %+v, %v", b, err)
	}
	if _, err := f.is.Unban(f.ctx, "old-node"); err != nil {
		t.Fatal(err)
	}
	if b, err := f.is.KeyBan(f.ctx, key); err != nil || b != nil {
		t.Fatalf("KeyBan after the unban = %+v, %v", b, err)
	}
	_, err = f.is.KeyBan(f.ctx, key[:31])
	wantErr(t, "KeyBan of a short key", err, credential.ErrInvalidArgument)
}

func testRenew(t *testing.T, f *fixture) {
	p := f.principal(credential.KindNode, "n")
	scopes := []credential.Scope{credential.ScopeNodeHeartbeat, credential.ScopeNodePoll}
	tok, c := f.mint(p.ID, 10*24*time.Hour, scopes...)
	f.clock.Advance(time.Hour)
	ntok, nc, err := f.is.Renew(f.ctx, c.ID, 30*24*time.Hour, time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	if nc.PrincipalID != p.ID || !slices.Equal(nc.Scopes, c.Scopes) || nc.ExpiresAt.Sub(nc.CreatedAt) != 30*24*time.Hour {
		t.Fatalf("renewed credential %+v", nc)
	}
	f.stored(nc)
	old := f.rawCredential(c.ID)
	if old.RotatedTo != nc.ID || !old.ExpiresAt.Equal(f.clock.Now().UTC().Truncate(time.Microsecond).Add(time.Minute)) {
		t.Fatalf("old credential after renewal: RotatedTo %q, ExpiresAt %v", old.RotatedTo, old.ExpiresAt)
	}
	f.verify(f.is, "old token within the grace", tok, credential.ScopeNodePoll)
	f.verify(f.is, "new token", ntok, credential.ScopeNodePoll)
	f.clock.Advance(time.Minute)
	f.refuse(f.is, "old token after the grace", tok, credential.ScopeNodePoll, credential.ErrExpired)
	f.verify(f.is, "new token after the grace", ntok, credential.ScopeNodePoll)
	_, _, err = f.is.Renew(f.ctx, c.ID, 0, time.Minute)
	wantErr(t, "renewing an expired credential", err, credential.ErrExpired)
	f.revoke(nc.ID)
	_, _, err = f.is.Renew(f.ctx, nc.ID, 0, time.Minute)
	wantErr(t, "renewing a revoked credential", err, credential.ErrRevoked)
	_, _, err = f.is.Renew(f.ctx, "nothing", 0, time.Minute)
	wantErr(t, "renewing an unknown credential", err, credential.ErrNotFound)
	_, _, err = f.is.Renew(f.ctx, nc.ID, 0, -time.Second)
	wantErr(t, "renewing with a negative grace", err, credential.ErrInvalidArgument)
	if n := f.live(p.ID); n != 1 {
		t.Fatalf("%d live credentials, want 1 (the expired old one is not revoked)", n)
	}
}

// testRenewAgain: a renewal whose answer was lost is renewed again with
// the old token: the first successor is revoked, and the old token's end
// is not pushed back.
func testRenewAgain(t *testing.T, f *fixture) {
	p := f.principal(credential.KindNode, "n")
	tok, c := f.mint(p.ID, 0, credential.ScopeNodeHeartbeat)
	lost, first, err := f.is.Renew(f.ctx, c.ID, 0, time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	end := f.rawCredential(c.ID).ExpiresAt
	f.clock.Advance(30 * time.Second)
	f.verify(f.is, "old token within the grace", tok, credential.ScopeNodeHeartbeat)
	ntok, second, err := f.is.Renew(f.ctx, c.ID, 0, time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	old := f.rawCredential(c.ID)
	if old.RotatedTo != second.ID || !old.ExpiresAt.Equal(end) {
		t.Fatalf("old credential: RotatedTo %q (want %s), ExpiresAt %v (want %v)", old.RotatedTo, second.ID, old.ExpiresAt, end)
	}
	f.refuse(f.is, "the first renewal's token", lost, credential.ScopeNodeHeartbeat, credential.ErrRevoked)
	f.verify(f.is, "the second renewal's token", ntok, credential.ScopeNodeHeartbeat)
	if got := f.rawCredential(first.ID); got.RevokedAt == nil {
		t.Fatal("the first successor is not revoked")
	}
	f.clock.Advance(30 * time.Second)
	f.refuse(f.is, "old token after the grace", tok, credential.ScopeNodeHeartbeat, credential.ErrExpired)
	_, _, err = f.is.Renew(f.ctx, c.ID, 0, time.Minute)
	wantErr(t, "renewing the old credential after its grace", err, credential.ErrExpired)
}

// testQuota: a quota counts units in fixed windows, refuses a charge
// that does not fit (counting nothing), and is whole again once the
// window ends; quotas of other names and principals are apart.
func testQuota(t *testing.T, f *fixture) {
	const limit, window = 5, time.Hour
	p := f.principal(credential.KindNode, "node-1")
	start := f.clock.Now().UTC().Truncate(time.Microsecond)
	charge := func(principal, name string, n int64) (credential.Quota, error) {
		t.Helper()
		return f.is.Charge(f.ctx, principal, name, n, limit, window)
	}
	for _, c := range []struct {
		n    int64
		used int64
	}{{2, 2}, {3, 5}} {
		q, err := charge(p.ID, "audit", c.n)
		if err != nil {
			t.Fatalf("charge %d: %v", c.n, err)
		}
		if !q.Start.Equal(start) || q.Used != c.used {
			t.Fatalf("charge %d: window %v used %d, want %v used %d", c.n, q.Start, q.Used, start, c.used)
		}
	}
	f.clock.Advance(window - time.Microsecond)
	_, err := charge(p.ID, "audit", 1)
	var qe *credential.QuotaError
	if !errors.As(err, &qe) || !errors.Is(err, credential.ErrQuotaExceeded) {
		t.Fatalf("a charge past the limit: err = %v, want a *QuotaError matching ErrQuotaExceeded", err)
	}
	if qe.Used != limit || qe.Limit != limit || !qe.ResetAt.Equal(start.Add(window)) {
		t.Fatalf("QuotaError %+v, want used %d of %d until %v", qe, limit, limit, start.Add(window))
	}
	// Another name and another principal have quotas of their own, and
	// the principal's record is not touched.
	if q, err := charge(p.ID, "other", limit); err != nil || q.Used != limit {
		t.Fatalf("another quota: %+v, %v", q, err)
	}
	if q, err := charge("node-2", "audit", 1); err != nil || q.Used != 1 {
		t.Fatalf("another principal's quota: %+v, %v", q, err)
	}
	f.storedPrincipal(p)
	// The window ends: the next charge opens a new one.
	f.clock.Advance(time.Microsecond)
	q, err := charge(p.ID, "audit", 4)
	if err != nil || q.Used != 4 || !q.Start.Equal(start.Add(window)) {
		t.Fatalf("charge in the next window: %+v, %v", q, err)
	}
	_, err = charge(p.ID, "audit", 2)
	wantErr(t, "a charge past the limit in the next window", err, credential.ErrQuotaExceeded)
	for _, c := range []struct {
		name     string
		n, limit int64
		window   time.Duration
	}{
		{"", 1, 1, time.Hour},
		{"audit", 0, 1, time.Hour},
		{"audit", 2, 1, time.Hour},
		{"audit", 1, 1, 0},
	} {
		_, err := f.is.Charge(f.ctx, p.ID, c.name, c.n, c.limit, c.window)
		wantErr(t, "an invalid charge", err, credential.ErrInvalidArgument)
	}
}

// testConcurrentCharges: charges racing on one quota, through several
// Issuers, never count past its limit.
func testConcurrentCharges(t *testing.T, f *fixture) {
	const goroutines, limit = 12, 5
	var (
		wg       sync.WaitGroup
		mu       sync.Mutex
		ok, full int
		others   []error
	)
	for i := range goroutines {
		is := f.is
		if i%2 == 1 {
			is = f.issuer(map[int][]byte{1: pepper(1)}, 1)
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			_, err := is.Charge(f.ctx, "node-1", "audit", 1, limit, time.Hour)
			mu.Lock()
			defer mu.Unlock()
			switch {
			case err == nil:
				ok++
			case errors.Is(err, credential.ErrQuotaExceeded):
				full++
			default:
				others = append(others, err)
			}
		}()
	}
	wg.Wait()
	if len(others) > 0 {
		t.Fatalf("unexpected errors: %v", others)
	}
	if ok != limit || full != goroutines-limit {
		t.Fatalf("%d charges counted and %d refused, want %d and %d", ok, full, limit, goroutines-limit)
	}
}
