package bunstore_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/nodelane/nodelane/bunstore"
	"github.com/nodelane/nodelane/credential"
	"github.com/nodelane/nodelane/envelope"
	"github.com/nodelane/nodelane/internal/testclock"
	"github.com/nodelane/nodelane/internal/testdb"
	"github.com/nodelane/nodelane/internal/waitfor"
)

// cached opens a DB on tdb with a cache whose entries live ttl, counting
// its statements in qc.
func cached(t *testing.T, tdb testdb.DB, ttl time.Duration, qc *queryCounter) *bunstore.DB {
	t.Helper()
	b := open(t, tdb).Bun()
	if qc != nil {
		b = b.WithQueryHook(qc)
	}
	db, err := bunstore.New(b, &bunstore.Config{CacheTTL: ttl})
	if err != nil {
		t.Fatal(err)
	}
	return db
}

// cacheFixture is one principal with one credential, made through the
// Issuer of a DB, and a Gate on the same DB.
type cacheFixture struct {
	is   *credential.Issuer
	gate *envelope.Gate
	tok  string
	cred *credential.Credential
}

func newCacheFixture(t *testing.T, db *bunstore.DB, pepper []byte) *cacheFixture {
	t.Helper()
	ctx := context.Background()
	f := &cacheFixture{is: issuerWith(t, db, pepper), gate: gateOn(t, db)}
	p, err := f.is.CreatePrincipal(ctx, credential.Principal{Kind: credential.KindOperator, Name: "op"})
	if err != nil {
		t.Fatal(err)
	}
	if f.tok, f.cred, err = f.is.Mint(ctx, p.ID, []credential.Scope{credential.ScopeOperatorJobs}, time.Hour); err != nil {
		t.Fatal(err)
	}
	return f
}

func issuerWith(t *testing.T, db *bunstore.DB, pepper []byte) *credential.Issuer {
	t.Helper()
	is, err := credential.NewIssuer(db.CredentialStore(), &credential.Config{Peppers: map[int][]byte{1: pepper}})
	if err != nil {
		t.Fatal(err)
	}
	return is
}

func gateOn(t *testing.T, db *bunstore.DB) *envelope.Gate {
	t.Helper()
	g, err := envelope.NewGate(db.EnvelopeStore(), nil)
	if err != nil {
		t.Fatal(err)
	}
	return g
}

// verify runs what every request runs: Verify (credential and principal)
// and the envelope snapshot. It returns Verify's error and whether the
// envelope is active.
func (f *cacheFixture) verify(t *testing.T) (error, bool) {
	t.Helper()
	ctx := context.Background()
	_, _, err := f.is.Verify(ctx, f.tok, credential.ScopeOperatorJobs)
	snap, serr := f.gate.Snapshot(ctx)
	if serr != nil {
		t.Fatal(serr)
	}
	return err, snap.Active()
}

