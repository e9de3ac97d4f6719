package receipts_test

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"golang.org/x/mod/sumdb/note"
	"golang.org/x/mod/sumdb/tlog"

	"github.com/nodelane/nodelane/internal/waitfor"
	"github.com/nodelane/nodelane/receipts"
)

// counting is a Store that counts the calls a waiter for proofs or a
// Sequencer makes (Sequence's own reads, inside its transaction, are
// not counted), apart for those whose context is a Sequencer's
// (inRun), and can run a function once after a Sequence that committed.
type counting struct {
	receipts.Store
	waiters, sequencer tally

	mu            sync.Mutex
	afterSequence func()
}

type tally struct{ gets, latest, trees, reads, batches atomic.Int64 }

// inRun marks the context of a Sequencer's Run.
type inRun struct{}

func (c *counting) tally(ctx context.Context) *tally {
	if ctx.Value(inRun{}) != nil {
		return &c.sequencer
	}
	return &c.waiters
}

func (c *counting) GetReceipt(ctx context.Context, id string) (*receipts.Stored, error) {
	c.tally(ctx).gets.Add(1)
	return c.Store.GetReceipt(ctx, id)
}

func (c *counting) LatestCheckpoint(ctx context.Context) (*receipts.Checkpoint, error) {
	c.tally(ctx).latest.Add(1)
	return c.Store.LatestCheckpoint(ctx)
}

func (c *counting) Tree(ctx context.Context) (receipts.Tree, error) {
	c.tally(ctx).trees.Add(1)
	return c.Store.Tree(ctx)
}

func (c *counting) ReadHashes(ctx context.Context, indexes []int64) ([]tlog.Hash, error) {
	c.tally(ctx).reads.Add(1)
	return c.Store.ReadHashes(ctx, indexes)
}

func (c *counting) Sequence(ctx context.Context, limit int, integrate receipts.IntegrateFunc) error {
	c.tally(ctx).batches.Add(1)
	err := c.Store.Sequence(ctx, limit, integrate)
	c.mu.Lock()
	after := c.afterSequence
	c.afterSequence = nil
	c.mu.Unlock()
	if err == nil && after != nil {
		after()
	}
	return err
}

// counts is a snapshot of a tally.
type counts struct{ gets, latest, trees, reads, batches int64 }

func (t *tally) counts() counts {
	return counts{t.gets.Load(), t.latest.Load(), t.trees.Load(), t.reads.Load(), t.batches.Load()}
}

// counts are all the calls counted.
func (c *counting) counts() counts {
	return c.waiters.counts().plus(c.sequencer.counts())
}

func (a counts) plus(b counts) counts {
	return counts{a.gets + b.gets, a.latest + b.latest, a.trees + b.trees, a.reads + b.reads, a.batches + b.batches}
}

func (a counts) minus(b counts) counts {
	return counts{a.gets - b.gets, a.latest - b.latest, a.trees - b.trees, a.reads - b.reads, a.batches - b.batches}
}

// awaitFixture is a log in a MemoryStore, counted, with a Log and what
// a verifier needs; Sequencers are made by sequencer.
type awaitFixture struct {
	t      *testing.T
	ctx    context.Context
	mem    *receipts.MemoryStore
	store  *counting
	log    *receipts.Log
	signer note.Signer
	vkey   string
	minted int
}

func newAwaitFixture(t *testing.T) *awaitFixture {
	t.Helper()
	skey, vkey, err := receipts.GenerateKey(rand.Reader, origin)
	if err != nil {
		t.Fatal(err)
	}
	signer, err := note.NewSigner(skey)
	if err != nil {
		t.Fatal(err)
	}
	mem := receipts.NewMemoryStore()
	store := &counting{Store: mem}
	return &awaitFixture{
		t: t, ctx: context.Background(), mem: mem, store: store, signer: signer, vkey: vkey,
		log: receipts.NewLog(store, &receipts.Config{Origin: origin}),
	}
}

// sequencer returns a Sequencer over s with cfg, whose Origin it sets.
func (f *awaitFixture) sequencer(s receipts.Store, cfg receipts.Config) *receipts.Sequencer {
	f.t.Helper()
	cfg.Origin = origin
	q, err := receipts.NewSequencer(s, f.signer, &cfg)
	if err != nil {
		f.t.Fatal(err)
	}
	return q
}

