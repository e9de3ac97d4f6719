// Package receiptstest is the conformance suite that every receipts.Store
// must pass. An adapter's test calls Run with a function that returns a
// new, empty store:
//
//	func TestReceiptStore(t *testing.T) {
//		receiptstest.Run(t, func(t *testing.T) receipts.Store { return newEmptyStore(t) })
//	}
//
// The suite's tests run in parallel, each on a store of its own: the
// function is called concurrently, from parallel subtests, and must
// return a store independent of every other it returned (a database, or
// a schema, of its own), so that no test sees another's writes.
//
// The suite drives the store through receipts.Log and receipts.Sequencer,
// so it checks the receipt log end to end on that store: minting, sequencing in
// mint order and in batches, the tree and its stored hashes against an
// independent computation, inclusion and consistency proofs for every
// size, checkpoints signed only after a batch committed (and signed late
// after a crash), batches that fail leaving nothing behind, export,
// concurrent minting under two sequencers, limits that must be positive,
// ids compared as bytes and bodies kept byte for byte.
package receiptstest

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"golang.org/x/mod/sumdb/note"
	"golang.org/x/mod/sumdb/tlog"

	"github.com/nodelane/nodelane/internal/waitfor"
	"github.com/nodelane/nodelane/receipts"
)

// Origin is the checkpoint origin the suite uses.
const Origin = "receiptstest.example/log"

// epoch has a nanosecond part, which receipts must drop.
var epoch = time.Date(2026, 11, 30, 9, 0, 0, 123456789, time.UTC)

type fixture struct {
	t      *testing.T
	ctx    context.Context
	store  receipts.Store
	log    *receipts.Log
	signer note.Signer
	vkey   string
	minted int
}

func newFixture(t *testing.T, newStore func(t *testing.T) receipts.Store) *fixture {
	t.Helper()
	skey, vkey, err := note.GenerateKey(rand.Reader, Origin)
	if err != nil {
		t.Fatal(err)
	}
	signer, err := note.NewSigner(skey)
	if err != nil {
		t.Fatal(err)
	}
	f := &fixture{t: t, ctx: context.Background(), store: newStore(t), signer: signer, vkey: vkey}
	f.log = receipts.NewLog(f.store, f.config(0))
	return f
}

func (f *fixture) config(batch int) *receipts.Config {
	return &receipts.Config{
		Origin:    Origin,
		BatchSize: batch,
		Interval:  2 * time.Millisecond,
		Now:       func() time.Time { return epoch },
	}
}

func (f *fixture) sequencer(s receipts.Store, batch int) *receipts.Sequencer {
	f.t.Helper()
	q, err := receipts.NewSequencer(s, f.signer, f.config(batch))
	if err != nil {
		f.t.Fatal(err)
	}
	return q
}

// Sample returns a valid receipt, of one of several kinds depending on
// i, without id or server time.
func Sample(i int) receipts.Receipt {
	switch i % 4 {
	case 0:
		return receipts.Receipt{Kind: receipts.KindNodeAudit, PolicyVersion: 1, WorkerID: fmt.Sprintf("wrk_%d", i),
			EventType: "driver_update", OccurredAt: epoch, PayloadSHA256: strings.Repeat("ab", 32)}
	case 1:
		c, err := receipts.NewCharge(epoch, epoch.Add(time.Duration(i)*time.Second), 2, 1_800_000)
		if err != nil {
			panic(err)
		}
		r := c.Receipt(fmt.Sprintf("job_%d", i), "wrk_1", "rtx-4090")
		r.PolicyVersion = 2
		return r
	case 2:
		return receipts.Receipt{Kind: receipts.KindEnvelopeActivated, PolicyVersion: int64(i), Actor: "operator-1",
			Reason: "night run \"α\"\n", Until: epoch.Add(time.Hour)}
	default:
		return receipts.Receipt{Kind: receipts.KindJobCompleted, PolicyVersion: 3, JobID: fmt.Sprintf("job_%d", i),
			WorkerID: "wrk_1", JobType: "lora_train", LeaseEpoch: 1, Attempt: 1, StartedAt: epoch, EndedAt: epoch.Add(time.Minute)}
	}
}

func (f *fixture) mint(n int) []*receipts.Stored {
	f.t.Helper()
	out := make([]*receipts.Stored, n)
	for i := range out {
		s, err := f.log.Mint(f.ctx, Sample(f.minted))
		if err != nil {
			f.t.Fatalf("Mint: %v", err)
		}
		f.minted++
		out[i] = s
	}
	return out
}

func (f *fixture) sequence(q *receipts.Sequencer, want int) {
	f.t.Helper()
	n, err := q.Sequence(f.ctx)
	if err != nil {
		f.t.Fatalf("Sequence: %v", err)
	}
	if n != want {
		f.t.Fatalf("Sequence sequenced %d receipts, want %d", n, want)
	}
}

func (f *fixture) tree() receipts.Tree {
	f.t.Helper()
	tr, err := f.store.Tree(f.ctx)
	if err != nil {
		f.t.Fatalf("Tree: %v", err)
	}
	return tr
}

func (f *fixture) checkpoint() *receipts.Checkpoint {
	f.t.Helper()
	cp, err := f.store.LatestCheckpoint(f.ctx)
	if errors.Is(err, receipts.ErrNotFound) {
		return nil
	}
	if err != nil {
		f.t.Fatalf("LatestCheckpoint: %v", err)
	}
	return cp
}