// A DB reads a credential, its principal and the envelope state once, and
// then serves them from memory: what it returns are copies, and a change
// made through the DB is seen at once, in and out of a transaction.
func TestCacheReads(t *testing.T) {
	t.Parallel()
	for _, d := range bunstore.MigratedDialects() {
		t.Run(d.Name, func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			qc := &queryCounter{}
			db := cached(t, d.New(t), time.Hour, qc)
			f := newCacheFixture(t, db, pepper32())
			if err, _ := f.verify(t); err != nil {
				t.Fatal(err)
			}
			before := qc.stmts.Load()
			for range 5 {
				if err, _ := f.verify(t); err != nil {
					t.Fatal(err)
				}
			}
			if n := qc.stmts.Load() - before; n != 0 {
				t.Errorf("5 verifications of a cached credential ran %d statements, want 0", n)
			}

			// Copies: changing what was returned changes nothing kept.
			cs := db.CredentialStore()
			c, err := cs.GetCredential(ctx, f.cred.ID)
			if err != nil {
				t.Fatal(err)
			}
			c.Digest[0] ^= 0xff
			c.Scopes[0] = "x"
			if again, _ := cs.GetCredential(ctx, f.cred.ID); again.Digest[0] == c.Digest[0] || again.Scopes[0] == "x" {
				t.Error("changing a returned credential changed the cached one")
			}

			// A change through this DB is seen at once.
			if _, err := f.is.Revoke(ctx, f.cred.ID); err != nil {
				t.Fatal(err)
			}
			if err, _ := f.verify(t); !errors.Is(err, credential.ErrRevoked) {
				t.Errorf("Verify after Revoke through the same DB: %v, want ErrRevoked", err)
			}
			if _, err := f.gate.Activate(ctx, "op", "test", nil); err != nil {
				t.Fatal(err)
			}
			if _, active := f.verify(t); !active {
				t.Error("the envelope snapshot after Activate through the same DB is not active")
			}
			if _, err := f.is.Ban(ctx, f.cred.PrincipalID, "test"); err != nil {
				t.Fatal(err)
			}
			if p, _ := cs.GetPrincipal(ctx, f.cred.PrincipalID); !p.Banned {
				t.Error("GetPrincipal after Ban through the same DB: not banned")
			}

			// A transaction sees its own change, and a rolled-back change
			// leaves nothing in the cache.
			errRollback := errors.New("roll back")
			err = db.InTx(ctx, func(ctx context.Context) error {
				if _, err := f.is.Unban(ctx, f.cred.PrincipalID); err != nil {
					return err
				}
				if p, err := cs.GetPrincipal(ctx, f.cred.PrincipalID); err != nil || p.Banned {
					t.Errorf("in the transaction that unbanned it: %+v, %v", p, err)
				}
				return errRollback
			})
			if !errors.Is(err, errRollback) {
				t.Fatal(err)
			}
			if p, _ := cs.GetPrincipal(ctx, f.cred.PrincipalID); !p.Banned {
				t.Error("after the unban rolled back, the principal reads unbanned")
			}
		})
	}
}

// A negative CacheTTL turns the cache off: every read is a statement.
func TestCacheOff(t *testing.T) {
	t.Parallel()
	qc := &queryCounter{}
	db := cached(t, bunstore.Migrated.New(t), -1, qc)
	f := newCacheFixture(t, db, pepper32())
	before := qc.stmts.Load()
	for range 3 {
		if err, _ := f.verify(t); err != nil {
			t.Fatal(err)
		}
	}
	if n := qc.stmts.Load() - before; n != 9 {
		t.Errorf("3 verifications without a cache ran %d statements, want 9 (credential, principal, envelope)", n)
	}
}

// Without a notification, a change made elsewhere (another process on
// the SQLite file, a replica when this DB has no Notifier) is seen once
// the entry's CacheTTL has passed, not before.
func TestCacheTTL(t *testing.T) {
	t.Parallel()
	for _, d := range bunstore.MigratedDialects() {
		t.Run(d.Name, func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			fa, fb, clock := pairOn(t, d.New(t), nil)
			if err, _ := fb.verify(t); err != nil {
				t.Fatal(err)
			}
			if _, err := fa.is.Revoke(ctx, fa.cred.ID); err != nil {
				t.Fatal(err)
			}
			if _, err := fa.gate.Activate(ctx, "op", "test", nil); err != nil {
				t.Fatal(err)
			}
			clock.Advance(999 * time.Millisecond)
			if err, active := fb.verify(t); err != nil || active {
				t.Errorf("within its TTL, B saw the change made on A: %v, active %v", err, active)
			}
			clock.Advance(time.Millisecond)
			if err, active := fb.verify(t); !errors.Is(err, credential.ErrRevoked) || !active {
				t.Errorf("after its TTL, B still serves its entries: %v, active %v", err, active)
			}
		})
	}
}

