package bunstore

import (
	"context"
	"sync"
	"sync/atomic"
	"time"
)

// batcher gathers the writes of concurrent callers into one call of run,
// and so into one statement and one commit: group commit. A caller that
// finds no batch gathering, and fewer than parallel batches running,
// leads one: it gathers what queues behind it and runs that batch; a
// caller that finds a batch gathering, or parallel batches running,
// queues, and is taken by the gathering batch or leads the next one. A
// batch gathers for no time when the last one held a single write (light
// load: a lone write costs what a write costs); after one that gathered
// several, it waits up to wait, or until max writes queue, for more to
// join.
//
// With key set, the calls of one key never run in two batches at once:
// a batch takes its leader, then the calls queued behind it whose keys no
// other running batch holds, and a call whose key is held waits.
//
// run gets the items in queue order (the leader first) and returns a
// result for each, or an error for the whole batch, which every caller
// in it then gets. run gets the context of the caller that runs the
// batch, without its cancellation: the others' writes must not fail
// because that caller went away.
type batcher[T, R any] struct {
	max      int
	parallel int
	wait     time.Duration
	run      func(ctx context.Context, items []T) ([]R, error)
	// key, if set, names an item's key.
	key func(T) string

	// last is the size of the last batch run.
	last atomic.Int64
	// full holds a signal that the queue reached max.
	full chan struct{}

	mu sync.Mutex
	// running counts the batches gathering or running; gathering is
	// whether one of them is gathering, its leader first in queue.
	running   int
	gathering bool
	queue     []*batchCall[T, R]
	// held are the keys of the running batches.
	held map[string]bool
}

type batchCall[T, R any] struct {
	item T
	res  R
	err  error
	// done is closed when res and err are set, or when lead is set: the
	// call is to lead a batch.
	done chan struct{}
	lead bool
}

// newBatcher returns a batcher of at most size writes a batch and at most
// parallel batches at once.
func newBatcher[T, R any](size, parallel int, wait time.Duration, run func(ctx context.Context, items []T) ([]R, error)) *batcher[T, R] {
	return &batcher[T, R]{max: size, parallel: max(parallel, 1), wait: wait, run: run, full: make(chan struct{}, 1), held: map[string]bool{}}
}

// do queues item and returns its result once its batch ran.
func (b *batcher[T, R]) do(ctx context.Context, item T) (R, error) {
	c := &batchCall[T, R]{item: item, done: make(chan struct{})}
	b.mu.Lock()
	b.queue = append(b.queue, c)
	if len(b.queue) >= b.max {
		select {
		case b.full <- struct{}{}:
		default:
		}
	}
	if b.gathering || b.running >= b.parallel || b.isHeld(c) {
		b.mu.Unlock()
		<-c.done
		if !c.lead {
			return c.res, c.err
		}
	} else {
		b.running++
		b.gathering = true
		b.mu.Unlock()
	}
	// c leads.
	if b.wait > 0 && b.last.Load() > 1 {
		t := time.NewTimer(b.wait)
		select {
		case <-t.C:
		case <-b.full:
		}
		t.Stop()
	}
	b.mu.Lock()
	batch := b.take(c)
	b.gathering = false
	b.promote()
	b.mu.Unlock()

	b.last.Store(int64(len(batch)))
	items := make([]T, len(batch))
	for i, bc := range batch {
		items[i] = bc.item
	}
	res, err := b.run(context.WithoutCancel(ctx), items)
	for i, bc := range batch {
		if err != nil {
			bc.err = err
		} else {
			bc.res = res[i]
		}
		if bc != c {
			close(bc.done)
		}
	}

	b.mu.Lock()
	b.running--
	if b.key != nil {
		for _, bc := range batch {
			delete(b.held, b.key(bc.item))
		}
	}
	b.promote()
	b.mu.Unlock()
	return c.res, c.err
}

// take removes from the queue the batch that lead leads: lead, then the
// calls queued behind it, up to max, whose keys no other running batch
// holds; it holds the batch's keys. b.mu is held.
func (b *batcher[T, R]) take(lead *batchCall[T, R]) []*batchCall[T, R] {
	batch := []*batchCall[T, R]{lead}
	var mine map[string]bool
	if b.key != nil {
		mine = map[string]bool{b.key(lead.item): true}
	}
	rest := b.queue[:0]
	for _, bc := range b.queue {
		switch {
		case bc == lead:
		case len(batch) < b.max && (b.key == nil || mine[b.key(bc.item)] || !b.held[b.key(bc.item)]):
			batch = append(batch, bc)
			if b.key != nil {
				mine[b.key(bc.item)] = true
			}
		default:
			rest = append(rest, bc)
		}
	}
	clear(b.queue[len(rest):])
	b.queue = rest
	for k := range mine {
		b.held[k] = true
	}
	return batch
}

// isHeld reports whether c's key is held by a running batch. b.mu is
// held.
func (b *batcher[T, R]) isHeld(c *batchCall[T, R]) bool {
	return b.key != nil && b.held[b.key(c.item)]
}

// promote makes the first queued call whose key is not held lead the
// next batch, if none gathers and another batch may run. b.mu is held.
func (b *batcher[T, R]) promote() {
	if b.gathering || b.running >= b.parallel {
		return
	}
	for _, next := range b.queue {
		if !b.isHeld(next) {
			b.running++
			b.gathering = true
			next.lead = true
			close(next.done)
			return
		}
	}
}
