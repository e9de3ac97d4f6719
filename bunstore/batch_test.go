package bunstore

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/nodelane/nodelane/internal/waitfor"
)

// TestBatcher checks that every caller gets its own item's result, batches never
// exceed max, at most parallel run at once, concurrent callers share
// batches, a failed batch fails its callers only, and a batch runs even if
// the caller leading it went away.
func TestBatcher(t *testing.T) {
	t.Parallel()
	for _, parallel := range []int{1, 3} {
		t.Run(fmt.Sprintf("parallel=%d", parallel), func(t *testing.T) {
			t.Parallel()
			testBatcher(t, parallel)
		})
	}
}

func testBatcher(t *testing.T, parallel int) {
	const n, size = 200, 16
	errBatch := errors.New("batch failed")
	var (
		mu      sync.Mutex
		sizes   []int
		running int
		most    int // batches running at once, at most
		// release lets the batches finish: until then each holds its
		// place, so that callers queue behind them.
		release = make(chan struct{})
		free    = sync.OnceFunc(func() { close(release) })
	)
	defer free()
	b := newBatcher(size, parallel, time.Millisecond, func(ctx context.Context, items []int) ([]int, error) {
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		mu.Lock()
		running++
		most = max(most, running)
		mu.Unlock()
		<-release
		mu.Lock()
		running--
		sizes = append(sizes, len(items))
		mu.Unlock()
		out := make([]int, len(items))
		for i, v := range items {
			if v == 13 {
				return nil, errBatch
			}
			out[i] = 2 * v
		}
		return out, nil
	})
	canceled, cancel := context.WithCancel(context.Background())
	cancel()
	var wg sync.WaitGroup
	got := make([]int, n)
	errs := make([]error, n)
	for i := range n {
		wg.Go(func() {
			ctx := context.Background()
			if i%7 == 0 {
				ctx = canceled
			}
			got[i], errs[i] = b.do(ctx, i)
		})
	}
	// Every batch that may run runs, and a batch's worth of callers
	// queues behind them; then they all go.
	waitfor.Until(t, fmt.Sprintf("%d batches to run and %d callers to queue", parallel, size), func() bool {
		mu.Lock()
		r := running
		mu.Unlock()
		b.mu.Lock()
		defer b.mu.Unlock()
		return r == parallel && len(b.queue) >= size
	})
	free()
	wg.Wait()
	failed, total, shared := 0, 0, false
	for i := range n {
		switch {
		case errors.Is(errs[i], errBatch):
			failed++
		case errs[i] != nil:
			t.Errorf("item %d: %v", i, errs[i])
		case got[i] != 2*i:
			t.Errorf("item %d: got %d, want %d", i, got[i], 2*i)
		}
	}
	for _, s := range sizes {
		total += s
		if s > size {
			t.Errorf("a batch of %d, over %d", s, size)
		}
		shared = shared || s > 1
	}
	if errors.Is(errs[13], errBatch) == false || failed > size {
		t.Errorf("item 13: %v; %d callers failed, want those of its batch only", errs[13], failed)
	}
	if total+failed < n || !shared {
		t.Errorf("batches %v: %d items run, want %d, some batch shared", sizes, total+failed, n)
	}
	if most != parallel {
		t.Errorf("%d batches ran at once, want %d", most, parallel)
	}
}

// With a key, calls of one key never run in two batches at once, while
// calls of other keys run beside them; calls of a held key that queued
// together then run in one batch.
func TestBatcherKeys(t *testing.T) {
	t.Parallel()
	var mu sync.Mutex
	running := map[string]int{} // batches running that hold a key
	entered, release := make(chan []string, 3), make(chan struct{})
	b := newBatcher(16, 3, 0, func(ctx context.Context, items []string) ([]int, error) {
		keys := map[string]bool{}
		for _, k := range items {
			keys[k] = true
		}
		mu.Lock()
		for k := range keys {
			running[k]++
			if running[k] > 1 {
				t.Errorf("key %s runs in two batches at once", k)
			}
		}
		mu.Unlock()
		entered <- items
		<-release
		mu.Lock()
		for k := range keys {
			running[k]--
		}
		mu.Unlock()
		return make([]int, len(items)), nil
	})
	b.key = func(k string) string { return k }
	var wg sync.WaitGroup
	call := func(k string) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if _, err := b.do(context.Background(), k); err != nil {
				t.Error(err)
			}
		}()
	}
	call("a")
	if got := <-entered; len(got) != 1 || got[0] != "a" {
		t.Fatalf("first batch %v, want [a]", got)
	}
	// a is held: its calls queue; b's runs beside it.
	call("a")
	call("a")
	waitfor.Until(t, "two calls of a to queue", func() bool {
		b.mu.Lock()
		defer b.mu.Unlock()
		return len(b.queue) == 2
	})
	call("b")
	if got := <-entered; len(got) != 1 || got[0] != "b" {
		t.Fatalf("second batch %v, want [b]", got)
	}
	close(release)
	if got := <-entered; len(got) != 2 || got[0] != "a" || got[1] != "a" {
		t.Fatalf("third batch %v, want [a a]", got)
	}
	wg.Wait()
}