// run runs q.Run, under a context marked inRun, until the test ends. On
// a log without a checkpoint it returns once Run published the empty
// log, so that the first batch a waiter wakes is the one it needs.
func (f *awaitFixture) run(q *receipts.Sequencer) {
	f.t.Helper()
	_, err := f.mem.LatestCheckpoint(f.ctx)
	first := errors.Is(err, receipts.ErrNotFound)
	ctx, cancel := context.WithCancel(context.WithValue(f.ctx, inRun{}, true))
	published := q.Published()
	done := make(chan struct{})
	go func() { defer close(done); q.Run(ctx) }()
	f.t.Cleanup(func() { cancel(); <-done })
	if !first {
		return
	}
	waitfor.Receive(f.t, "Run to publish the empty log", published)
}

// mint mints n receipts and returns their ids.
func (f *awaitFixture) mint(n int) []string {
	f.t.Helper()
	ids := make([]string, n)
	for i := range ids {
		s, err := f.log.Mint(f.ctx, receipts.Receipt{Kind: receipts.KindWorkerBanned, WorkerID: fmt.Sprintf("wrk_%d", f.minted), Reason: "await"})
		if err != nil {
			f.t.Fatal(err)
		}
		f.minted++
		ids[i] = s.ID
	}
	return ids
}

// verify checks that ss, ps and cp are ids' receipts with proofs that
// verify against the signed checkpoint.
func (f *awaitFixture) verify(t testing.TB, ids []string, ss []*receipts.Stored, ps []receipts.Proof, cp *receipts.Checkpoint) {
	t.Helper()
	if len(ss) != len(ids) || len(ps) != len(ids) || cp == nil {
		t.Fatalf("%d receipts, %d proofs and checkpoint %v for %d ids", len(ss), len(ps), cp, len(ids))
	}
	opened, err := receipts.OpenCheckpoint(cp.Note, f.vkey, origin)
	if err != nil {
		t.Fatalf("checkpoint: %v", err)
	}
	if opened.Size != cp.Size || opened.Root != cp.Root {
		t.Fatalf("the checkpoint says %d %x, its note %d %x", cp.Size, cp.Root, opened.Size, opened.Root)
	}
	for i, s := range ss {
		if s.ID != ids[i] || !s.Sequenced || ps[i].Index != s.Index {
			t.Errorf("receipt %d: %s sequenced %v at %d with a proof of %d, want %s", i, s.ID, s.Sequenced, s.Index, ps[i].Index, ids[i])
		}
		if _, err := receipts.Verify(f.vkey, origin, s.Body, ps[i], cp.Note); err != nil {
			t.Errorf("receipt %s: %v", s.ID, err)
		}
	}
}

// sameAsProveAll checks that what Await returned is what Log.ProveAll
// returns now, which must be against the same checkpoint.
func (f *awaitFixture) sameAsProveAll(t testing.TB, ids []string, ss []*receipts.Stored, ps []receipts.Proof, cp *receipts.Checkpoint) {
	t.Helper()
	wss, wps, wcp, err := f.log.ProveAll(f.ctx, ids...)
	if err != nil {
		t.Fatalf("ProveAll: %v", err)
	}
	if d := cmp.Diff(wcp, cp); d != "" {
		t.Errorf("checkpoint differs from ProveAll's (-ProveAll +Await):\n%s", d)
	}
	if d := cmp.Diff(wss, ss); d != "" {
		t.Errorf("receipts differ from ProveAll's (-ProveAll +Await):\n%s", d)
	}
	if d := cmp.Diff(wps, ps); d != "" {
		t.Errorf("proofs differ from ProveAll's (-ProveAll +Await):\n%s", d)
	}
}

// await runs q.Await with a generous deadline.
func await(q *receipts.Sequencer, ids []string) ([]*receipts.Stored, []receipts.Proof, *receipts.Checkpoint, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	return q.Await(ctx, ids...)
}

type awaitResult struct {
	ss  []*receipts.Stored
	ps  []receipts.Proof
	cp  *receipts.Checkpoint
	err error
}

