package bunstore_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"net/url"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/uptrace/bun"

	"github.com/nodelane/nodelane/bunstore"
	"github.com/nodelane/nodelane/credential"
	"github.com/nodelane/nodelane/envelope"
	"github.com/nodelane/nodelane/internal/testdb"
	"github.com/nodelane/nodelane/receipts"
	"github.com/nodelane/nodelane/replay"
	"github.com/nodelane/nodelane/replay/replaytest"
)

// Tests of the translation of aborted transactions, shared by the stores
// of replay, credential, envelope and receipts (bunstore/replay.go), and
// of the nonce quota under every isolation level.

// pgAborted reports whether err is PostgreSQL's serialization failure or
// deadlock, as the driver reports it.
func pgAborted(err error) bool {
	var pe *pgconn.PgError
	return errors.As(err, &pe) && (pe.Code == "40001" || pe.Code == "40P01")
}

// inTxAt runs fn in a transaction at level on db, carried in fn's context.
func inTxAt(db *bunstore.DB, level sql.IsolationLevel, fn func(ctx context.Context) error) error {
	return db.Bun().RunInTx(context.Background(), &sql.TxOptions{Isolation: level}, func(ctx context.Context, tx bun.Tx) error {
		return fn(bunstore.WithTx(ctx, tx))
	})
}

// lostUpdate runs, in a REPEATABLE READ transaction, read (which takes
// the transaction's snapshot), then other outside it (which commits a
// change to what read saw), then write, and returns write's error:
// PostgreSQL's serialization failure, 40001.
func lostUpdate(t *testing.T, db *bunstore.DB, read, other, write func(ctx context.Context) error) error {
	t.Helper()
	var werr error
	err := inTxAt(db, sql.LevelRepeatableRead, func(ctx context.Context) error {
		if err := read(ctx); err != nil {
			t.Fatalf("the read in the transaction: %v", err)
		}
		if err := other(context.Background()); err != nil {
			t.Fatalf("the change outside the transaction: %v", err)
		}
		werr = write(ctx)
		return werr
	})
	if !errors.Is(err, werr) {
		t.Fatalf("the transaction returned %v, not the write's error %v", err, werr)
	}
	return werr
}

// wantAborted checks that err matches target, a package's ErrAborted, and
// none of the sentinels in not.
func wantAborted(t *testing.T, what string, err, target error, not ...error) {
	t.Helper()
	if !errors.Is(err, target) {
		t.Fatalf("%s = %v, want %v", what, err, target)
	}
	for _, n := range not {
		if errors.Is(err, n) {
			t.Fatalf("%s = %v, which also matches %v", what, err, n)
		}
	}
}