func (f *fixture) get(id string) *receipts.Stored {
	f.t.Helper()
	s, err := f.store.GetReceipt(f.ctx, id)
	if err != nil {
		f.t.Fatalf("GetReceipt(%s): %v", id, err)
	}
	return s
}

// model computes, independently of any store, the stored hashes and the
// root of every prefix of a log of bodies.
type model struct {
	hashes []tlog.Hash
	roots  []tlog.Hash // roots[n] is the root of the first n bodies
}

func newModel(t *testing.T, bodies [][]byte) *model {
	t.Helper()
	m := &model{}
	r := tlog.HashReaderFunc(func(idx []int64) ([]tlog.Hash, error) {
		out := make([]tlog.Hash, len(idx))
		for i, x := range idx {
			out[i] = m.hashes[x]
		}
		return out, nil
	})
	root, _ := tlog.TreeHash(0, r)
	m.roots = append(m.roots, root)
	for i, b := range bodies {
		hs, err := tlog.StoredHashes(int64(i), b, r)
		if err != nil {
			t.Fatal(err)
		}
		m.hashes = append(m.hashes, hs...)
		root, err := tlog.TreeHash(int64(i+1), r)
		if err != nil {
			t.Fatal(err)
		}
		m.roots = append(m.roots, root)
	}
	return m
}

// Run runs the conformance suite on stores that newStore returns, each
// new and empty. Every test gets its own store and runs in parallel with
// the others, so newStore is called concurrently, from parallel subtests,
// and must return independent stores: receipts one test mints must never
// show in another's store.
func Run(t *testing.T, newStore func(t *testing.T) receipts.Store) {
	tests := []struct {
		name string
		fn   func(t *testing.T, newStore func(t *testing.T) receipts.Store)
	}{
		{"FreshStore", testFreshStore},
		{"MintAndGet", testMintAndGet},
		{"MintAll", testMintAll},
		{"SequenceInMintOrder", testSequenceInMintOrder},
		{"Proofs", testProofs},
		{"EmptyCheckpoint", testEmptyCheckpoint},
		{"FailedBatchSignsNothing", testFailedBatch},
		{"CrashBeforePublish", testCrashBeforePublish},
		{"BatchValidation", testBatchValidation},
		{"Checkpoints", testCheckpoints},
		{"Export", testExport},
		{"Await", testAwait},
		{"Concurrent", testConcurrent},
		{"Limits", testLimits},
		{"IDsAreBytes", testIDsAreBytes},
		{"BodiesRoundTrip", testBodiesRoundTrip},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			tc.fn(t, newStore)
		})
	}
}

func testFreshStore(t *testing.T, newStore func(t *testing.T) receipts.Store) {
	f := newFixture(t, newStore)
	if got := f.tree(); got != receipts.EmptyTree() {
		t.Errorf("Tree = %+v, want the empty tree", got)
	}
	if cp := f.checkpoint(); cp != nil {
		t.Errorf("LatestCheckpoint = %+v, want ErrNotFound", cp)
	}
	if _, err := f.store.ReadHashes(f.ctx, []int64{0}); !errors.Is(err, receipts.ErrNotFound) {
		t.Errorf("ReadHashes([0]) err = %v, want ErrNotFound", err)
	}
	if hs, err := f.store.ReadHashes(f.ctx, nil); err != nil || len(hs) != 0 {
		t.Errorf("ReadHashes(nil) = %v, %v; want nothing", hs, err)
	}
	if ss, err := f.store.ListReceipts(f.ctx, 0, 10); err != nil || len(ss) != 0 {
		t.Errorf("ListReceipts = %v, %v; want nothing", ss, err)
	}
	called := false
	err := f.store.Sequence(f.ctx, 10, func(receipts.Tree, []*receipts.Stored, tlog.HashReader) (*receipts.Batch, error) {
		called = true
		return nil, errors.New("nothing to integrate")
	})
	if err != nil || called {
		t.Errorf("Sequence with nothing pending: err = %v, integrate called = %v; want nil, false", err, called)
	}
}

func testMintAndGet(t *testing.T, newStore func(t *testing.T) receipts.Store) {
	f := newFixture(t, newStore)
	ss := f.mint(4)
	for i, s := range ss {
		got := f.get(s.ID)
		if d := cmp.Diff(s, got); d != "" {
			t.Errorf("receipt %d (-minted +stored):\n%s", i, d)
		}
		if got.Sequenced {
			t.Errorf("receipt %d is sequenced before any Sequencer ran", i)
		}
		r, err := got.Receipt()
		if err != nil {
			t.Fatalf("stored body does not decode: %v", err)
		}
		if !r.ServerTime.Equal(epoch.Truncate(time.Microsecond)) || r.ID != s.ID || !strings.HasPrefix(r.ID, "rcp_") {
			t.Errorf("receipt %d: id %s, server time %v", i, r.ID, r.ServerTime)
		}
		// Changing what the store returned changes nothing stored.
		got.Body[0] = 'X'
		if again := f.get(s.ID); !bytes.Equal(again.Body, s.Body) {
			t.Errorf("the store handed out its own body")
		}
	}
	if _, err := f.store.GetReceipt(f.ctx, "rcp_missing"); !errors.Is(err, receipts.ErrNotFound) {
		t.Errorf("GetReceipt(unknown) err = %v, want ErrNotFound", err)
	}
	dup := Sample(0)
	dup.ID = ss[0].ID
	if _, err := f.log.Mint(f.ctx, dup); !errors.Is(err, receipts.ErrConflict) {
		t.Errorf("Mint with a taken id: err = %v, want ErrConflict", err)
	}
	if _, err := f.log.Mint(f.ctx, receipts.Receipt{Kind: "job_teleported"}); !errors.Is(err, receipts.ErrInvalidArgument) {
		t.Errorf("Mint of an unknown kind: err = %v, want ErrInvalidArgument", err)
	}
	if ss, err := f.store.ListReceipts(f.ctx, 0, 100); err != nil || len(ss) != 0 {
		t.Errorf("ListReceipts lists unsequenced receipts: %v, %v", ss, err)
	}
}

