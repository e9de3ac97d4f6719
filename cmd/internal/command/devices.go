package command

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
)

// ErrNotEnoughGPUs is returned by Devices.Acquire for a request of more
// devices than there are.
var ErrNotEnoughGPUs = errors.New("command: not enough GPUs on this worker")

// Devices hands out GPU device ids (as written into
// CUDA_VISIBLE_DEVICES: "0", "1", or GPU UUIDs) to jobs without overlap.
// It is safe for concurrent use.
type Devices struct {
	all []string

	mu   sync.Mutex
	free map[string]bool
	// wake is closed, and replaced, whenever devices are released.
	wake chan struct{}
}

// NewDevices returns an allocator over ids, which must be distinct, not
// empty and hold no comma.
func NewDevices(ids []string) (*Devices, error) {
	d := &Devices{all: slices.Clone(ids), free: map[string]bool{}, wake: make(chan struct{})}
	for _, id := range ids {
		if id == "" || strings.ContainsAny(id, ",\x00") {
			return nil, fmt.Errorf("command: GPU device id %q is empty or holds a comma", id)
		}
		if d.free[id] {
			return nil, fmt.Errorf("command: GPU device id %q is given twice", id)
		}
		d.free[id] = true
	}
	return d, nil
}

// Len returns how many devices there are.
func (d *Devices) Len() int { return len(d.all) }

// Free returns how many devices are free now.
func (d *Devices) Free() int {
	d.mu.Lock()
	defer d.mu.Unlock()
	n := 0
	for _, f := range d.free {
		if f {
			n++
		}
	}
	return n
}

// Acquire takes n free devices, in the order they were given, waiting
// until enough are free or ctx ends (then it returns context.Cause(ctx)).
// n over Len is ErrNotEnoughGPUs at once. Acquire(ctx, 0) takes none.
// The caller gives them back with Release.
func (d *Devices) Acquire(ctx context.Context, n int) ([]string, error) {
	if n < 0 || n > len(d.all) {
		return nil, fmt.Errorf("%w: %d wanted, %d here", ErrNotEnoughGPUs, n, len(d.all))
	}
	for {
		d.mu.Lock()
		var got []string
		for _, id := range d.all {
			if len(got) == n {
				break
			}
			if d.free[id] {
				got = append(got, id)
			}
		}
		if len(got) == n {
			for _, id := range got {
				d.free[id] = false
			}
			d.mu.Unlock()
			return got, nil
		}
		wake := d.wake
		d.mu.Unlock()
		select {
		case <-ctx.Done():
			return nil, context.Cause(ctx)
		case <-wake:
		}
	}
}

// Release gives back devices Acquire returned.
func (d *Devices) Release(ids []string) {
	if len(ids) == 0 {
		return
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	for _, id := range ids {
		if _, ok := d.free[id]; ok {
			d.free[id] = true
		}
	}
	close(d.wake)
	d.wake = make(chan struct{})
}