// awaitAsync starts q.Await and returns once q holds the waiter.
func (f *awaitFixture) awaitAsync(q *receipts.Sequencer, ids []string) <-chan awaitResult {
	f.t.Helper()
	before := receipts.Waiting(q)
	out := make(chan awaitResult, 1)
	go func() {
		ss, ps, cp, err := await(q, ids)
		out <- awaitResult{ss, ps, cp, err}
	}()
	waitfor.Until(f.t, "the waiter to register", func() bool { return receipts.Waiting(q) > before })
	return out
}

func receive(t *testing.T, c <-chan awaitResult) awaitResult {
	t.Helper()
	return waitfor.Receive(t, "Await to return", c)
}

// TestAwaitInMemory checks that a waiter whose receipts one batch of the running
// Sequencer integrates gets the proofs ProveAll gives, against the one
// checkpoint, without reading a receipt or a stored hash from the store.
// A waiter for receipts sequenced before it came gets them from the
// store.
func TestAwaitInMemory(t *testing.T) {
	t.Parallel()
	f := newAwaitFixture(t)
	q := f.sequencer(f.store, receipts.Config{Interval: time.Hour, AwaitPoll: time.Hour})
	f.run(q)
	var first []string
	for round, n := range []int{1, 2, 3, 5, 1, 8, 2, 7, 13} {
		ids := f.mint(n)
		if round == 0 {
			first = ids
		}
		before := f.store.counts()
		ss, ps, cp, err := await(q, ids)
		if err != nil {
			t.Fatalf("round %d: Await: %v", round, err)
		}
		if c := f.store.counts().minus(before); c.gets != 0 || c.reads != 0 {
			t.Errorf("round %d: Await read %d receipts and called ReadHashes %d times; want none", round, c.gets, c.reads)
		}
		if cp.Size != int64(f.minted) {
			t.Errorf("round %d: checkpoint of %d, want %d", round, cp.Size, f.minted)
		}
		f.verify(t, ids, ss, ps, cp)
		f.sameAsProveAll(t, ids, ss, ps, cp)
	}
	ids := append(first, first[0])
	ss, ps, cp, err := await(q, ids)
	if err != nil {
		t.Fatalf("Await for receipts sequenced before: %v", err)
	}
	f.verify(t, ids, ss, ps, cp)
	f.sameAsProveAll(t, ids, ss, ps, cp)
	if n := receipts.Waiting(q); n != 0 {
		t.Errorf("%d waiters left registered", n)
	}
}

// TestAwaitSplitBatches checks that a waiter whose receipts take several batches
// (BatchSize 2, five receipts) gets them in memory with the last batch.
func TestAwaitSplitBatches(t *testing.T) {
	t.Parallel()
	f := newAwaitFixture(t)
	q := f.sequencer(f.store, receipts.Config{BatchSize: 2, Interval: time.Hour, AwaitPoll: time.Hour})
	f.mint(3) // an older tree, whose hashes the proofs need too
	for range 2 {
		if _, err := q.Sequence(f.ctx); err != nil {
			t.Fatal(err)
		}
	}
	ids := f.mint(5)
	ids[1], ids[4] = ids[4], ids[1]
	res := f.awaitAsync(q, ids)
	before := f.store.counts()
	for range 3 {
		if _, err := q.Sequence(f.ctx); err != nil {
			t.Fatal(err)
		}
	}
	r := receive(t, res)
	if r.err != nil {
		t.Fatalf("Await: %v", r.err)
	}
	if c := f.store.counts().minus(before); c.gets != 0 {
		t.Errorf("the split waiter read %d receipts from the store; want none", c.gets)
	}
	f.verify(t, ids, r.ss, r.ps, r.cp)
	f.sameAsProveAll(t, ids, r.ss, r.ps, r.cp)
}