// On PostgreSQL, a revocation, a ban or a deactivation committed on one
// replica reaches the cache of every replica that has a Notifier within
// 1 s, whatever its CacheTTL; one without a Notifier keeps its entries
// for their TTL.
func TestCacheReplicas(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	tdb := testdb.Postgres(t)
	pepper := pepper32()
	a := cached(t, tdb, time.Hour, nil)
	b := cached(t, tdb, time.Hour, nil)
	deaf := cached(t, tdb, time.Hour, nil)
	notifier(t, a, nil)
	notifier(t, b, nil)
	fa := newCacheFixture(t, a, pepper)
	on := func(db *bunstore.DB) *cacheFixture {
		return &cacheFixture{is: issuerWith(t, db, pepper), gate: gateOn(t, db), tok: fa.tok, cred: fa.cred}
	}
	fb, fdeaf := on(b), on(deaf)
	if _, err := fa.gate.Activate(ctx, "op", "test", nil); err != nil {
		t.Fatal(err)
	}

	for _, step := range []struct {
		name   string
		change func() error
		seen   func(f *cacheFixture) bool
	}{
		{"deactivate", func() error { _, err := fa.gate.Deactivate(ctx, "op", "test"); return err },
			func(f *cacheFixture) bool { _, active := f.verify(t); return !active }},
		{"ban", func() error { _, err := fa.is.Ban(ctx, fa.cred.PrincipalID, "test"); return err },
			func(f *cacheFixture) bool { err, _ := f.verify(t); return errors.Is(err, credential.ErrBanned) }},
		{"unban", func() error { _, err := fa.is.Unban(ctx, fa.cred.PrincipalID); return err },
			func(f *cacheFixture) bool { err, _ := f.verify(t); return err == nil }},
		{"revoke", func() error { _, err := fa.is.Revoke(ctx, fa.cred.ID); return err },
			func(f *cacheFixture) bool { err, _ := f.verify(t); return errors.Is(err, credential.ErrRevoked) }},
	} {
		// Both replicas hold the entries before the change.
		if fb.seen(step.seen) || fdeaf.seen(step.seen) {
			t.Fatalf("%s: a replica sees it before it was made", step.name)
		}
		if err := step.change(); err != nil {
			t.Fatal(err)
		}
		waitfor.Within(t, time.Second, "replica B to see "+step.name+" on replica A", func() bool { return step.seen(fb) })
		if step.seen(fdeaf) {
			t.Errorf("%s: a replica without a Notifier forgot its entry before its TTL: the test proves nothing", step.name)
		}
		// The next step starts with the deaf replica up to date.
		fdeaf = on(cached(t, tdb, time.Hour, nil))
	}
}

// pairOn opens two DBs on tdb whose entries live 1 s, A and B, B
// counting its statements in qc (if not nil) and ageing its cache by the
// clock returned, with a fixture on each that share one credential made
// through A.
func pairOn(t *testing.T, tdb testdb.DB, qc *queryCounter) (fa, fb *cacheFixture, clock *testclock.Clock) {
	t.Helper()
	pepper := pepper32()
	a := cached(t, tdb, time.Second, nil)
	b := cached(t, tdb, time.Second, qc)
	clock = testclock.New(time.Now())
	bunstore.SetCacheClock(b, clock.Now)
	fa = newCacheFixture(t, a, pepper)
	fb = &cacheFixture{is: issuerWith(t, b, pepper), gate: gateOn(t, b), tok: fa.tok, cred: fa.cred}
	return fa, fb, clock
}

// seen reports whether f sees a change, by seen.
func (f *cacheFixture) seen(seen func(*cacheFixture) bool) bool { return seen(f) }

func pepper32() []byte {
	p := make([]byte, 32)
	for i := range p {
		p[i] = byte(i + 1)
	}
	return p
}

