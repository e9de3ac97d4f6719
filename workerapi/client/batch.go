package client

import (
	"context"
	"errors"
	"net/http"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nodelane/nodelane/workerapi/wire"
)

// DefaultCompleteWindow is the default of RunnerConfig.CompleteWindow.
const DefaultCompleteWindow = 2 * time.Millisecond

// completer gathers the completions of jobs that finish close together
// into one batch request (Client.CompleteBatch): a completion waits at
// most window for others to join it, and a batch leaves at once when it
// is full. A lone completion is sent with Client.Complete. Each caller
// gets the answer Complete would have given it, so its retries (the
// task's persist) are unchanged. A server without the batch route
// (404 or 405) is remembered, and every completion is sent alone from
// then on.
type completer struct {
	c      *Client
	ctx    context.Context // the requests'; cancelled when the Runner ends
	window time.Duration
	single atomic.Bool // the server has no batch route

	mu      sync.Mutex
	pending []*completion
}

// completion is one job's completion waiting for its answer.
type completion struct {
	jobID string
	req   wire.CompleteRequest
	done  chan completed // buffered: the sender never blocks
}

type completed struct {
	out *wire.CompleteResponse
	err error
}

func newCompleter(ctx context.Context, c *Client, window time.Duration) *completer {
	return &completer{c: c, ctx: ctx, window: window}
}

// complete completes jobID as Client.Complete does, possibly in a batch
// with others. An answer from a batch has no Job (the batch answer does
// not repeat jobs); the rest is as Complete's.
func (q *completer) complete(ctx context.Context, jobID string, req wire.CompleteRequest) (*wire.CompleteResponse, error) {
	if q.single.Load() {
		return q.c.Complete(ctx, jobID, req)
	}
	p := &completion{jobID: jobID, req: req, done: make(chan completed, 1)}
	q.mu.Lock()
	q.pending = append(q.pending, p)
	switch len(q.pending) {
	case wire.MaxBatchComplete:
		batch := q.pending
		q.pending = nil
		go q.send(batch)
	case 1:
		// The first of a batch starts its window. A full batch leaves
		// before its timer fires; the timer then sends whatever gathered
		// since, early, which does no harm.
		time.AfterFunc(q.window, q.flush)
	}
	q.mu.Unlock()
	select {
	case r := <-p.done:
		return r.out, r.err
	case <-ctx.Done():
		return nil, context.Cause(ctx)
	}
}

// flush sends what is pending.
func (q *completer) flush() {
	q.mu.Lock()
	batch := q.pending
	q.pending = nil
	q.mu.Unlock()
	if len(batch) > 0 {
		q.send(batch)
	}
}

// send sends batch and answers each of its completions.
func (q *completer) send(batch []*completion) {
	if len(batch) == 1 || q.single.Load() {
		q.sendAlone(batch)
		return
	}
	req := wire.CompleteBatchRequest{Completions: make([]wire.Completion, len(batch))}
	for i, p := range batch {
		req.Completions[i] = wire.Completion{JobID: p.jobID, CompleteRequest: p.req}
	}
	resp, err := q.c.CompleteBatch(q.ctx, req)
	var ae *APIError
	switch {
	case errors.As(err, &ae) && (ae.Status == http.StatusNotFound || ae.Status == http.StatusMethodNotAllowed):
		// A server older than the batch route.
		if !q.single.Swap(true) {
			q.c.log.Info("the server has no batch complete: completing jobs one by one", "err", err)
		}
		q.sendAlone(batch)
		return
	case IsCode(err, wire.CodeInvalidRequest):
		// One completion makes the batch malformed (a field over its
		// limit, say): each alone gets its own answer.
		q.sendAlone(batch)
		return
	case err != nil:
		for _, p := range batch {
			p.done <- completed{err: err}
		}
		return
	}
	for i, p := range batch {
		r := &resp.Results[i]
		if err := CompletionError(r); err != nil {
			p.done <- completed{err: err}
			continue
		}
		d := r.Completed
		p.done <- completed{out: &wire.CompleteResponse{
			ActualMS: d.ActualMS, ActualHours: d.ActualHours, ActualCostUSD: d.ActualCostUSD, ReceiptID: d.ReceiptID,
			Receipts: d.Receipts, Proofs: d.Proofs, Checkpoint: d.Checkpoint,
		}}
	}
}

// sendAlone completes each of batch with its own request, at once.
func (q *completer) sendAlone(batch []*completion) {
	var wg sync.WaitGroup
	for _, p := range batch {
		wg.Go(func() {
			out, err := q.c.Complete(q.ctx, p.jobID, p.req)
			p.done <- completed{out: out, err: err}
		})
	}
	wg.Wait()
}
