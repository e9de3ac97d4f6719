package bunstore_test

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"golang.org/x/mod/sumdb/note"
	"golang.org/x/mod/sumdb/tlog"

	"github.com/nodelane/nodelane/bunstore"
	"github.com/nodelane/nodelane/internal/testdb"
	"github.com/nodelane/nodelane/internal/waitfor"
	"github.com/nodelane/nodelane/receipts"
	"github.com/nodelane/nodelane/receipts/receiptstest"
)

const receiptsOrigin = "bunstore.test/receipts"

func receiptSigner(t testing.TB) (note.Signer, string) {
	t.Helper()
	skey, vkey, err := receipts.GenerateKey(rand.Reader, receiptsOrigin)
	if err != nil {
		t.Fatal(err)
	}
	s, err := note.NewSigner(skey)
	if err != nil {
		t.Fatal(err)
	}
	return s, vkey
}

var errCommit = errors.New("commit fails")

// commitFails is a ReceiptStore whose Sequence writes its batch inside
// an enclosing transaction that then rolls back, as a failed commit
// would. It checks that the batch was written before the rollback.
type commitFails struct {
	*bunstore.ReceiptStore
	db    *bunstore.DB
	wrote int64 // the tree size the rolled-back batch reached
}

func (s *commitFails) Sequence(ctx context.Context, limit int, integrate receipts.IntegrateFunc) error {
	return s.db.InTx(ctx, func(ctx context.Context) error {
		if err := s.ReceiptStore.Sequence(ctx, limit, integrate); err != nil {
			return err
		}
		tr, err := s.ReceiptStore.Tree(ctx)
		if err != nil {
			return err
		}
		s.wrote = tr.Size
		return errCommit
	})
}

// A batch written in a transaction that does not commit leaves nothing:
// no index, no stored hash, no tree change, and no signed checkpoint.
// Receipts minted in a transaction that rolls back never existed.
func TestReceiptsTransactions(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	for _, d := range bunstore.MigratedDialects() {
		t.Run(d.Name, func(t *testing.T) {
			t.Parallel()
			db := open(t, d.New(t))
			store := db.ReceiptStore()
			signer, vkey := receiptSigner(t)
			cfg := &receipts.Config{Origin: receiptsOrigin}
			log := receipts.NewLog(store, cfg)
			good, err := receipts.NewSequencer(store, signer, cfg)
			if err != nil {
				t.Fatal(err)
			}

			var kept *receipts.Stored
			if err := db.InTx(ctx, func(ctx context.Context) error {
				kept, err = log.Mint(ctx, receiptstest.Sample(0))
				return err
			}); err != nil {
				t.Fatal(err)
			}
			var lost *receipts.Stored
			err = db.InTx(ctx, func(ctx context.Context) error {
				if lost, err = log.Mint(ctx, receiptstest.Sample(1)); err != nil {
					return err
				}
				return errCommit
			})
			if !errors.Is(err, errCommit) {
				t.Fatalf("InTx = %v", err)
			}
			if _, err := log.Get(ctx, lost.ID); !errors.Is(err, receipts.ErrNotFound) {
				t.Errorf("a receipt minted in a rolled-back transaction exists: %v", err)
			}
			if _, err := good.Sequence(ctx); err != nil {
				t.Fatal(err)
			}
			cpBefore, err := log.Checkpoint(ctx)
			if err != nil || cpBefore.Size != 1 {
				t.Fatalf("checkpoint = %+v, %v; want one of the tree of 1", cpBefore, err)
			}

			pending := make([]*receipts.Stored, 3)
			for i := range pending {
				if pending[i], err = log.Mint(ctx, receiptstest.Sample(2+i)); err != nil {
					t.Fatal(err)
				}
			}
			failing := &commitFails{ReceiptStore: store, db: db}
			bad, err := receipts.NewSequencer(failing, signer, cfg)
			if err != nil {
				t.Fatal(err)
			}
			if _, err := bad.Sequence(ctx); !errors.Is(err, errCommit) {
				t.Fatalf("Sequence over a failing commit: err = %v, want it", err)
			}
			if failing.wrote != 4 {
				t.Fatalf("the batch reached a tree of %d before the rollback, want 4", failing.wrote)
			}
			if tr, err := store.Tree(ctx); err != nil || tr != cpBefore.Tree() {
				t.Errorf("tree after the rollback = %+v, %v; want %+v", tr, err, cpBefore.Tree())
			}
			if cp, err := log.Checkpoint(ctx); err != nil {
				t.Errorf("Checkpoint after the rollback: %v", err)
			} else if cp.Size != 1 {
				t.Errorf("after the rollback, the checkpoint is of %d, want still 1: a batch that rolled back was signed", cp.Size)
			}
			for _, s := range pending {
				if got, err := log.Get(ctx, s.ID); err != nil || got.Sequenced {
					t.Errorf("receipt %s after the rollback: %+v, %v", s.ID, got, err)
				}
			}
			if _, err := store.ReadHashes(ctx, []int64{tlog.StoredHashCount(1)}); !errors.Is(err, receipts.ErrNotFound) {
				t.Errorf("a stored hash of the rolled-back batch remains: %v", err)
			}

			// The next batch takes the same receipts, in mint order.
			if n, err := good.Sequence(ctx); err != nil || n != 3 {
				t.Fatalf("Sequence = %d, %v; want 3", n, err)
			}
			for i, s := range append([]*receipts.Stored{kept}, pending...) {
				got, p, cp, err := log.Prove(ctx, s.ID)
				if err != nil {
					t.Fatal(err)
				}
				if got.Index != int64(i) {
					t.Errorf("receipt minted %dth has index %d", i, got.Index)
				}
				if _, err := receipts.Verify(vkey, receiptsOrigin, got.Body, p, cp.Note); err != nil {
					t.Errorf("receipt %d: %v", i, err)
				}
			}
		})
	}
}