// TestAwaitAfterItsBatch checks that a waiter that comes after the batch that holds
// its receipts was published (it raced the caller) gets them from that
// batch, the Sequencer's last, at once; one whose receipts that batch
// and the next share gets them with the next, reading no receipt and
// the stored hashes of the older batch in one call.
func TestAwaitAfterItsBatch(t *testing.T) {
	t.Parallel()
	f := newAwaitFixture(t)
	q := f.sequencer(f.store, receipts.Config{Interval: time.Hour, AwaitPoll: time.Hour})
	f.mint(5)
	ids := f.mint(3)
	if _, err := q.Sequence(f.ctx); err != nil {
		t.Fatal(err)
	}
	before := f.store.counts()
	ss, ps, cp, err := await(q, ids) // no Sequence follows
	if err != nil {
		t.Fatalf("Await: %v", err)
	}
	if c := f.store.counts().minus(before); c != (counts{}) {
		t.Errorf("Await made store calls %+v; want none", c)
	}
	f.verify(t, ids, ss, ps, cp)
	f.sameAsProveAll(t, ids, ss, ps, cp)

	ids = append(ids, f.mint(2)...)
	res := f.awaitAsync(q, ids)
	before = f.store.counts()
	if _, err := q.Sequence(f.ctx); err != nil {
		t.Fatal(err)
	}
	r := receive(t, res)
	if r.err != nil {
		t.Fatalf("Await: %v", r.err)
	}
	if c := f.store.counts().minus(before); c.gets != 0 || c.reads != 1 {
		t.Errorf("Await read %d receipts and called ReadHashes %d times; want none and once", c.gets, c.reads)
	}
	f.verify(t, ids, r.ss, r.ps, r.cp)
	f.sameAsProveAll(t, ids, r.ss, r.ps, r.cp)
}

// TestAwaitConcurrent checks that many waiters, some with more receipts than a
// batch holds, over many batches of one Sequencer, or of two on one
// store (two replicas, the waiters on one), all get proofs that verify,
// and none stays registered.
func TestAwaitConcurrent(t *testing.T) {
	t.Parallel()
	for _, replicas := range []int{1, 2} {
		t.Run(fmt.Sprintf("sequencers=%d", replicas), func(t *testing.T) {
			t.Parallel()
			const waiters, rounds = 12, 8
			f := newAwaitFixture(t)
			// No poll: what the Sequencer delivers or tells is enough.
			q := f.sequencer(f.store, receipts.Config{BatchSize: 3, Interval: 5 * time.Millisecond, AwaitPoll: time.Hour})
			f.run(q)
			if replicas == 2 {
				f.run(f.sequencer(f.mem, receipts.Config{BatchSize: 3, Interval: 2 * time.Millisecond}))
			}
			var mu sync.Mutex // f.mint counts
			var wg sync.WaitGroup
			for w := range waiters {
				wg.Go(func() {
					for r := range rounds {
						mu.Lock()
						ids := f.mint(1 + (w+r)%5)
						mu.Unlock()
						ss, ps, cp, err := await(q, ids)
						if err != nil {
							t.Errorf("waiter %d round %d: %v", w, r, err)
							return
						}
						f.verify(t, ids, ss, ps, cp)
						for _, s := range ss {
							got, err := f.log.Get(f.ctx, s.ID)
							if err != nil {
								t.Error(err)
							} else if d := cmp.Diff(got, s); d != "" {
								t.Errorf("receipt %s differs from the store's (-store +Await):\n%s", s.ID, d)
							}
						}
					}
				})
			}
			wg.Wait()
			if n := receipts.Waiting(q); n != 0 {
				t.Errorf("%d waiters left registered", n)
			}
		})
	}
}