// MintAll mints in the order given (the order they are sequenced in),
// all or none; through AddReceipts when the store is a BatchAdder.
func testMintAll(t *testing.T, newStore func(t *testing.T) receipts.Store) {
	f := newFixture(t, newStore)
	first := f.mint(1)[0]
	var rs []receipts.Receipt
	for i := range 3 {
		rs = append(rs, Sample(10+i))
	}
	ss, err := f.log.MintAll(f.ctx, rs...)
	if err != nil || len(ss) != 3 {
		t.Fatalf("MintAll = %d receipts, %v", len(ss), err)
	}
	for i, s := range ss {
		if d := cmp.Diff(s, f.get(s.ID)); d != "" {
			t.Errorf("receipt %d of MintAll (-minted +stored):\n%s", i, d)
		}
	}
	// A batch with a taken id, or an id twice, keeps none of its receipts.
	for name, batch := range map[string][]receipts.Receipt{
		"a taken id":  {Sample(20), {Kind: receipts.KindJobCompleted}, Sample(21)},
		"an id twice": {Sample(22), Sample(23)},
	} {
		batch := slices.Clone(batch)
		ids := []string{"rcp_batch_" + name + "_0", first.ID, "rcp_batch_" + name + "_2"}
		if name == "an id twice" {
			ids = []string{"rcp_twice", "rcp_twice"}
		} else {
			batch[1] = Sample(24)
		}
		for i := range batch {
			batch[i].ID = ids[i]
		}
		if _, err := f.log.MintAll(f.ctx, batch...); !errors.Is(err, receipts.ErrConflict) {
			t.Errorf("MintAll with %s: err = %v, want ErrConflict", name, err)
		}
		for _, id := range ids {
			if id == first.ID {
				continue
			}
			if _, err := f.store.GetReceipt(f.ctx, id); !errors.Is(err, receipts.ErrNotFound) {
				t.Errorf("MintAll with %s kept receipt %s (%v)", name, id, err)
			}
		}
	}
	q := f.sequencer(f.store, 10)
	f.sequence(q, 4)
	for i, s := range append([]*receipts.Stored{first}, ss...) {
		if got := f.get(s.ID); !got.Sequenced || got.Index != int64(i) {
			t.Errorf("receipt minted %dth has index %d (sequenced %v)", i, got.Index, got.Sequenced)
		}
	}
}

func testSequenceInMintOrder(t *testing.T, newStore func(t *testing.T) receipts.Store) {
	f := newFixture(t, newStore)
	q := f.sequencer(f.store, 4)
	minted := f.mint(10)
	var bodies [][]byte
	for _, s := range minted {
		bodies = append(bodies, s.Body)
	}
	m := newModel(t, bodies)
	for _, want := range []int{4, 4, 2, 0} {
		f.sequence(q, want)
		size := min(int64(len(bodies)), f.tree().Size)
		if got := f.tree(); got.Root != m.roots[size] {
			t.Fatalf("tree of %d has root %v, want %v", size, got.Root, m.roots[size])
		}
		cp := f.checkpoint()
		if cp == nil || cp.Size != size || cp.Root != m.roots[size] {
			t.Fatalf("after a batch, latest checkpoint = %+v, want one of the tree of %d", cp, size)
		}
	}
	for i, s := range minted {
		got := f.get(s.ID)
		if !got.Sequenced || got.Index != int64(i) {
			t.Errorf("receipt minted %dth has index %d (sequenced %v)", i, got.Index, got.Sequenced)
		}
	}
	hs, err := f.store.ReadHashes(f.ctx, []int64{5, 0, int64(len(m.hashes) - 1)})
	if err != nil {
		t.Fatal(err)
	}
	if d := cmp.Diff([]tlog.Hash{m.hashes[5], m.hashes[0], m.hashes[len(m.hashes)-1]}, hs); d != "" {
		t.Errorf("ReadHashes (-want +got):\n%s", d)
	}
	if _, err := f.store.ReadHashes(f.ctx, []int64{int64(len(m.hashes))}); !errors.Is(err, receipts.ErrNotFound) {
		t.Errorf("ReadHashes past the tree: err = %v, want ErrNotFound", err)
	}
	for _, tc := range []struct {
		from  int64
		limit int
		want  []int64
	}{
		{0, 100, []int64{0, 1, 2, 3, 4, 5, 6, 7, 8, 9}},
		{0, 10, []int64{0, 1, 2, 3, 4, 5, 6, 7, 8, 9}},
		{0, 1, []int64{0}},
		{3, 2, []int64{3, 4}},
		{8, 5, []int64{8, 9}},
		{10, 5, nil},
	} {
		ss, err := f.store.ListReceipts(f.ctx, tc.from, tc.limit)
		if err != nil {
			t.Fatal(err)
		}
		var got []int64
		for _, s := range ss {
			got = append(got, s.Index)
			if !bytes.Equal(s.Body, bodies[s.Index]) {
				t.Errorf("ListReceipts: receipt %d has another body", s.Index)
			}
		}
		if d := cmp.Diff(tc.want, got); d != "" {
			t.Errorf("ListReceipts(%d, %d) indices (-want +got):\n%s", tc.from, tc.limit, d)
		}
	}
}

