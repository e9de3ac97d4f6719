package receipts

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"golang.org/x/mod/sumdb/tlog"
)

// A Sequencer delivers proofs to the callers of Await in memory: a batch
// it integrated knows its receipts, their indexes and every stored hash
// their proofs need (those the batch wrote, and those of the older
// tree's complete subtrees, which integrate read), so once the batch is
// published under a checkpoint of exactly its tree, the proofs of the
// receipts someone waits for cost the store nothing. Whatever it cannot
// deliver (receipts another Sequencer integrated, a batch published under
// a larger checkpoint) the waiter proves from the store with
// Log.ProveAll, when the Sequencer tells it to and at Config.AwaitPoll.

// waiter is a caller of Await.
type waiter struct {
	ids []string
	// got[i] is ids[i] as a published batch of this Sequencer gave it its
	// index, nil until then; left counts the nils.
	got  []*Stored
	left int
	// begun is how many Sequence calls had begun when the waiter came.
	begun uint64
	// out receives the proofs, once; look asks the waiter to look in the
	// store. Both hold one value, so the Sequencer never blocks on them.
	out  chan awaited
	look chan struct{}
}

// sealed is a batch of this Sequencer published under the checkpoint of
// its tree, cp.
type sealed struct {
	in   *integrated
	cp   *Checkpoint
	byID map[string]int // the index in in.pending of each id
}

// give gives w the receipts of b it waits for.
func (b *sealed) give(w *waiter) {
	for i, id := range w.ids {
		if k, ok := b.byID[id]; ok && w.got[i] == nil {
			s := *b.in.pending[k]
			s.Index, s.Sequenced = b.in.old+int64(k), true
			w.got[i] = &s
			w.left--
		}
	}
}

// awaited is what Await returns.
type awaited struct {
	ss []*Stored
	ps []Proof
	cp *Checkpoint
}

// tell asks w to look in the store, unless it was asked already.
func (w *waiter) tell() {
	select {
	case w.look <- struct{}{}:
	default:
	}
}

// Await returns the receipts ids with their inclusion proofs against one
// signed checkpoint, waiting as long as ctx allows for them to be
// sequenced and published. It registers the caller and, unless the
// Sequencer's last batch holds them all, wakes Run (see Wake); call it
// after the transaction that minted the receipts committed. The results are those Log.ProveAll returns for the
// checkpoint they are against, and come by one of three ways:
//
//   - in memory, at no cost to the store, when a batch of this
//     Sequencer holds the last of the ids and is published under a
//     checkpoint of exactly its tree (ids split over several batches
//     of this Sequencer are collected until then), or when the last such
//     batch, published before Await came, holds them all;
//   - from the store (Log.ProveAll), when this Sequencer, after a
//     Sequence that began after Await did and found every pending
//     receipt, still has not delivered them: they were sequenced before,
//     or by another Sequencer, or published under a larger checkpoint;
//   - from the store, every Config.AwaitPoll, whatever happens.
//
// Errors: those of Log.ProveAll other than ErrNotSequenced (ErrNotFound
// for an unknown id); when ctx ends first, an error matching both
// ErrNotSequenced and ctx's cause. Await leaves no registration behind.
func (q *Sequencer) Await(ctx context.Context, ids ...string) ([]*Stored, []Proof, *Checkpoint, error) {
	w, last := q.watch(ids)
	defer q.unwatch(w)
	if last != nil {
		// The batch before it came had them all (it raced the caller).
		q.deliver(ctx, last, []*waiter{w})
	} else {
		q.Wake()
	}
	poll := time.NewTimer(q.cfg.AwaitPoll)
	defer poll.Stop()
	for {
		select {
		case r := <-w.out: // before anything else
			return r.ss, r.ps, r.cp, nil
		default:
		}
		select {
		case r := <-w.out:
			return r.ss, r.ps, r.cp, nil
		case <-ctx.Done():
			return nil, nil, nil, fmt.Errorf("%w: %w", ErrNotSequenced, context.Cause(ctx))
		case <-w.look:
		case <-poll.C:
		}
		ss, ps, cp, err := q.log.proveAll(ctx, w.ids)
		if err != nil && ctx.Err() != nil {
			// The deadline, not the store, ended the wait.
			return nil, nil, nil, fmt.Errorf("%w: %w", ErrNotSequenced, context.Cause(ctx))
		}
		if !errors.Is(err, ErrNotSequenced) {
			return ss, ps, cp, err
		}
		poll.Reset(q.cfg.AwaitPoll)
	}
}

