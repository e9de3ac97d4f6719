package bunstore_test

import (
	"bufio"
	"bytes"
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/uptrace/bun/dialect"

	"github.com/nodelane/nodelane/bunstore"
	"github.com/nodelane/nodelane/internal/waitfor"
	"github.com/nodelane/nodelane/replay"
)

// node is a worker node that signs requests, as a worker would.
type node struct {
	id     string
	pub    ed25519.PublicKey
	priv   ed25519.PrivateKey
	signer *replay.Signer
}

func newNode(t testing.TB, id string) *node {
	t.Helper()
	pub, priv, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	return &node{id: id, pub: pub, priv: priv, signer: replay.NewSigner(priv, nil)}
}

// request signs a heartbeat with a fresh nonce and returns it as the bytes
// a worker sends on the wire.
func (n *node) request(t testing.TB) []byte {
	t.Helper()
	body := []byte(`{"status":"idle","current_jobs":[]}`)
	r, err := http.NewRequest("POST", "https://cp.example/api/nl/workers/heartbeat?wait=0", bytes.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	r.Header.Set("Content-Type", "application/json")
	if err := n.signer.Sign(r, body); err != nil {
		t.Fatal(err)
	}
	var wire bytes.Buffer
	if err := r.Write(&wire); err != nil {
		t.Fatal(err)
	}
	return wire.Bytes()
}

// verifyWire reads a request off the wire, as a server does, and verifies
// it for node n with v, consuming its nonce with ctx.
func verifyWire(ctx context.Context, v *replay.Verifier, n *node, wire []byte) error {
	r, err := http.ReadRequest(bufio.NewReader(bytes.NewReader(wire)))
	if err != nil {
		return err
	}
	body, err := io.ReadAll(r.Body)
	if err != nil {
		return err
	}
	_, err = v.Verify(ctx, r, body, n.id, n.pub)
	return err
}

// The acceptance test of DESIGN §4 on a shared store: 16 goroutines send
// the same signed request at once, through two replicas (two pools on one
// database), and exactly one is admitted, in each of 20 rounds.
func TestNonceConcurrentVerify(t *testing.T) {
	t.Parallel()
	const goroutines, rounds = 16, 20
	ctx := context.Background()
	for _, d := range bunstore.MigratedDialects() {
		t.Run(d.Name, func(t *testing.T) {
			t.Parallel()
			tdb := d.New(t)
			replicas := []*replay.Verifier{
				replay.NewVerifier(open(t, tdb).NonceStore(nil), nil),
				replay.NewVerifier(open(t, tdb).NonceStore(nil), nil),
			}
			n := newNode(t, "studio-gpu-1")
			passed := 0
			for round := range rounds {
				wire := n.request(t)
				var (
					start = make(chan struct{})
					wg    sync.WaitGroup
					errs  = make([]error, goroutines)
				)
				for g := range goroutines {
					wg.Go(func() {
						<-start
						errs[g] = verifyWire(ctx, replicas[g%len(replicas)], n, wire)
					})
				}
				close(start)
				wg.Wait()
				var got struct{ Accepted, Replayed, Other int }
				for _, err := range errs {
					switch {
					case err == nil:
						got.Accepted++
					case errors.Is(err, replay.ErrReplayedNonce):
						got.Replayed++
					default:
						got.Other++
						t.Errorf("round %d: Verify = %v", round, err)
					}
				}
				want := struct{ Accepted, Replayed, Other int }{1, goroutines - 1, 0}
				if diff := cmp.Diff(want, got); diff != "" {
					t.Errorf("round %d: outcomes of %d concurrent copies of one request (-want +got):\n%s", round, goroutines, diff)
					continue
				}
				passed++
			}
			t.Logf("%d/%d rounds: exactly one of %d copies accepted, %d refused as replays", passed, rounds, goroutines, goroutines-1)
			if passed != rounds {
				t.Fatalf("%d/%d rounds passed", passed, rounds)
			}
		})
	}
}

var errRollbackNonce = errors.New("the request failed")

// heldUp reports whether a write waits for the transaction ctx carries:
// on SQLite for the write slot it holds, on PostgreSQL for a lock it
// holds (a row it wrote).
func heldUp(t *testing.T, ctx context.Context, db *bunstore.DB) bool {
	t.Helper()
	if db.Bun().Dialect().Name() == dialect.SQLite {
		return bunstore.WriteWaiters(db) > 0
	}
	tx, ok := bunstore.TxFrom(ctx)
	if !ok {
		t.Fatal("no transaction in the context")
	}
	var xid string
	if err := tx.QueryRowContext(ctx, "SELECT (txid_current() % 4294967296)::text").Scan(&xid); err != nil {
		t.Fatal(err)
	}
	var waiting int
	err := db.Bun().QueryRowContext(context.Background(),
		"SELECT count(*) FROM pg_locks WHERE locktype = 'transactionid' AND transactionid::text = ? AND NOT granted", xid).Scan(&waiting)
	if err != nil {
		t.Fatal(err)
	}
	return waiting > 0
}

// A nonce consumed in a transaction is consumed if and only if the
// transaction commits, and a copy of the request that arrives meanwhile
// waits for that outcome.
func TestNonceInTx(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	for _, d := range bunstore.MigratedDialects() {
		t.Run(d.Name, func(t *testing.T) {
			t.Parallel()
			db := open(t, d.New(t))
			v := replay.NewVerifier(db.NonceStore(nil), nil)
			n := newNode(t, "studio-gpu-1")
			tests := []struct {
				name   string
				result error // what the transaction's function returns
				// consumed: the nonce was spent, so the copy that arrives
				// meanwhile, and any later one, is a replay.
				consumed bool
			}{
				{name: "rolled back", result: errRollbackNonce, consumed: false},
				{name: "committed", result: nil, consumed: true},
			}
			for _, tc := range tests {
				t.Run(tc.name, func(t *testing.T) {
					wire, other := n.request(t), n.request(t)
					copyErr := make(chan error, 1)
					err := db.InTx(ctx, func(ctx context.Context) error {
						if err := verifyWire(ctx, v, n, wire); err != nil {
							t.Fatalf("Verify in the transaction: %v", err)
						}
						// A second use in the same transaction is a replay,
						// and leaves the transaction usable.
						if err := verifyWire(ctx, v, n, wire); !errors.Is(err, replay.ErrReplayedNonce) {
							t.Errorf("Verify again in the transaction = %v, want ErrReplayedNonce", err)
						}
						if err := verifyWire(ctx, v, n, other); err != nil {
							t.Errorf("Verify of another request in the transaction: %v", err)
						}
						// A copy arriving outside the transaction must wait
						// for it: until it ends the nonce is neither spent
						// nor free. It is seen waiting, held up by the
						// transaction, and not answered.
						go func() { copyErr <- verifyWire(context.Background(), v, n, wire) }()
						waitfor.Until(t, "the copy to wait for the transaction", func() bool {
							select {
							case err := <-copyErr:
								t.Fatalf("a copy was answered (%v) while the transaction was open", err)
							default:
							}
							return heldUp(t, ctx, db)
						})
						return tc.result
					})
					if !errors.Is(err, tc.result) {
						t.Fatalf("InTx = %v, want %v", err, tc.result)
					}
					err = <-copyErr
					if tc.consumed {
						if !errors.Is(err, replay.ErrReplayedNonce) {
							t.Fatalf("copy after the commit = %v, want ErrReplayedNonce", err)
						}
					} else if err != nil {
						t.Fatalf("copy after the rollback = %v, want it admitted: the nonce was never spent", err)
					}
					// The request's nonce is spent now, by the transaction or
					// by the copy it let through; the other request's only if
					// the transaction committed.
					if err := verifyWire(ctx, v, n, wire); !errors.Is(err, replay.ErrReplayedNonce) {
						t.Fatalf("the request after the transaction = %v, want ErrReplayedNonce", err)
					}
					err = verifyWire(ctx, v, n, other)
					if tc.consumed {
						if !errors.Is(err, replay.ErrReplayedNonce) {
							t.Fatalf("the other request after the commit = %v, want ErrReplayedNonce", err)
						}
					} else if err != nil {
						t.Fatalf("the other request after the rollback = %v, want it admitted", err)
					}
				})
			}
		})
	}
}

// Collect deletes every dead nonce, however many (in batches), and
// nothing else, also when replicas collect at once; Verifier.Collect
// keeps them one window longer.
func TestNonceCollect(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	type nonceRow struct {
		NodeID    string `bun:"node_id"`
		Nonce     string `bun:"nonce"`
		ExpiresAt int64  `bun:"expires_at"`
	}
	for _, d := range bunstore.MigratedDialects() {
		t.Run(d.Name, func(t *testing.T) {
			t.Parallel()
			tdb := d.New(t)
			db := open(t, tdb)
			s := db.NonceStore(nil)
			now := time.Date(2026, 11, 30, 9, 0, 0, 0, time.UTC)
			const dead, live = 12345, 7
			rows := make([]nonceRow, 0, dead+live)
			for i := range dead + live {
				exp := now.Add(-time.Duration(i%600) * time.Second) // dead: at or before now
				if i >= dead {
					exp = now.Add(time.Duration(i-dead+1) * time.Microsecond)
				}
				rows = append(rows, nonceRow{fmt.Sprintf("node-%d", i%50), fmt.Sprintf("n%021d", i), exp.UnixMicro()})
			}
			raw := tdb.Bun(t)
			for chunk := range chunks(rows, 1000) {
				if _, err := raw.NewInsert().Model(&chunk).ModelTableExpr("nodelane_nonces").Exec(ctx); err != nil {
					t.Fatal(err)
				}
			}
			// Three replicas collect at once; between them they delete
			// each dead nonce once.
			var (
				wg        sync.WaitGroup
				collected [3]int
				errs      [3]error
			)
			for i, r := range []*bunstore.NonceStore{s, open(t, tdb).NonceStore(nil), open(t, tdb).NonceStore(nil)} {
				wg.Go(func() { collected[i], errs[i] = r.Collect(ctx, now) })
			}
			wg.Wait()
			if sum := collected[0] + collected[1] + collected[2]; sum != dead || errors.Join(errs[:]...) != nil {
				t.Fatalf("concurrent Collects deleted %v (%d in all), errors %v; want %d in all", collected, sum, errs, dead)
			}
			if n, err := s.Collect(ctx, now); err != nil || n != 0 {
				t.Fatalf("second Collect = %d, %v; want 0", n, err)
			}
			for _, r := range rows[dead:] {
				if err := s.Insert(ctx, r.NodeID, r.Nonce, now.Add(time.Minute), now); !errors.Is(err, replay.ErrReplayedNonce) {
					t.Fatalf("Insert of a live nonce after Collect = %v, want ErrReplayedNonce", err)
				}
			}
			if n, err := s.Collect(ctx, now.Add(time.Second)); err != nil || n != live {
				t.Fatalf("Collect of the rest = %d, %v; want %d", n, err, live)
			}

			// Through a Verifier, nonces stay one window past their expiry.
			clock := time.Now().UTC().Truncate(time.Microsecond)
			v := replay.NewVerifier(s, &replay.VerifierConfig{Now: func() time.Time { return clock }})
			if err := v.Consume(ctx, "node-a", "n1", clock.Add(time.Second)); err != nil {
				t.Fatal(err)
			}
			clock = clock.Add(replay.MaxWindow)
			if n, err := v.Collect(ctx); err != nil || n != 0 {
				t.Fatalf("Verifier.Collect within a window of the expiry = %d, %v; want 0", n, err)
			}
			clock = clock.Add(time.Second)
			if n, err := v.Collect(ctx); err != nil || n != 1 {
				t.Fatalf("Verifier.Collect a window after the expiry = %d, %v; want 1", n, err)
			}
		})
	}
}

func chunks[T any](s []T, n int) func(yield func([]T) bool) {
	return func(yield func([]T) bool) {
		for len(s) > 0 {
			c := s[:min(n, len(s))]
			s = s[len(c):]
			if !yield(c) {
				return
			}
		}
	}
}

// A store that cannot answer makes the Verifier refuse with
// ErrUnavailable, never admit.
func TestNonceUnavailable(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	for _, d := range bunstore.MigratedDialects() {
		t.Run(d.Name, func(t *testing.T) {
			t.Parallel()
			db, err := bunstore.Open(ctx, d.New(t).DSN, nil)
			if err != nil {
				t.Fatal(err)
			}
			s := db.NonceStore(nil)
			v := replay.NewVerifier(s, nil)
			n := newNode(t, "studio-gpu-1")
			wire := n.request(t)
			now := time.Now().UTC().Truncate(time.Microsecond)
			canceled, cancel := context.WithCancel(ctx)
			cancel()
			if err := s.Insert(canceled, n.id, "n0", now.Add(time.Minute), now); !errors.Is(err, replay.ErrUnavailable) || !errors.Is(err, context.Canceled) {
				t.Errorf("Insert with a canceled context = %v, want ErrUnavailable and context.Canceled", err)
			}
			db.Close()
			if err := s.Insert(ctx, n.id, "n1", now.Add(time.Minute), now); !errors.Is(err, replay.ErrUnavailable) {
				t.Errorf("Insert on a closed database = %v, want ErrUnavailable", err)
			}
			if _, err := s.Collect(ctx, now); !errors.Is(err, replay.ErrUnavailable) {
				t.Errorf("Collect on a closed database = %v, want ErrUnavailable", err)
			}
			if err := verifyWire(ctx, v, n, wire); !errors.Is(err, replay.ErrUnavailable) {
				t.Errorf("Verify on a closed database = %v, want ErrUnavailable", err)
			}
		})
	}
}

// The quota is configurable, counts only the node's own live nonces, and
// a replay of a held nonce at the quota is still reported as a replay.
func TestNonceQuotaConfig(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	for _, d := range bunstore.MigratedDialects() {
		t.Run(d.Name, func(t *testing.T) {
			t.Parallel()
			s := open(t, d.New(t)).NonceStore(&bunstore.NonceConfig{PerNode: 3})
			now := time.Now().UTC().Truncate(time.Microsecond)
			exp := now.Add(time.Minute)
			tests := []struct {
				node, nonce string
				want        error
			}{
				{"a", "n1", nil},
				{"a", "n2", nil},
				{"a", "n3", nil},
				{"a", "n4", replay.ErrQuota},
				{"a", "n1", replay.ErrReplayedNonce},
				{"b", "n4", nil},
				{"a", "n4", replay.ErrQuota},
			}
			for _, tc := range tests {
				if err := s.Insert(ctx, tc.node, tc.nonce, exp, now); !errors.Is(err, tc.want) || (tc.want == nil && err != nil) {
					t.Fatalf("Insert(%s, %s) = %v, want %v", tc.node, tc.nonce, err, tc.want)
				}
			}
		})
	}
}

// A node's rows_held, which decides its quota without a count while it
// is below it, is never below the rows the node holds, and equals them
// when no insert was refused: each insert adds its row, and Collect takes
// off exactly what it deleted.
func TestNonceRowsHeld(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	for _, d := range bunstore.MigratedDialects() {
		t.Run(d.Name, func(t *testing.T) {
			t.Parallel()
			tdb := d.New(t)
			s := open(t, tdb).NonceStore(&bunstore.NonceConfig{PerNode: 4})
			raw := tdb.Bun(t)
			held := func(want func(node string, held, rows int) bool) {
				t.Helper()
				var got []struct {
					Node string `bun:"node_id"`
					Held int    `bun:"rows_held"`
					Rows int    `bun:"n"`
				}
				err := raw.NewRaw(`SELECT nn.node_id, nn.rows_held, (SELECT count(*) FROM nodelane_nonces AS n WHERE n.node_id = nn.node_id) AS n
FROM nodelane_nonce_nodes AS nn ORDER BY nn.node_id`).Scan(ctx, &got)
				if err != nil || len(got) != 3 {
					t.Fatalf("nodes %+v, %v; want 3", got, err)
				}
				for _, g := range got {
					if !want(g.Node, g.Held, g.Rows) {
						t.Errorf("node %s holds %d rows, rows_held %d", g.Node, g.Rows, g.Held)
					}
				}
			}
			now := time.Date(2026, 12, 4, 9, 0, 0, 0, time.UTC)
			for i := range 9 {
				node, exp := fmt.Sprintf("node-%d", i%3), now.Add(time.Duration(i+1)*time.Second)
				if err := s.Insert(ctx, node, fmt.Sprintf("n%d", i), exp, now); err != nil {
					t.Fatal(err)
				}
			}
			held(func(_ string, held, rows int) bool { return rows == 3 && held == rows })
			// node-0 at its quota of 4: refused, its count one above.
			for _, n := range []string{"n9", "n10"} {
				want := map[string]error{"n9": nil, "n10": replay.ErrQuota}[n]
				if err := s.Insert(ctx, "node-0", n, now.Add(time.Minute), now); !errors.Is(err, want) || want == nil && err != nil {
					t.Fatalf("Insert(node-0, %s) = %v, want %v", n, err, want)
				}
			}
			held(func(node string, held, rows int) bool {
				return node == "node-0" && rows == 4 && held == 5 || node != "node-0" && held == rows
			})
			// Expired nonces free the quota before Collect (the count
			// runs), and Collect takes off what it deleted.
			later := now.Add(5 * time.Second) // n0 to n4 are dead
			if err := s.Insert(ctx, "node-0", "n10", later.Add(time.Minute), later); err != nil {
				t.Fatalf("Insert after expiries = %v", err)
			}
			if n, err := s.Collect(ctx, later); err != nil || n != 5 {
				t.Fatalf("Collect = %d, %v; want 5", n, err)
			}
			held(func(node string, held, rows int) bool {
				want := map[string]int{"node-0": 3, "node-1": 1, "node-2": 2}[node]
				return rows == want && (node == "node-0" && held == 4 || node != "node-0" && held == rows)
			})
		})
	}
}

// counterReader yields distinct nonces: a counter in the first 8 bytes.
type counterReader struct{ n uint64 }

func (c *counterReader) Read(p []byte) (int, error) {
	clear(p)
	c.n++
	binary.BigEndian.PutUint64(p, c.n)
	return len(p), nil
}

// BenchmarkReplayVerify measures replay.Verifier.Verify of one signed
// request on each database: parse, digest, Ed25519 signature, window, and
// the nonce insert (one statement, autocommitted). Requests are signed
// beforehand, each with its own nonce.
func BenchmarkReplayVerify(b *testing.B) {
	ctx := context.Background()
	body := []byte(`{"status":"idle","current_jobs":["job-1"],"metrics":{"gpu_util":0.93,"vram_used_mb":20100}}`)
	for _, d := range bunstore.MigratedDialects() {
		b.Run(d.Name, func(b *testing.B) {
			db := open(b, d.New(b))
			pub, priv, _ := ed25519.GenerateKey(rand.Reader)
			clock := time.Now()
			now := func() time.Time { return clock }
			signer := replay.NewSigner(priv, &replay.SignerConfig{Now: now, Rand: &counterReader{}})
			reqs := make([]*http.Request, b.N)
			for i := range reqs {
				r := httptest.NewRequest("POST", "/workers/heartbeat", nil)
				r.Host = "cp.example"
				r.Header.Set("Content-Type", "application/json")
				if err := signer.Sign(r, body); err != nil {
					b.Fatal(err)
				}
				reqs[i] = r
			}
			v := replay.NewVerifier(db.NonceStore(&bunstore.NonceConfig{PerNode: b.N + 1}), &replay.VerifierConfig{Now: now})
			b.ReportAllocs()
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				if _, err := v.Verify(ctx, reqs[i], body, "studio-gpu-1", pub); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
