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
// run gets the items in queue order and returns a result for each, or an
// error for the whole batch, which every caller in it then gets. run gets
// the context of the caller that runs the batch, without its
// cancellation: the others' writes must not fail because that caller went
// away.
type batcher[T, R any] struct {
	max      int
	parallel int
	wait     time.Duration
	run      func(ctx context.Context, items []T) ([]R, error)

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
	return &batcher[T, R]{max: size, parallel: max(parallel, 1), wait: wait, run: run, full: make(chan struct{}, 1)}
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
	if b.gathering || b.running >= b.parallel {
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
	// c leads: it is first in the queue.
	if b.wait > 0 && b.last.Load() > 1 {
		t := time.NewTimer(b.wait)
		select {
		case <-t.C:
		case <-b.full:
		}
		t.Stop()
	}
	b.mu.Lock()
	n := min(len(b.queue), b.max)
	batch := make([]*batchCall[T, R], n)
	copy(batch, b.queue)
	b.queue = b.queue[n:]
	b.gathering = false
	b.promote()
	b.mu.Unlock()

	b.last.Store(int64(n))
	items := make([]T, n)
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
	b.promote()
	b.mu.Unlock()
	return c.res, c.err
}

// promote makes the first queued call lead the next batch, if calls queue,
// none gathers, and another batch may run. b.mu is held.
func (b *batcher[T, R]) promote() {
	if len(b.queue) == 0 || b.gathering || b.running >= b.parallel {
		return
	}
	b.running++
	b.gathering = true
	next := b.queue[0]
	next.lead = true
	close(next.done)
}