// watch registers a waiter for ids, and gives it what the last batch
// published has of them; if that is all of them, it returns that batch
// for the caller to deliver.
func (q *Sequencer) watch(ids []string) (*waiter, *sealed) {
	w := &waiter{
		ids: slices.Clone(ids), got: make([]*Stored, len(ids)), left: len(ids),
		out: make(chan awaited, 1), look: make(chan struct{}, 1),
	}
	if w.left == 0 {
		w.tell() // nothing to deliver: the store answers at once
	}
	q.mu.Lock()
	defer q.mu.Unlock()
	w.begun = q.begun
	q.waiters[w] = struct{}{}
	if q.last == nil || w.left == 0 {
		return w, nil
	}
	q.last.give(w)
	if w.left > 0 {
		return w, nil
	}
	return w, q.last
}

// unwatch removes w; a result delivered meanwhile is dropped.
func (q *Sequencer) unwatch(w *waiter) {
	q.mu.Lock()
	defer q.mu.Unlock()
	delete(q.waiters, w)
}

// begin counts a Sequence call that begins, and returns its number.
func (q *Sequencer) begin() uint64 {
	q.mu.Lock()
	defer q.mu.Unlock()
	q.begun++
	return q.begun
}

// settle runs after Sequence call number begun published cp; in is the
// batch it integrated (nil if none) and full whether it took as many
// receipts as a batch may hold. If cp is the checkpoint of in's tree, it
// gives in's receipts to the waiters of their ids, delivers the proofs of
// every waiter it completes, and keeps in for the waiters to come (see
// watch). It tells a waiter to look in the store when the Sequencer
// cannot deliver what it knows is sequenced: a completed waiter under
// another checkpoint, or an incomplete one after a Sequence that began
// after it came and found every pending receipt (those that committed
// before it came), so that its ids were sequenced before, or by another
// Sequencer.
func (q *Sequencer) settle(ctx context.Context, begun uint64, in *integrated, cp *Checkpoint, full bool) {
	var b *sealed
	// The same size and root: cp signs the tree in committed. (A Store
	// that retried may have committed another attempt, or none.)
	if in != nil && cp.Size == in.batch.Tree.Size && cp.Root == in.batch.Tree.Root {
		b = &sealed{in: in, cp: cp, byID: make(map[string]int, len(in.pending))}
		for i, s := range in.pending {
			b.byID[s.ID] = i
		}
	}
	q.mu.Lock()
	if b != nil && (q.last == nil || q.last.cp.Size < cp.Size) {
		q.last = b
	}
	var ready []*waiter
	for w := range q.waiters {
		if b != nil {
			b.give(w)
		}
		switch {
		case w.left == 0 && b != nil && len(w.ids) > 0:
			ready = append(ready, w)
		case w.left == 0 || (begun > w.begun && !full):
			w.tell()
		}
	}
	q.mu.Unlock()
	if len(ready) > 0 {
		q.deliver(ctx, b, ready)
	}
}

// deliver proves the receipts of the waiters ready in the tree of b,
// and hands each its result. The hashes come from b, and from the store,
// in one ReadHashes call, only for those below b that integrate did not
// read (those of receipts of older batches).
func (q *Sequencer) deliver(ctx context.Context, b *sealed, ready []*waiter) {
	in, cp := b.in, b.cp
	read := in.reader(in.batch.Tree, tlog.HashReaderFunc(func(xs []int64) ([]tlog.Hash, error) {
		return q.store.ReadHashes(ctx, xs)
	}))
	// A complete waiter's got never changes again: read it unlocked.
	var indexes []int64
	for _, w := range ready {
		for _, s := range w.got {
			indexes = append(indexes, s.Index)
		}
	}
	ps, err := proveRecords(cp.Size, indexes, read)
	q.mu.Lock()
	defer q.mu.Unlock()
	at := 0
	for _, w := range ready {
		end := min(at+len(w.got), len(ps))
		mine := ps[at:end:end]
		at = end
		if _, ok := q.waiters[w]; !ok {
			continue // gone
		}
		if err != nil {
			w.tell() // the store will answer
			continue
		}
		delete(q.waiters, w)
		r := awaited{ss: make([]*Stored, len(w.got)), ps: mine, cp: cloneCheckpoint(cp)}
		for i, s := range w.got {
			r.ss[i] = cloneStored(s)
		}
		w.out <- r
	}
}