// TestAwaitContextEnds checks that, when ctx ends first, Await's error matches
// ErrNotSequenced and the cause, and the waiter is gone.
func TestAwaitContextEnds(t *testing.T) {
	t.Parallel()
	f := newAwaitFixture(t)
	q := f.sequencer(f.store, receipts.Config{})
	ids := f.mint(2)
	cause := errors.New("the client went away")
	for _, tc := range []struct {
		name string
		ctx  func() (context.Context, context.CancelFunc)
		want error
	}{
		{"deadline", func() (context.Context, context.CancelFunc) {
			return context.WithTimeout(f.ctx, 20*time.Millisecond)
		}, context.DeadlineExceeded},
		{"cancelled with a cause", func() (context.Context, context.CancelFunc) {
			ctx, cancel := context.WithCancelCause(f.ctx)
			time.AfterFunc(20*time.Millisecond, func() { cancel(cause) })
			return ctx, func() { cancel(nil) }
		}, cause},
		{"already cancelled", func() (context.Context, context.CancelFunc) {
			ctx, cancel := context.WithCancel(f.ctx)
			cancel()
			return ctx, cancel
		}, context.Canceled},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx, cancel := tc.ctx()
			defer cancel()
			_, _, _, err := q.Await(ctx, ids...)
			if !errors.Is(err, receipts.ErrNotSequenced) || !errors.Is(err, tc.want) {
				t.Errorf("err = %v, want ErrNotSequenced and %v", err, tc.want)
			}
			if n := receipts.Waiting(q); n != 0 {
				t.Errorf("%d waiters left registered", n)
			}
		})
	}
	// A result the Sequencer holds for no one is dropped: the receipts
	// are sequenced after their waiter left.
	if _, err := q.Sequence(f.ctx); err != nil {
		t.Fatal(err)
	}
	if n := receipts.Waiting(q); n != 0 {
		t.Errorf("%d waiters registered after Sequence", n)
	}
}

// TestAwaitUnknown checks that an id no receipt has is ErrNotFound, from the store,
// once the Sequencer found it in no batch.
func TestAwaitUnknown(t *testing.T) {
	t.Parallel()
	f := newAwaitFixture(t)
	q := f.sequencer(f.store, receipts.Config{Interval: time.Hour, AwaitPoll: time.Hour})
	f.run(q)
	ids := append(f.mint(1), "rcp_missing")
	if _, _, _, err := await(q, ids); !errors.Is(err, receipts.ErrNotFound) {
		t.Errorf("err = %v, want ErrNotFound", err)
	}
	if n := receipts.Waiting(q); n != 0 {
		t.Errorf("%d waiters left registered", n)
	}
}

// TestAwaitOtherSequencer checks that receipts another Sequencer on the same store
// sequenced (another replica's) reach the waiter from the store: when
// its own Sequencer's next batch does not have them, or at AwaitPoll.
func TestAwaitOtherSequencer(t *testing.T) {
	t.Parallel()
	t.Run("sequenced before the wait", func(t *testing.T) {
		f := newAwaitFixture(t)
		q := f.sequencer(f.store, receipts.Config{Interval: time.Hour, AwaitPoll: time.Hour})
		other := f.sequencer(f.mem, receipts.Config{})
		f.run(q)
		ids := f.mint(3)
		if _, err := other.Sequence(f.ctx); err != nil {
			t.Fatal(err)
		}
		ss, ps, cp, err := await(q, ids)
		if err != nil {
			t.Fatalf("Await: %v", err)
		}
		f.verify(t, ids, ss, ps, cp)
		f.sameAsProveAll(t, ids, ss, ps, cp)
	})
	t.Run("sequenced during the wait", func(t *testing.T) {
		f := newAwaitFixture(t)
		q := f.sequencer(f.store, receipts.Config{Interval: time.Hour, AwaitPoll: time.Hour})
		other := f.sequencer(f.mem, receipts.Config{})
		ids := f.mint(3)
		res := f.awaitAsync(q, ids)
		if _, err := other.Sequence(f.ctx); err != nil {
			t.Fatal(err)
		}
		// q's next batch, which Await's Wake asks for, finds nothing
		// pending: the waiter looks in the store.
		if n, err := q.Sequence(f.ctx); err != nil || n != 0 {
			t.Fatalf("Sequence = %d, %v; want 0, nil", n, err)
		}
		r := receive(t, res)
		if r.err != nil {
			t.Fatalf("Await: %v", r.err)
		}
		f.verify(t, ids, r.ss, r.ps, r.cp)
		f.sameAsProveAll(t, ids, r.ss, r.ps, r.cp)
	})
	t.Run("poll", func(t *testing.T) {
		f := newAwaitFixture(t)
		q := f.sequencer(f.store, receipts.Config{AwaitPoll: 5 * time.Millisecond})
		other := f.sequencer(f.mem, receipts.Config{})
		ids := f.mint(2)
		res := f.awaitAsync(q, ids) // q never sequences
		if _, err := other.Sequence(f.ctx); err != nil {
			t.Fatal(err)
		}
		r := receive(t, res)
		if r.err != nil {
			t.Fatalf("Await: %v", r.err)
		}
		f.verify(t, ids, r.ss, r.ps, r.cp)
		f.sameAsProveAll(t, ids, r.ss, r.ps, r.cp)
	})
}