func testProofs(t *testing.T, newStore func(t *testing.T) receipts.Store) {
	f := newFixture(t, newStore)
	var bodies [][]byte
	var ids []string
	// Batches of uneven sizes, so that batch edges fall inside subtrees.
	for _, n := range []int{1, 2, 5, 1, 4} {
		for _, s := range f.mint(n) {
			bodies = append(bodies, s.Body)
			ids = append(ids, s.ID)
		}
		f.sequence(f.sequencer(f.store, 100), n)
	}
	m := newModel(t, bodies)
	size := int64(len(bodies))
	for n := int64(1); n <= size; n++ {
		for i := range n {
			p, err := f.log.InclusionProof(f.ctx, i, n)
			if err != nil {
				t.Fatalf("InclusionProof(%d, %d): %v", i, n, err)
			}
			if p.Index != i || p.TreeSize != n {
				t.Errorf("InclusionProof(%d, %d) = %+v", i, n, p)
			}
			if err := tlog.CheckRecord(p.Hashes, n, m.roots[n], i, tlog.RecordHash(bodies[i])); err != nil {
				t.Errorf("inclusion proof of %d in %d does not hold: %v", i, n, err)
			}
		}
		for old := int64(0); old <= n; old++ {
			p, err := f.log.ConsistencyProof(f.ctx, old, n)
			if err != nil {
				t.Fatalf("ConsistencyProof(%d, %d): %v", old, n, err)
			}
			if err := receipts.CheckConsistency(receipts.Tree{Size: old, Root: m.roots[old]}, receipts.Tree{Size: n, Root: m.roots[n]}, p); err != nil {
				t.Errorf("consistency proof %d -> %d does not hold: %v", old, n, err)
			}
		}
	}
	for _, tc := range []struct{ index, size int64 }{{-1, 3}, {3, 3}, {0, size + 1}, {0, 0}} {
		if _, err := f.log.InclusionProof(f.ctx, tc.index, tc.size); !errors.Is(err, receipts.ErrInvalidArgument) {
			t.Errorf("InclusionProof(%d, %d) err = %v, want ErrInvalidArgument", tc.index, tc.size, err)
		}
	}
	for _, tc := range []struct{ old, new int64 }{{-1, 3}, {4, 3}, {1, size + 1}} {
		if _, err := f.log.ConsistencyProof(f.ctx, tc.old, tc.new); !errors.Is(err, receipts.ErrInvalidArgument) {
			t.Errorf("ConsistencyProof(%d, %d) err = %v, want ErrInvalidArgument", tc.old, tc.new, err)
		}
	}
	// Every receipt verifies offline against the latest checkpoint.
	for i, id := range ids {
		s, p, cp, err := f.log.Prove(f.ctx, id)
		if err != nil {
			t.Fatalf("Prove(%s): %v", id, err)
		}
		if s.Index != int64(i) || cp.Size != size {
			t.Errorf("Prove(%s): index %d in a tree of %d, want %d in %d", id, s.Index, cp.Size, i, size)
		}
		r, err := receipts.Verify(f.vkey, Origin, s.Body, p, cp.Note)
		if err != nil {
			t.Errorf("Verify(receipt %d): %v", i, err)
		} else if r.ID != id {
			t.Errorf("Verify(receipt %d) returned receipt %s", i, r.ID)
		}
	}
}

func testEmptyCheckpoint(t *testing.T, newStore func(t *testing.T) receipts.Store) {
	f := newFixture(t, newStore)
	q := f.sequencer(f.store, 0)
	if _, err := f.log.Checkpoint(f.ctx); !errors.Is(err, receipts.ErrNotFound) {
		t.Errorf("Checkpoint of a new log: err = %v, want ErrNotFound", err)
	}
	f.sequence(q, 0)
	cp := f.checkpoint()
	if cp == nil || cp.Size != 0 || cp.Root != receipts.EmptyTree().Root {
		t.Fatalf("after the first Sequence, checkpoint = %+v, want the empty tree's", cp)
	}
	if _, err := receipts.OpenCheckpoint(cp.Note, f.vkey, Origin); err != nil {
		t.Errorf("the empty tree's checkpoint does not open: %v", err)
	}
	// Publishing again changes nothing.
	again, err := q.Publish(f.ctx)
	if err != nil || !bytes.Equal(again.Note, cp.Note) {
		t.Errorf("Publish again = %+v, %v; want the same checkpoint", again, err)
	}
}

// failingStore makes Sequence fail in the ways a transaction can.
type failingStore struct {
	receipts.Store
	// beforeWrite fails the batch after integrate computed it, before
	// anything is written: the store must write nothing.
	beforeWrite bool
	// afterCommit reports a failure after the batch committed, as a
	// process that crashed before publishing would.
	afterCommit bool
}

