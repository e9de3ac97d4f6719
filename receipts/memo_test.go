package receipts_test

import (
	"context"
	"sync/atomic"
	"testing"

	"golang.org/x/mod/sumdb/tlog"

	"github.com/nodelane/nodelane/receipts"
)

// integrateReads is a Store that counts the hash reads integrate makes
// inside Sequence.
type integrateReads struct {
	receipts.Store
	reads atomic.Int64
}

func (s *integrateReads) Sequence(ctx context.Context, limit int, integrate receipts.IntegrateFunc) error {
	return s.Store.Sequence(ctx, limit, func(t receipts.Tree, pending []*receipts.Stored, r tlog.HashReader) (*receipts.Batch, error) {
		counted := tlog.HashReaderFunc(func(indexes []int64) ([]tlog.Hash, error) {
			s.reads.Add(1)
			return r.ReadHashes(indexes)
		})
		return integrate(t, pending, counted)
	})
}

// A Sequencer that finds the tree its last batch made verifies it with
// the hashes that batch wrote and read, not the store's; a tree another
// Sequencer made it reads. The trees and proofs stay those of the store.
func TestSequenceReadsNoHashesAfterItsOwnBatch(t *testing.T) {
	t.Parallel()
	f := newAwaitFixture(t)
	store := &integrateReads{Store: f.mem}
	q := f.sequencer(store, receipts.Config{BatchSize: 3})
	other := f.sequencer(store, receipts.Config{BatchSize: 3})
	sequence := func(q *receipts.Sequencer, want int) {
		t.Helper()
		if n, err := q.Sequence(f.ctx); err != nil || n != want {
			t.Fatalf("Sequence = %d, %v; want %d", n, err, want)
		}
	}
	f.mint(7)
	sequence(q, 3) // the first batch reads the empty tree's hashes: none
	before := store.reads.Load()
	sequence(q, 3)
	sequence(q, 1)
	if n := store.reads.Load() - before; n != 0 {
		t.Errorf("two batches after its own read %d times from the store, want 0", n)
	}
	f.mint(2)
	sequence(other, 2) // another Sequencer's tree
	f.mint(2)
	before = store.reads.Load()
	sequence(q, 2)
	if n := store.reads.Load() - before; n == 0 {
		t.Error("a batch on a tree another Sequencer made read nothing from the store")
	}
	// Every receipt proves against the latest checkpoint with the
	// store's hashes.
	all, err := f.mem.ListReceipts(f.ctx, 0, 100)
	if err != nil || len(all) != 11 {
		t.Fatalf("ListReceipts = %d, %v", len(all), err)
	}
	ids := make([]string, len(all))
	for i, s := range all {
		ids[i] = s.ID
	}
	if _, _, _, err := f.log.ProveAll(f.ctx, ids...); err != nil {
		t.Fatalf("ProveAll after the batches: %v", err)
	}
}