// A serialization failure in the transaction a context carries reaches the
// caller as the package's ErrAborted, through the store and through the
// package's logic, which does not retry it, and never as a conflict.
func TestReplayStoresAbortedTx(t *testing.T) {
	t.Parallel()
	ctx := context.Background()

	t.Run("replay", func(t *testing.T) {
		t.Parallel()
		db := open(t, testdb.Postgres(t))
		s := db.NonceStore(nil)
		now := time.Now().UTC().Truncate(time.Microsecond)
		exp := now.Add(time.Minute)
		err := lostUpdate(t, db,
			func(ctx context.Context) error { return s.Insert(ctx, "node-b", "n0", exp, now) },
			func(ctx context.Context) error { return s.Insert(ctx, "node-a", "n1", exp, now) },
			func(ctx context.Context) error { return s.Insert(ctx, "node-a", "n2", exp, now) })
		wantAborted(t, "NonceStore.Insert", err, replay.ErrAborted, replay.ErrQuota, replay.ErrReplayedNonce)
		if !errors.Is(err, replay.ErrUnavailable) {
			t.Fatalf("NonceStore.Insert = %v, want it to match ErrUnavailable too", err)
		}
		v := replay.NewVerifier(s, &replay.VerifierConfig{Now: func() time.Time { return now }})
		err = lostUpdate(t, db,
			func(ctx context.Context) error { return v.Consume(ctx, "node-b", "n3", exp) },
			func(ctx context.Context) error { return v.Consume(ctx, "node-a", "n4", exp) },
			func(ctx context.Context) error { return v.Consume(ctx, "node-a", "n5", exp) })
		wantAborted(t, "Verifier.Consume", err, replay.ErrAborted, replay.ErrQuota, replay.ErrReplayedNonce)
		if !errors.Is(err, replay.ErrUnavailable) {
			t.Fatalf("Verifier.Consume = %v, want it to match ErrUnavailable too", err)
		}
		// Neither aborted nonce was recorded.
		for _, n := range []string{"n2", "n5"} {
			if err := s.Insert(ctx, "node-a", n, exp, now); err != nil {
				t.Fatalf("Insert of %s after its transaction aborted: %v", n, err)
			}
		}
	})

	t.Run("credential", func(t *testing.T) {
		t.Parallel()
		db := open(t, testdb.Postgres(t))
		s := db.CredentialStore()
		is, _ := newIssuer(t, db)
		p, err := is.CreatePrincipal(ctx, credential.Principal{ID: "Node-1", Kind: credential.KindNode})
		if err != nil {
			t.Fatal(err)
		}
		rename := func(name string) func(ctx context.Context) error {
			return func(ctx context.Context) error {
				cur, err := s.GetPrincipal(ctx, p.ID)
				if err != nil {
					return err
				}
				next := *cur
				next.Name, next.Rev = name, cur.Rev+1
				return s.UpdatePrincipal(ctx, &next, cur.Rev)
			}
		}
		var stale *credential.Principal
		err = lostUpdate(t, db,
			func(ctx context.Context) (err error) { stale, err = s.GetPrincipal(ctx, p.ID); return err },
			rename("outside"),
			func(ctx context.Context) error {
				next := *stale
				next.Name, next.Rev = "inside", stale.Rev+1
				return s.UpdatePrincipal(ctx, &next, stale.Rev)
			})
		wantAborted(t, "CredentialStore.UpdatePrincipal", err, credential.ErrAborted, credential.ErrConflict, credential.ErrNotFound)
		err = lostUpdate(t, db,
			func(ctx context.Context) error { _, err := is.Principal(ctx, p.ID); return err },
			rename("outside again"),
			func(ctx context.Context) error { _, err := is.Ban(ctx, p.ID, "r"); return err })
		wantAborted(t, "Issuer.Ban", err, credential.ErrAborted, credential.ErrConflict)
		// An id taken after the snapshot: a serialization failure too,
		// not a conflict, since the transaction cannot see the row.
		err = lostUpdate(t, db,
			func(ctx context.Context) error { _, err := s.GetPrincipal(ctx, p.ID); return err },
			func(ctx context.Context) error {
				_, err := is.CreatePrincipal(ctx, credential.Principal{ID: "node-2", Kind: credential.KindNode})
				return err
			},
			func(ctx context.Context) error {
				_, err := is.CreatePrincipal(ctx, credential.Principal{ID: "node-2", Kind: credential.KindOperator})
				return err
			})
		wantAborted(t, "Issuer.CreatePrincipal", err, credential.ErrAborted, credential.ErrConflict)
		if got, err := is.Principal(ctx, p.ID); err != nil || got.Name != "outside again" || got.Banned {
			t.Fatalf("principal after the aborted transactions = %+v, %v", got, err)
		}
	})

	t.Run("envelope", func(t *testing.T) {
		t.Parallel()
		db := open(t, testdb.Postgres(t))
		g, err := envelope.NewGate(db.EnvelopeStore(), nil)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := g.Activate(ctx, "alice", "run", nil); err != nil {
			t.Fatal(err)
		}
		err = lostUpdate(t, db,
			func(ctx context.Context) error { _, err := g.Snapshot(ctx); return err },
			func(ctx context.Context) error { _, err := g.Deactivate(ctx, "bob", "stop"); return err },
			func(ctx context.Context) error { _, err := g.Activate(ctx, "carol", "again", nil); return err })
		wantAborted(t, "Gate.Activate", err, envelope.ErrAborted, envelope.ErrConflict)
		rs, err := g.History(ctx, 0, 0)
		if err != nil || len(rs) != 2 || rs[1].By != "bob" {
			t.Fatalf("history after the aborted transaction = %v, %v", rs, err)
		}
	})

	t.Run("receipts", func(t *testing.T) {
		t.Parallel()
		db := open(t, testdb.Postgres(t))
		s := db.ReceiptStore()
		signer, _ := receiptSigner(t)
		log := receipts.NewLog(s, &receipts.Config{Origin: receiptsOrigin})
		mint := func(id string) func(ctx context.Context) error {
			return func(ctx context.Context) error {
				r := receipts.Receipt{Kind: receipts.KindNodeAudit, ID: id, PolicyVersion: 1, WorkerID: "wrk_1",
					EventType: "driver_update", OccurredAt: time.Now(), PayloadSHA256: strings.Repeat("0", 64)}
				_, err := log.Mint(ctx, r)
				return err
			}
		}
		read := func(ctx context.Context) error { _, err := s.Tree(ctx); return err }
		err := lostUpdate(t, db, read, mint("rcp_Taken"), mint("rcp_Taken"))
		wantAborted(t, "Log.Mint", err, receipts.ErrAborted, receipts.ErrConflict)
		cp := func(ctx context.Context) error {
			c, err := receipts.SignCheckpoint(signer, receiptsOrigin, receipts.EmptyTree())
			if err != nil {
				return err
			}
			return s.AddCheckpoint(ctx, c)
		}
		err = lostUpdate(t, db, read, cp, cp)
		wantAborted(t, "ReceiptStore.AddCheckpoint", err, receipts.ErrAborted, receipts.ErrConflict)
	})
}

