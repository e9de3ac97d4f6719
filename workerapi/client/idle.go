package client

import (
	"context"
	"errors"
	"fmt"
	"io"
	"sync/atomic"
	"time"
)

// errIdle is the cause of a streamed attempt's context when no byte moved
// for RequestTimeout.
var errIdle = errors.New("no byte moved for the request timeout")

// idleWatch bounds a streamed request by idleness rather than by its
// whole duration: its context is cancelled once no byte has moved, up or
// down, for d.
type idleWatch struct {
	d      time.Duration
	last   atomic.Int64 // time.Now().UnixNano() of the last progress
	timer  *time.Timer
	cancel context.CancelCauseFunc
}

// newIdleWatch returns a context derived from ctx that ends when w sees
// no progress for d, and w. Call w.stop when the request is done.
func newIdleWatch(ctx context.Context, d time.Duration) (context.Context, *idleWatch) {
	actx, cancel := context.WithCancelCause(ctx)
	w := &idleWatch{d: d, cancel: cancel}
	w.touch()
	w.timer = time.AfterFunc(d, w.fire)
	return actx, w
}

// fire cancels the context unless progress came since it was armed.
func (w *idleWatch) fire() {
	if left := w.d - time.Duration(time.Now().UnixNano()-w.last.Load()); left > 0 {
		w.timer.Reset(left)
		return
	}
	w.cancel(fmt.Errorf("client: %w (%v)", errIdle, w.d))
}

// touch records progress.
func (w *idleWatch) touch() { w.last.Store(time.Now().UnixNano()) }

// stop ends the watch and releases its context.
func (w *idleWatch) stop() {
	w.timer.Stop()
	w.cancel(context.Canceled)
}

// reader returns r, recording progress at each read.
func (w *idleWatch) reader(r io.Reader) io.Reader { return &idleReader{r: r, w: w} }

// readCloser returns rc, recording progress at each read.
func (w *idleWatch) readCloser(rc io.ReadCloser) io.ReadCloser {
	return struct {
		io.Reader
		io.Closer
	}{w.reader(rc), rc}
}

type idleReader struct {
	r io.Reader
	w *idleWatch
}

func (r *idleReader) Read(p []byte) (int, error) {
	n, err := r.r.Read(p)
	if n > 0 {
		r.w.touch()
	}
	return n, err
}