var errInjected = errors.New("receiptstest: injected failure")

func (s *failingStore) Sequence(ctx context.Context, limit int, integrate receipts.IntegrateFunc) error {
	wrapped := integrate
	if s.beforeWrite {
		wrapped = func(t receipts.Tree, p []*receipts.Stored, r tlog.HashReader) (*receipts.Batch, error) {
			if _, err := integrate(t, p, r); err != nil {
				return nil, err
			}
			return nil, errInjected
		}
	}
	if err := s.Store.Sequence(ctx, limit, wrapped); err != nil {
		return err
	}
	if s.afterCommit {
		return errInjected
	}
	return nil
}

func testFailedBatch(t *testing.T, newStore func(t *testing.T) receipts.Store) {
	f := newFixture(t, newStore)
	good := f.sequencer(f.store, 0)
	f.mint(3)
	f.sequence(good, 3)
	before, cpBefore := f.tree(), f.checkpoint()
	pending := f.mint(2)

	bad := f.sequencer(&failingStore{Store: f.store, beforeWrite: true}, 0)
	if n, err := bad.Sequence(f.ctx); !errors.Is(err, errInjected) || n != 0 {
		t.Fatalf("Sequence over a failing batch = %d, %v; want 0, the injected error", n, err)
	}
	if got := f.tree(); got != before {
		t.Errorf("a failed batch moved the tree from %+v to %+v", before, got)
	}
	if cp := f.checkpoint(); cp.Size != cpBefore.Size || !bytes.Equal(cp.Note, cpBefore.Note) {
		t.Errorf("a checkpoint of %d was signed for a batch that failed", cp.Size)
	}
	for _, s := range pending {
		if got := f.get(s.ID); got.Sequenced {
			t.Errorf("receipt %s got index %d from a batch that failed", s.ID, got.Index)
		}
	}
	if _, err := f.store.ReadHashes(f.ctx, []int64{tlog.StoredHashCount(before.Size)}); !errors.Is(err, receipts.ErrNotFound) {
		t.Errorf("a failed batch left a stored hash behind: err = %v", err)
	}
	// The receipts are still pending, and the next good batch takes them.
	f.sequence(good, 2)
	if cp := f.checkpoint(); cp.Size != 5 {
		t.Errorf("checkpoint of %d after the retry, want 5", cp.Size)
	}
}

func testCrashBeforePublish(t *testing.T, newStore func(t *testing.T) receipts.Store) {
	f := newFixture(t, newStore)
	crashing := f.sequencer(&failingStore{Store: f.store, afterCommit: true}, 0)
	f.mint(3)
	if _, err := crashing.Sequence(f.ctx); !errors.Is(err, errInjected) {
		t.Fatalf("Sequence err = %v, want the injected error", err)
	}
	if got := f.tree(); got.Size != 3 {
		t.Fatalf("tree of %d after a committed batch, want 3", got.Size)
	}
	if cp := f.checkpoint(); cp != nil {
		t.Fatalf("a checkpoint of %d was signed although the Sequencer saw the batch fail", cp.Size)
	}
	// The next run, with nothing pending, signs the committed tree.
	f.sequence(f.sequencer(f.store, 0), 0)
	cp := f.checkpoint()
	if cp == nil || cp.Tree() != f.tree() {
		t.Fatalf("checkpoint after recovery = %+v, want the tree %+v", cp, f.tree())
	}
}

func testBatchValidation(t *testing.T, newStore func(t *testing.T) receipts.Store) {
	f := newFixture(t, newStore)
	f.mint(3)
	before := f.tree()
	tests := []struct {
		name   string
		mutate func(*receipts.Batch)
	}{
		{"too few receipts", func(b *receipts.Batch) { b.Tree.Size-- }},
		{"too many receipts", func(b *receipts.Batch) { b.Tree.Size++ }},
		{"a hash missing", func(b *receipts.Batch) { b.Hashes = b.Hashes[1:] }},
		{"a hash too many", func(b *receipts.Batch) { b.Hashes = append(b.Hashes, tlog.Hash{}) }},
		{"no batch", nil},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			err := f.store.Sequence(f.ctx, 100, func(tr receipts.Tree, p []*receipts.Stored, r tlog.HashReader) (*receipts.Batch, error) {
				if tc.mutate == nil {
					return nil, nil
				}
				// A correct batch, from another sequencer's code path.
				b := &receipts.Batch{Tree: receipts.Tree{Size: tr.Size + int64(len(p))}}
				for i, s := range p {
					hs, err := tlog.StoredHashes(tr.Size+int64(i), s.Body, tlog.HashReaderFunc(func(idx []int64) ([]tlog.Hash, error) {
						out := make([]tlog.Hash, len(idx))
						for j, x := range idx {
							out[j] = b.Hashes[x]
						}
						return out, nil
					}))
					if err != nil {
						return nil, err
					}
					b.Hashes = append(b.Hashes, hs...)
				}
				tc.mutate(b)
				return b, nil
			})
			if !errors.Is(err, receipts.ErrConflict) {
				t.Errorf("Sequence with a batch that does not fit: err = %v, want ErrConflict", err)
			}
			if got := f.tree(); got != before {
				t.Errorf("the tree moved to %+v", got)
			}
		})
	}
}

