package bunstore

import (
	"context"
	"sync"
	"sync/atomic"
	"time"
)

// batcher gathers the writes of concurrent callers into one call of run,
// and so into one statement and one commit: group commit. A caller that
// finds no batch running runs one with whatever is pending (its own write
// first); callers that arrive meanwhile queue, and when the batch ends
// the first of them runs the next batch with all that queued by then, up
// to max. A batch runs at once when the previous one held a single write
// (light load: a lone write costs what a write costs); after one that
// gathered several, it first waits up to wait, or until max writes queue,
// for more to join.
//
// run gets the items in queue order and returns a result for each, or an
// error for the whole batch, which every caller in it then gets. run gets
// the context of the caller that runs the batch, without its
// cancellation: the others' writes must not fail because that caller went
// away.
type batcher[T, R any] struct {
	max  int
	wait time.Duration
	run  func(ctx context.Context, items []T) ([]R, error)

	// last is the size of the last batch run.
	last atomic.Int64
	// full holds a signal that the queue reached max.
	full chan struct{}

	mu      sync.Mutex
	running bool
	queue   []*batchCall[T, R]
}

type batchCall[T, R any] struct {
	item T
	res  R
	err  error
	// done is closed when res and err are set, or when lead is set: the
	// call is to run the next batch.
	done chan struct{}
	lead bool
}

func newBatcher[T, R any](max int, wait time.Duration, run func(ctx context.Context, items []T) ([]R, error)) *batcher[T, R] {
	return &batcher[T, R]{max: max, wait: wait, run: run, full: make(chan struct{}, 1)}
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
	if b.running {
		b.mu.Unlock()
		<-c.done
		if !c.lead {
			return c.res, c.err
		}
	} else {
		b.running = true
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
	if len(b.queue) > 0 {
		next := b.queue[0]
		next.lead = true
		close(next.done)
	} else {
		b.running = false
	}
	b.mu.Unlock()
	return c.res, c.err
}