// TestReceiptsAcceptance has 16 goroutines mint 500 receipts each (125
// under the race detector) through two replicas (two handles on one
// PostgreSQL schema), while a Sequencer on each replica runs. Every
// receipt gets one index, from 0 with no gap, each minter's receipts
// in its mint order, and every inclusion proof verifies against the final
// checkpoint.
func TestReceiptsAcceptance(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("8,000 receipts")
	}
	const minters = 16
	each := 500
	if raceEnabled {
		each = 125
	}
	ctx := context.Background()
	tdb := testdb.Postgres(t)
	signer, vkey := receiptSigner(t)
	var (
		logs     [2]*receipts.Log
		seqs     [2]*receipts.Sequencer
		batches  [2]atomic.Int64
		seqErrs  = make(chan error, 100)
		runCtx   context.Context
		stopRuns context.CancelFunc
	)
	runCtx, stopRuns = context.WithCancel(ctx)
	defer stopRuns()
	for i := range 2 {
		store := &countingStore{ReceiptStore: open(t, tdb).ReceiptStore(), batches: &batches[i]}
		cfg := &receipts.Config{
			Origin: receiptsOrigin, BatchSize: 128, Interval: 2 * time.Millisecond,
			OnError: func(err error) {
				select {
				case seqErrs <- err:
				default:
				}
			},
		}
		logs[i] = receipts.NewLog(store, cfg)
		q, err := receipts.NewSequencer(store, signer, cfg)
		if err != nil {
			t.Fatal(err)
		}
		seqs[i] = q
	}
	var runs sync.WaitGroup
	for _, q := range seqs {
		runs.Add(1)
		go func() {
			defer runs.Done()
			q.Run(runCtx)
		}()
	}

	ids := make([][]string, minters)
	var wg sync.WaitGroup
	for m := range minters {
		wg.Add(1)
		go func() {
			defer wg.Done()
			l := logs[m%2]
			for i := range each {
				s, err := l.Mint(ctx, receiptstest.Sample(m*each+i))
				if err != nil {
					t.Errorf("minter %d: %v", m, err)
					return
				}
				ids[m] = append(ids[m], s.ID)
			}
		}()
	}
	wg.Wait()
	if t.Failed() {
		t.FailNow()
	}

	total := minters * each
	var cp *receipts.Checkpoint
	waitfor.Within(t, 2*time.Minute, fmt.Sprintf("a checkpoint of %d receipts", total), func() bool {
		c, err := logs[0].Checkpoint(ctx)
		if err == nil && c.Size == int64(total) {
			cp = c
		}
		return cp != nil
	})
	stopRuns()
	runs.Wait()
	close(seqErrs)
	for err := range seqErrs {
		t.Errorf("a sequencer failed: %v", err)
	}
	t.Logf("batches by replica: %d and %d", batches[0].Load(), batches[1].Load())

	all, err := logs[1].List(ctx, 0, 1000)
	for err == nil && len(all)%1000 == 0 && len(all) < total {
		var more []*receipts.Stored
		more, err = logs[1].List(ctx, int64(len(all)), 1000)
		all = append(all, more...)
	}
	if err != nil {
		t.Fatal(err)
	}
	if len(all) != total {
		t.Fatalf("%d receipts sequenced, want %d", len(all), total)
	}
	index := make(map[string]int64, total)
	for i, s := range all {
		if s.Index != int64(i) {
			t.Fatalf("the receipt listed %dth has index %d: a gap or a duplicate", i, s.Index)
		}
		if _, dup := index[s.ID]; dup {
			t.Fatalf("receipt %s has two indices", s.ID)
		}
		index[s.ID] = s.Index
	}
	for m, mine := range ids {
		prev := int64(-1)
		for _, id := range mine {
			i, ok := index[id]
			if !ok {
				t.Fatalf("receipt %s of minter %d was never sequenced", id, m)
			}
			if i <= prev {
				t.Errorf("minter %d: receipt %s got index %d after one at %d, out of mint order", m, id, i, prev)
			}
			prev = i
		}
	}

	// Every receipt verifies against the final checkpoint.
	work := make(chan *receipts.Stored)
	var verified atomic.Int64
	for range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for s := range work {
				p, err := logs[s.Index%2].InclusionProof(ctx, s.Index, cp.Size)
				if err == nil {
					_, err = receipts.Verify(vkey, receiptsOrigin, s.Body, p, cp.Note)
				}
				if err != nil {
					t.Errorf("receipt %d: %v", s.Index, err)
					continue
				}
				verified.Add(1)
			}
		}()
	}
	for _, s := range all {
		work <- s
	}
	close(work)
	wg.Wait()
	if verified.Load() != int64(total) {
		t.Errorf("%d receipts verified, want %d", verified.Load(), total)
	}
}