// TestAwaitLargerCheckpoint checks that a batch published under a larger checkpoint
// (another Sequencer integrated and published between this one's batch
// and its publication) is proven from the store, against that
// checkpoint.
func TestAwaitLargerCheckpoint(t *testing.T) {
	t.Parallel()
	f := newAwaitFixture(t)
	q := f.sequencer(f.store, receipts.Config{BatchSize: 1, Interval: time.Hour, AwaitPoll: time.Hour})
	other := f.sequencer(f.mem, receipts.Config{})
	ids := f.mint(2)
	res := f.awaitAsync(q, ids[:1])
	f.store.mu.Lock()
	f.store.afterSequence = func() {
		if n, err := other.Sequence(f.ctx); err != nil || n != 1 {
			t.Errorf("the other Sequencer: %d, %v; want 1, nil", n, err)
		}
	}
	f.store.mu.Unlock()
	for range 2 { // the second finds nothing pending: the waiter looks
		if _, err := q.Sequence(f.ctx); err != nil {
			t.Fatal(err)
		}
	}
	r := receive(t, res)
	if r.err != nil {
		t.Fatalf("Await: %v", r.err)
	}
	if r.cp.Size != 2 {
		t.Errorf("checkpoint of %d, want 2", r.cp.Size)
	}
	f.verify(t, ids[:1], r.ss, r.ps, r.cp)
	f.sameAsProveAll(t, ids[:1], r.ss, r.ps, r.cp)
}

// TestProveAllReads checks that ProveAll reads each receipt, the checkpoint once,
// no tree, and every hash of its proofs in one call; its proofs are
// InclusionProof's.
func TestProveAllReads(t *testing.T) {
	t.Parallel()
	f := newAwaitFixture(t)
	q := f.sequencer(f.mem, receipts.Config{BatchSize: 7})
	ids := f.mint(45)
	for {
		n, err := q.Sequence(f.ctx)
		if err != nil {
			t.Fatal(err)
		}
		if n == 0 {
			break
		}
	}
	ids = []string{ids[0], ids[44], ids[17], ids[17], ids[31], ids[8]}
	before := f.store.counts()
	ss, ps, cp, err := f.log.ProveAll(f.ctx, ids...)
	if err != nil {
		t.Fatal(err)
	}
	want := counts{gets: int64(len(ids)), latest: 1, trees: 0, reads: 1}
	if got := f.store.counts().minus(before); got != want {
		t.Errorf("ProveAll of %d receipts: %+v, want %+v", len(ids), got, want)
	}
	f.verify(t, ids, ss, ps, cp)
	for i, s := range ss {
		p, err := f.log.InclusionProof(f.ctx, s.Index, cp.Size)
		if err != nil {
			t.Fatal(err)
		}
		if d := cmp.Diff(p, ps[i]); d != "" {
			t.Errorf("receipt %d: the proof differs from InclusionProof's (-InclusionProof +ProveAll):\n%s", i, d)
		}
	}
	// Prove is ProveAll of one.
	s, p, pcp, err := f.log.Prove(f.ctx, ids[1])
	if err != nil {
		t.Fatal(err)
	}
	if d := cmp.Diff([]any{ss[1], ps[1], cp}, []any{s, p, pcp}); d != "" {
		t.Errorf("Prove differs from ProveAll (-ProveAll +Prove):\n%s", d)
	}
}