func testCheckpoints(t *testing.T, newStore func(t *testing.T) receipts.Store) {
	f := newFixture(t, newStore)
	mk := func(size int64, root byte) *receipts.Checkpoint {
		cp, err := receipts.SignCheckpoint(f.signer, Origin, receipts.Tree{Size: size, Root: tlog.Hash{root}})
		if err != nil {
			t.Fatal(err)
		}
		return cp
	}
	for _, cp := range []*receipts.Checkpoint{mk(5, 1), mk(3, 2), mk(9, 3), mk(0, 4)} {
		if err := f.store.AddCheckpoint(f.ctx, cp); err != nil {
			t.Fatalf("AddCheckpoint(%d): %v", cp.Size, err)
		}
	}
	if err := f.store.AddCheckpoint(f.ctx, mk(5, 7)); !errors.Is(err, receipts.ErrConflict) {
		t.Errorf("AddCheckpoint of a size stored already: err = %v, want ErrConflict", err)
	}
	want := mk(9, 3)
	got := f.checkpoint()
	if got == nil || got.Size != 9 || got.Root != want.Root || !bytes.Equal(got.Note, want.Note) || got.Origin != Origin {
		t.Errorf("LatestCheckpoint = %+v, want the checkpoint of 9 as stored", got)
	}
}

func testExport(t *testing.T, newStore func(t *testing.T) receipts.Store) {
	f := newFixture(t, newStore)
	q := f.sequencer(f.store, 3)
	minted := f.mint(7)
	for range 3 {
		if _, err := q.Sequence(f.ctx); err != nil {
			t.Fatal(err)
		}
	}
	f.mint(2) // not sequenced: not exported
	var buf bytes.Buffer
	cp, err := f.log.Export(f.ctx, &buf)
	if err != nil {
		t.Fatalf("Export: %v", err)
	}
	if cp.Size != 7 {
		t.Fatalf("Export's checkpoint has %d receipts, want 7", cp.Size)
	}
	lines := bytes.Split(bytes.TrimSuffix(buf.Bytes(), []byte("\n")), []byte("\n"))
	if len(lines) != 7 {
		t.Fatalf("Export wrote %d lines, want 7:\n%s", len(lines), buf.String())
	}
	for i, line := range lines {
		var l receipts.ExportLine
		if err := json.Unmarshal(line, &l); err != nil {
			t.Fatalf("line %d: %v", i, err)
		}
		if l.ID != minted[i].ID || l.Kind != minted[i].Kind || l.Index == nil || *l.Index != int64(i) || !bytes.Equal(l.Body, minted[i].Body) {
			t.Errorf("line %d = %s, want receipt %s at index %d", i, line, minted[i].ID, i)
		}
		if l.Proof == nil {
			t.Fatalf("line %d has no proof", i)
		}
		if _, err := receipts.Verify(f.vkey, Origin, l.Body, *l.Proof, cp.Note); err != nil {
			t.Errorf("line %d does not verify: %v", i, err)
		}
	}
}

func testAwait(t *testing.T, newStore func(t *testing.T) receipts.Store) {
	f := newFixture(t, newStore)
	ss := f.mint(3)
	ctx, cancel := context.WithTimeout(f.ctx, 20*time.Millisecond)
	defer cancel()
	if _, _, _, err := f.log.Await(ctx, ss[0].ID); !errors.Is(err, receipts.ErrNotSequenced) || !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("Await with no sequencer: err = %v, want ErrNotSequenced and the deadline", err)
	}
	if _, _, _, err := f.log.Prove(f.ctx, ss[0].ID); !errors.Is(err, receipts.ErrNotSequenced) {
		t.Errorf("Prove before sequencing: err = %v, want ErrNotSequenced", err)
	}
	if _, _, _, err := f.log.Await(f.ctx, "rcp_missing"); !errors.Is(err, receipts.ErrNotFound) {
		t.Errorf("Await(unknown) err = %v, want ErrNotFound", err)
	}
	// The waiting Await runs on a Log whose store reports each receipt it
	// read unsequenced, so that the receipts are sequenced only once Await
	// has found them pending and waits.
	pending := make(chan struct{}, 1)
	waiting := receipts.NewLog(pendingReads{f.store, pending}, f.config(0))
	done := make(chan error, 1)
	go func() {
		got, proofs, cp, err := waiting.Await(f.ctx, ss[2].ID, ss[0].ID)
		if err == nil {
			for i, s := range got {
				if _, err = receipts.Verify(f.vkey, Origin, s.Body, proofs[i], cp.Note); err != nil {
					break
				}
			}
		}
		done <- err
	}()
	waitfor.Receive(t, "Await to find the receipts pending", pending)
	f.sequence(f.sequencer(f.store, 0), 3)
	if err := waitfor.Receive(t, "Await to return after the receipts were sequenced", done); err != nil {
		t.Errorf("Await: %v", err)
	}
}

// pendingReads is a Store that reports on pending each receipt it reads
// unsequenced, dropping the report if one waits already.
type pendingReads struct {
	receipts.Store
	pending chan<- struct{}
}

func (p pendingReads) GetReceipt(ctx context.Context, id string) (*receipts.Stored, error) {
	s, err := p.Store.GetReceipt(ctx, id)
	if err == nil && !s.Sequenced {
		select {
		case p.pending <- struct{}{}:
		default:
		}
	}
	return s, err
}