// On PostgreSQL, while a DB's Notifier listens, its entries are served
// until a change is heard, or ListenedCacheTTL when set, rather than
// CacheTTL: every change reaches it.
func TestCacheListenedTTL(t *testing.T) {
	t.Parallel()
	tdb := testdb.Postgres(t)
	qc := &queryCounter{}
	b := open(t, tdb).Bun().WithQueryHook(qc)
	db, err := bunstore.New(b, &bunstore.Config{CacheTTL: time.Second, ListenedCacheTTL: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	clock := testclock.New(time.Now())
	bunstore.SetCacheClock(db, clock.Now)
	f := newCacheFixture(t, db, pepper32())
	check := func(what string, want int64) {
		t.Helper()
		before := qc.stmts.Load()
		if err, _ := f.verify(t); err != nil {
			t.Fatal(err)
		}
		if n := qc.stmts.Load() - before; n != want {
			t.Errorf("%s: a verification ran %d statements, want %d", what, n, want)
		}
	}
	if err, _ := f.verify(t); err != nil { // fills the cache
		t.Fatal(err)
	}
	clock.Advance(2 * time.Second)
	check("past CacheTTL, no listener", 3)
	notifier(t, db, nil)
	check("first read while listening", 3)
	clock.Advance(10 * time.Minute)
	check("past CacheTTL while listening", 0)
	clock.Advance(time.Hour)
	check("past ListenedCacheTTL while listening", 3)

	// Without ListenedCacheTTL, until a change is heard.
	qc = &queryCounter{}
	db, err = bunstore.New(open(t, tdb).Bun().WithQueryHook(qc), &bunstore.Config{CacheTTL: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	clock = testclock.New(time.Now())
	bunstore.SetCacheClock(db, clock.Now)
	notifier(t, db, nil)
	f = &cacheFixture{is: issuerWith(t, db, pepper32()), gate: gateOn(t, db), tok: f.tok, cred: f.cred}
	check("first read while listening", 3)
	clock.Advance(24 * time.Hour)
	check("a day later, nothing changed, while listening", 0)
}

// On SQLite the entries hold until a change: past CacheTTL a DB reads
// the version row, one statement for all its entries, and keeps serving
// them while it reads as before; a change made through another DB
// (another process on the file) is seen at the first look after it,
// which empties the cache.
func TestCacheVersion(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	qc := &queryCounter{}
	fa, fb, clock := pairOn(t, bunstore.Migrated.New(t), qc)
	check := func(what string, want int64) (error, bool) {
		t.Helper()
		before := qc.stmts.Load()
		err, active := fb.verify(t)
		if n := qc.stmts.Load() - before; n != want {
			t.Errorf("%s: a verification ran %d statements, want %d", what, n, want)
		}
		return err, active
	}
	check("first (the version, credential, principal, envelope)", 4)
	for range 3 {
		clock.Advance(time.Second)
		if err, _ := check("past CacheTTL, nothing changed (the version)", 1); err != nil {
			t.Fatal(err)
		}
	}
	check("within CacheTTL of the look", 0)
	other, _, err := fa.is.Mint(ctx, fa.cred.PrincipalID, []credential.Scope{credential.ScopeOperatorJobs}, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	clock.Advance(time.Second)
	check("past CacheTTL after a credential was created (the version)", 1)
	if _, err := fa.is.Revoke(ctx, fa.cred.ID); err != nil {
		t.Fatal(err)
	}
	if err, _ := check("within CacheTTL of a revocation elsewhere", 0); err != nil {
		t.Errorf("within CacheTTL, B saw the revocation made on A: %v", err)
	}
	clock.Advance(time.Second)
	if err, _ := check("past CacheTTL after a revocation elsewhere (the version, the credential, the envelope)", 3); !errors.Is(err, credential.ErrRevoked) {
		t.Errorf("past CacheTTL, B serves the revoked credential: %v", err)
	}
	if _, _, err := fb.is.Verify(ctx, other, credential.ScopeOperatorJobs); err != nil {
		t.Errorf("the other credential of the principal: %v", err)
	}
}

// Under credential.MemoryOnly a DB reads nothing: it answers what it
// keeps, and credential.ErrNotInMemory for the rest, a look that is due
// included (the next read outside MemoryOnly makes it).
func TestCacheMemoryOnly(t *testing.T) {
	t.Parallel()
	qc := &queryCounter{}
	fa, fb, clock := pairOn(t, bunstore.Migrated.New(t), qc)
	ctx := credential.MemoryOnly(context.Background())
	verify := func(what string) error {
		t.Helper()
		before := qc.stmts.Load()
		_, _, err := fb.is.Verify(ctx, fa.tok, credential.ScopeOperatorJobs)
		if n := qc.stmts.Load() - before; n != 0 {
			t.Errorf("%s: a verification from memory ran %d statements", what, n)
		}
		return err
	}
	if err := verify("nothing kept"); !errors.Is(err, credential.ErrNotInMemory) {
		t.Fatalf("nothing kept: %v, want ErrNotInMemory", err)
	}
	if err, _ := fb.verify(t); err != nil { // fills the cache
		t.Fatal(err)
	}
	if err := verify("kept"); err != nil {
		t.Fatalf("kept: %v", err)
	}
	clock.Advance(time.Second)
	if err := verify("a look due"); !errors.Is(err, credential.ErrNotInMemory) {
		t.Fatalf("a look due: %v, want ErrNotInMemory", err)
	}
	if err, _ := fb.verify(t); err != nil { // looks
		t.Fatal(err)
	}
	if err := verify("after the look"); err != nil {
		t.Fatalf("after the look: %v", err)
	}
}