// A deadlock (40P01) is ErrAborted too, for the transaction PostgreSQL
// chose to abort; the other one commits.
func TestCredentialAbortedDeadlock(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := open(t, testdb.Postgres(t))
	s := db.CredentialStore()
	is, _ := newIssuer(t, db)
	for _, id := range []string{"a", "b"} {
		if _, err := is.CreatePrincipal(ctx, credential.Principal{ID: id, Kind: credential.KindNode}); err != nil {
			t.Fatal(err)
		}
	}
	touch := func(ctx context.Context, id, name string) error {
		cur, err := s.GetPrincipal(ctx, id)
		if err != nil {
			return err
		}
		next := *cur
		next.Name, next.Rev = name, cur.Rev+1
		return s.UpdatePrincipal(ctx, &next, cur.Rev)
	}
	var (
		both sync.WaitGroup
		wg   sync.WaitGroup
		errs [2]error
	)
	both.Add(2)
	for i, order := range [2][2]string{{"a", "b"}, {"b", "a"}} {
		wg.Go(func() {
			errs[i] = db.InTx(ctx, func(ctx context.Context) error {
				if err := touch(ctx, order[0], fmt.Sprint("tx ", i)); err != nil {
					both.Done()
					return err
				}
				both.Done()
				both.Wait()
				return touch(ctx, order[1], fmt.Sprint("tx ", i))
			})
		})
	}
	wg.Wait()
	failed := 0
	for i, err := range errs {
		if err == nil {
			continue
		}
		failed++
		wantAborted(t, fmt.Sprint("transaction ", i), err, credential.ErrAborted, credential.ErrConflict)
	}
	if failed != 1 {
		t.Fatalf("transactions returned %v; want one deadlock victim", errs)
	}
}

// The nonce quota is exact whatever the isolation level: under READ
// COMMITTED because one node's inserts take turns; under REPEATABLE READ
// and SERIALIZABLE because an insert that could count stale rows is
// aborted instead (ErrAborted), and its caller runs the transaction
// again. A database whose default level is REPEATABLE READ exercises the
// store's own retries of the transactions it runs itself.
func TestNonceQuotaIsolation(t *testing.T) {
	t.Parallel()
	const goroutines = 3 * replaytest.Quota
	levels := []struct {
		name  string
		level sql.IsolationLevel
		// own: Insert runs without a transaction in its context, on a
		// database whose default level is this one.
		own bool
	}{
		{"read committed", sql.LevelReadCommitted, false},
		{"repeatable read", sql.LevelRepeatableRead, false},
		{"serializable", sql.LevelSerializable, false},
		{"repeatable read by default", sql.LevelRepeatableRead, true},
	}
	tdb := testdb.Postgres(t)
	for _, lv := range levels {
		t.Run(lv.name, func(t *testing.T) {
			t.Parallel()
			d := tdb
			if lv.own {
				u, err := url.Parse(d.DSN)
				if err != nil {
					t.Fatal(err)
				}
				// %20, not the + of url.Values.Encode, which pgx keeps.
				u.RawQuery += "&default_transaction_isolation=repeatable%20read"
				d.DSN = u.String()
			}
			db := open(t, d)
			s := db.NonceStore(&bunstore.NonceConfig{PerNode: replaytest.Quota})
			now := time.Now().UTC().Truncate(time.Microsecond)
			node := "node " + lv.name
			var (
				start         = make(chan struct{})
				wg            sync.WaitGroup
				mu            sync.Mutex
				admitted      int
				quota, aborts int
			)
			for g := range goroutines {
				wg.Go(func() {
					<-start
					for {
						insert := func(ctx context.Context) error {
							return s.Insert(ctx, node, fmt.Sprintf("n%d", g), now.Add(time.Minute), now)
						}
						var err error
						if lv.own {
							err = insert(context.Background())
						} else {
							err = inTxAt(db, lv.level, insert)
						}
						if pgAborted(err) && !errors.Is(err, replay.ErrAborted) {
							// A serialization failure at COMMIT is the
							// transaction's, not the store's.
							err = fmt.Errorf("%w: %w", replay.ErrAborted, err)
						}
						mu.Lock()
						switch {
						case err == nil:
							admitted++
						case errors.Is(err, replay.ErrQuota):
							quota++
						case errors.Is(err, replay.ErrAborted):
							aborts++
							mu.Unlock()
							continue
						default:
							t.Errorf("Insert: %v", err)
						}
						mu.Unlock()
						return
					}
				})
			}
			close(start)
			wg.Wait()
			t.Logf("%d admitted, %d over quota, %d aborted transactions run again", admitted, quota, aborts)
			if admitted != replaytest.Quota || quota != goroutines-replaytest.Quota {
				t.Fatalf("%d admitted and %d refused, want %d and %d", admitted, quota, replaytest.Quota, goroutines-replaytest.Quota)
			}
		})
	}
}