func testConcurrent(t *testing.T, newStore func(t *testing.T) receipts.Store) {
	const minters, each = 8, 40
	f := newFixture(t, newStore)
	ctx, cancel := context.WithCancel(f.ctx)
	var seqs sync.WaitGroup
	for range 2 {
		q := f.sequencer(f.store, 16)
		seqs.Add(1)
		go func() {
			defer seqs.Done()
			q.Run(ctx)
		}()
	}
	var wg sync.WaitGroup
	ids := make(chan string, minters*each)
	for m := range minters {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range each {
				s, err := f.log.Mint(f.ctx, Sample(m*each+i))
				if err != nil {
					t.Error(err)
					return
				}
				ids <- s.ID
			}
		}()
	}
	wg.Wait()
	close(ids)
	var all []string
	for id := range ids {
		all = append(all, id)
	}
	awaitCtx, awaitCancel := context.WithTimeout(f.ctx, 60*time.Second)
	defer awaitCancel()
	got, proofs, cp, err := f.log.Await(awaitCtx, all...)
	cancel()
	seqs.Wait()
	if err != nil {
		t.Fatalf("Await: %v", err)
	}
	if cp.Size != minters*each {
		t.Fatalf("checkpoint of %d, want %d", cp.Size, minters*each)
	}
	seen := make(map[int64]string)
	for i, s := range got {
		if prev, dup := seen[s.Index]; dup {
			t.Errorf("index %d given to %s and %s", s.Index, prev, s.ID)
		}
		seen[s.Index] = s.ID
		if _, err := receipts.Verify(f.vkey, Origin, s.Body, proofs[i], cp.Note); err != nil {
			t.Errorf("receipt %s: %v", s.ID, err)
		}
	}
	for i := range int64(minters * each) {
		if _, ok := seen[i]; !ok {
			t.Errorf("no receipt at index %d", i)
		}
	}
}

// testLimits: callers always pass a limit of at least 1, and a Store
// refuses one of 0 or less rather than guess what it means, without
// sequencing anything.
func testLimits(t *testing.T, newStore func(t *testing.T) receipts.Store) {
	f := newFixture(t, newStore)
	f.mint(3)
	f.sequence(f.sequencer(f.store, 2), 2)
	f.mint(2)
	for _, limit := range []int{0, -1, -1000} {
		ss, err := f.store.ListReceipts(f.ctx, 0, limit)
		if !errors.Is(err, receipts.ErrInvalidArgument) || len(ss) != 0 {
			t.Errorf("ListReceipts(0, %d) = %d receipts, %v; want ErrInvalidArgument", limit, len(ss), err)
		}
		called := false
		err = f.store.Sequence(f.ctx, limit, func(tr receipts.Tree, p []*receipts.Stored, r tlog.HashReader) (*receipts.Batch, error) {
			called = true
			return nil, errors.New("integrate called")
		})
		if !errors.Is(err, receipts.ErrInvalidArgument) || called {
			t.Errorf("Sequence(%d): err = %v, integrate called = %v; want ErrInvalidArgument, not called", limit, err, called)
		}
	}
	if got := f.tree(); got.Size != 2 {
		t.Errorf("tree of %d after refused calls, want 2", got.Size)
	}
	for limit, want := range map[int]int{1: 1, 2: 2, 3: 2, 1 << 30: 2} {
		ss, err := f.store.ListReceipts(f.ctx, 0, limit)
		if err != nil || len(ss) != want {
			t.Errorf("ListReceipts(0, %d) = %d receipts, %v; want %d", limit, len(ss), err, want)
		}
	}
	// The Log never passes the store a limit below 1.
	for _, limit := range []int{0, -1} {
		if ss, err := f.log.List(f.ctx, 0, limit); err != nil || len(ss) != 2 {
			t.Errorf("Log.List(0, %d) = %d receipts, %v; want 2", limit, len(ss), err)
		}
	}
	// A batch of one takes the oldest pending receipt only.
	called := 0
	err := f.store.Sequence(f.ctx, 1, func(tr receipts.Tree, p []*receipts.Stored, r tlog.HashReader) (*receipts.Batch, error) {
		called = len(p)
		return nil, nil
	})
	if !errors.Is(err, receipts.ErrConflict) || called != 1 {
		t.Errorf("Sequence(1) handed integrate %d receipts (err %v), want 1 (and ErrConflict for no batch)", called, err)
	}
}