// countingStore counts the batches its Sequence integrates.
type countingStore struct {
	*bunstore.ReceiptStore
	batches *atomic.Int64
}

func (s *countingStore) Sequence(ctx context.Context, limit int, integrate receipts.IntegrateFunc) error {
	return s.ReceiptStore.Sequence(ctx, limit, func(t receipts.Tree, p []*receipts.Stored, r tlog.HashReader) (*receipts.Batch, error) {
		s.batches.Add(1)
		return integrate(t, p, r)
	})
}

// BenchmarkReceiptsMintSequence measures minting and sequencing
// throughput: minters goroutines mint b.N receipts (each its own
// transaction), while one Sequencer integrates them, until the last is
// sequenced and a checkpoint signed. receipts/s is the throughput.
func BenchmarkReceiptsMintSequence(b *testing.B) {
	for _, d := range bunstore.MigratedDialects() {
		b.Run(d.Name, func(b *testing.B) {
			for _, minters := range []int{1, 16} {
				b.Run(fmt.Sprintf("minters=%d", minters), func(b *testing.B) {
					benchmarkMintSequence(b, d.New(b), minters)
				})
			}
		})
	}
}

func benchmarkMintSequence(b *testing.B, tdb testdb.DB, minters int) {
	ctx := context.Background()
	store := open(b, tdb).ReceiptStore()
	signer, _ := receiptSigner(b)
	cfg := &receipts.Config{Origin: receiptsOrigin, Interval: time.Millisecond}
	log := receipts.NewLog(store, cfg)
	q, err := receipts.NewSequencer(store, signer, cfg)
	if err != nil {
		b.Fatal(err)
	}
	runCtx, stop := context.WithCancel(ctx)
	var run sync.WaitGroup
	run.Add(1)
	go func() {
		defer run.Done()
		q.Run(runCtx)
	}()
	var next atomic.Int64
	var wg sync.WaitGroup
	b.ResetTimer()
	for range minters {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := next.Add(1); i <= int64(b.N); i = next.Add(1) {
				if _, err := log.Mint(ctx, receiptstest.Sample(int(i))); err != nil {
					b.Error(err)
					return
				}
			}
		}()
	}
	wg.Wait()
	for {
		published := q.Published()
		cp, err := log.Checkpoint(ctx)
		if err == nil && cp.Size == int64(b.N) {
			break
		}
		if b.Failed() {
			break
		}
		waitfor.Receive(b, "the next checkpoint", published)
	}
	b.StopTimer()
	stop()
	run.Wait()
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "receipts/s")
}