// TestAwaitStoreCalls counts the store calls of 256 completions, each
// waiting for its two receipts with 16 at once, first as workerapi's
// awaitProofs did before Sequencer.Await (ProveAll again whenever this
// Sequencer publishes, and every 50 ms), with ProveAll as it was (a tree
// read and a hash read per receipt) and as it is, then with Await. It
// logs the calls per completion, and fails unless Await makes fewer.
func TestAwaitStoreCalls(t *testing.T) {
	t.Parallel()
	const workers, jobs = 16, 16
	modes := []struct {
		name  string
		await func(f *awaitFixture, q *receipts.Sequencer, ids []string) error
	}{
		{"ProveAll loop, ProveAll as it was", func(f *awaitFixture, q *receipts.Sequencer, ids []string) error {
			return loop(f, q, func(ctx context.Context) error { return oldProveAll(ctx, f.log, ids) })
		}},
		{"ProveAll loop", func(f *awaitFixture, q *receipts.Sequencer, ids []string) error {
			return loop(f, q, func(ctx context.Context) error {
				_, _, _, err := f.log.ProveAll(ctx, ids...)
				return err
			})
		}},
		{"Sequencer.Await", func(f *awaitFixture, q *receipts.Sequencer, ids []string) error {
			_, _, _, err := await(q, ids)
			return err
		}},
	}
	perJob := make([]float64, len(modes))
	for m, mode := range modes {
		f := newAwaitFixture(t)
		q := f.sequencer(f.store, receipts.Config{})
		f.run(q)
		var mu sync.Mutex
		var wg sync.WaitGroup
		wBefore, sBefore := f.store.waiters.counts(), f.store.sequencer.counts()
		for range workers {
			wg.Go(func() {
				for range jobs {
					mu.Lock()
					ids := f.mint(2)
					mu.Unlock()
					if err := mode.await(f, q, ids); err != nil {
						t.Errorf("%s: %v", mode.name, err)
						return
					}
				}
			})
		}
		wg.Wait()
		w, s := f.store.waiters.counts().minus(wBefore), f.store.sequencer.counts().minus(sBefore)
		per := func(n int64) float64 { return float64(n) / (workers * jobs) }
		// The proofs cost the waiters' calls, and the stored hashes the
		// Sequencer reads to deliver proofs; the rest is its batches'.
		perJob[m] = per(w.gets + w.reads + w.latest + w.trees + s.reads)
		t.Logf("%s: per completion, %.2f calls for its proofs: %.2f receipt reads, %.2f checkpoint reads, %.2f tree reads, %.2f hash reads (%.2f by the Sequencer)",
			mode.name, perJob[m], per(w.gets), per(w.latest), per(w.trees), per(w.reads+s.reads), per(s.reads))
		t.Logf("%s: per completion, %.3f batches, each with %.2f checkpoint and %.2f tree reads to publish",
			mode.name, per(s.batches), float64(s.latest)/float64(s.batches), float64(s.trees)/float64(s.batches))
	}
	if last := perJob[len(perJob)-1]; last >= perJob[0] || last >= perJob[1] {
		t.Errorf("Await makes %.2f store calls per completion, the ProveAll loops %.2f and %.2f", last, perJob[0], perJob[1])
	}
}

// loop is workerapi's awaitProofs before Sequencer.Await: wake the
// Sequencer, then prove whenever it publishes and every 50 ms.
func loop(f *awaitFixture, q *receipts.Sequencer, prove func(context.Context) error) error {
	ctx, cancel := context.WithTimeout(f.ctx, 30*time.Second)
	defer cancel()
	q.Wake()
	for {
		published := q.Published()
		err := prove(ctx)
		if !errors.Is(err, receipts.ErrNotSequenced) {
			return err
		}
		t := time.NewTimer(50 * time.Millisecond)
		select {
		case <-published:
		case <-t.C:
		case <-ctx.Done():
			t.Stop()
			return err
		}
		t.Stop()
	}
}

// oldProveAll is Log.ProveAll as it was: each receipt, the checkpoint,
// then InclusionProof (a tree read and a hash read) for each receipt.
func oldProveAll(ctx context.Context, l *receipts.Log, ids []string) error {
	ss := make([]*receipts.Stored, len(ids))
	for i, id := range ids {
		s, err := l.Get(ctx, id)
		if err != nil {
			return err
		}
		ss[i] = s
	}
	cp, err := l.Checkpoint(ctx)
	if errors.Is(err, receipts.ErrNotFound) {
		return receipts.ErrNotSequenced
	}
	if err != nil {
		return err
	}
	for _, s := range ss {
		if !s.Sequenced || s.Index >= cp.Size {
			return receipts.ErrNotSequenced
		}
		if _, err := l.InclusionProof(ctx, s.Index, cp.Size); err != nil {
			return err
		}
	}
	return nil
}