// testIDsAreBytes: receipt ids a caller chooses are compared as bytes, so
// ids that a case-insensitive, accent-insensitive or PAD SPACE collation
// would take for one are distinct receipts, each with its own body and
// index.
func testIDsAreBytes(t *testing.T, newStore func(t *testing.T) receipts.Store) {
	f := newFixture(t, newStore)
	ids := []string{"rcp_Case", "rcp_case", "RCP_CASE", "rcp_é", "rcp_e\u0301", "rcp_É", "rcp_ä", "rcp_a", "rcp_a ",
		"квитанция-1", "КВИТАНЦИЯ-1", "收据-1", "🧾-1"}
	minted := make(map[string]*receipts.Stored)
	for i, id := range ids {
		r := Sample(i)
		r.ID = id
		s, err := f.log.Mint(f.ctx, r)
		if err != nil {
			t.Fatalf("Mint with id %q: %v", id, err)
		}
		if s.ID != id {
			t.Fatalf("Mint with id %q stored id %q", id, s.ID)
		}
		minted[id] = s
	}
	for i, id := range ids {
		got := f.get(id)
		if d := cmp.Diff(minted[id], got); d != "" {
			t.Fatalf("GetReceipt(%q) (-minted +stored):\n%s", id, d)
		}
		dup := Sample(i + 1)
		dup.ID = id
		if _, err := f.log.Mint(f.ctx, dup); !errors.Is(err, receipts.ErrConflict) {
			t.Fatalf("Mint with the taken id %q: err = %v, want ErrConflict", id, err)
		}
	}
	for _, id := range []string{"rcp_CASE", "Rcp_case", "rcp_a  ", " rcp_a", "rcp_E\u0301", "квитанция-1 "} {
		if _, err := f.store.GetReceipt(f.ctx, id); !errors.Is(err, receipts.ErrNotFound) {
			t.Fatalf("GetReceipt(%q), an id never minted: err = %v, want ErrNotFound", id, err)
		}
	}
	f.sequence(f.sequencer(f.store, 100), len(ids))
	seen := make(map[int64]string)
	for _, id := range ids {
		s, p, cp, err := f.log.Prove(f.ctx, id)
		if err != nil {
			t.Fatalf("Prove(%q): %v", id, err)
		}
		if other, dup := seen[s.Index]; dup {
			t.Fatalf("receipts %q and %q both have index %d", other, id, s.Index)
		}
		seen[s.Index] = id
		if r, err := receipts.Verify(f.vkey, Origin, s.Body, p, cp.Note); err != nil || r.ID != id {
			t.Fatalf("Verify(%q) = receipt %v, %v", id, r, err)
		}
	}
	// Ids no store could hold are refused, and are no receipt's.
	bad := Sample(0)
	bad.ID = "rcp_\x00"
	if _, err := f.log.Mint(f.ctx, bad); !errors.Is(err, receipts.ErrInvalidArgument) {
		t.Errorf("Mint with an id holding NUL: err = %v, want ErrInvalidArgument", err)
	}
	for _, id := range []string{"rcp_\x00", "rcp_\xff"} {
		if _, err := f.log.Get(f.ctx, id); !errors.Is(err, receipts.ErrNotFound) {
			t.Errorf("Log.Get(%q) err = %v, want ErrNotFound", id, err)
		}
		if _, _, _, err := f.log.Prove(f.ctx, id); !errors.Is(err, receipts.ErrNotFound) {
			t.Errorf("Log.Prove(%q) err = %v, want ErrNotFound", id, err)
		}
	}
}

// testBodiesRoundTrip: a receipt's body comes back byte for byte, free
// text and all, and decodes to the receipt minted; so does a checkpoint's
// note.
func testBodiesRoundTrip(t *testing.T, newStore func(t *testing.T) receipts.Store) {
	f := newFixture(t, newStore)
	texts := []string{
		"  leading and trailing space  ",
		"e\u0301 and \u00e9: decomposed and precomposed",
		"tab\t, newline\n, \r\n, quote \", backslash \\, 100% _wild_",
		"🚀 zero\u200bwidth \ufeff BOM, \u2028 line separator",
		"<script>&amp;</script>; DROP TABLE nodelane_receipts; --",
	}
	var minted []*receipts.Stored
	for i, text := range texts {
		r := Sample(2) // an envelope activation: actor and reason are free text
		r.Actor, r.Reason = text, text+text
		r.PolicyVersion = int64(i + 1)
		s, err := f.log.Mint(f.ctx, r)
		if err != nil {
			t.Fatalf("Mint with text %q: %v", text, err)
		}
		minted = append(minted, s)
	}
	f.sequence(f.sequencer(f.store, 100), len(texts))
	listed, err := f.store.ListReceipts(f.ctx, 0, len(texts))
	if err != nil || len(listed) != len(texts) {
		t.Fatalf("ListReceipts = %d receipts, %v", len(listed), err)
	}
	for i, s := range minted {
		got := f.get(s.ID)
		if !bytes.Equal(got.Body, s.Body) || !bytes.Equal(listed[i].Body, s.Body) {
			t.Fatalf("receipt %d: body\n%q\ncame back as\n%q\nand listed as\n%q", i, s.Body, got.Body, listed[i].Body)
		}
		r, err := got.Receipt()
		if err != nil || r.Actor != texts[i] || r.Reason != texts[i]+texts[i] {
			t.Fatalf("receipt %d decodes to actor %q, reason %q (%v); want %q", i, r.Actor, r.Reason, err, texts[i])
		}
	}
	cp := f.checkpoint()
	if cp == nil {
		t.Fatal("no checkpoint")
	}
	want, err := receipts.SignCheckpoint(f.signer, Origin, cp.Tree())
	if err != nil {
		t.Fatal(err)
	}
	// Ed25519 signatures are deterministic: the note signed again is the
	// note the Sequencer stored.
	if !bytes.Equal(cp.Note, want.Note) {
		t.Fatalf("checkpoint note\n%q\ncame back as\n%q", want.Note, cp.Note)
	}
	if _, err := receipts.OpenCheckpoint(cp.Note, f.vkey, Origin); err != nil {
		t.Fatalf("the stored checkpoint note does not open: %v", err)
	}
}
