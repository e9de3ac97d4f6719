package workerapi

import (
	"context"
	"log/slog"
	"sync"
	"time"

	"github.com/nodelane/nodelane/lease"
	"github.com/nodelane/nodelane/receipts"
)

// Hooks let a host react in Go to what happens, for example to put a
// trained adapter into its own model registry when a lora_train job
// succeeds, without polling its database. Hooks run after the request's
// transaction committed, on a goroutine that Server.Start starts, one at a
// time in order: a hook that fails, panics or is slow never blocks or
// rolls back a request. If hooks fall more than 1,024 events behind, the
// newest are dropped and logged. Server.Stop delivers what is queued, and
// ends the context hooks are given when its own context ends.
type Hooks interface {
	// JobChanged is called after a job's state changed.
	JobChanged(ctx context.Context, e JobEvent)
	// ReceiptMinted is called after a receipt was minted (it may not be
	// sequenced yet).
	ReceiptMinted(ctx context.Context, r receipts.Stored)
}

// JobEvent is a committed change of a job.
type JobEvent struct {
	// From is the state before the change ("" for a new job).
	From lease.State
	Job  lease.Job
	// Artifacts are the job's artifacts when it reached a terminal state.
	Artifacts []lease.Artifact
}

// Metrics observes requests, for a host's metrics system.
type Metrics interface {
	ObserveRequest(RequestInfo)
}

// RequestInfo describes one served request.
type RequestInfo struct {
	Method string
	// Route is the route's pattern, such as /workers/jobs/{id}/complete.
	Route string
	// Status is the HTTP status answered, or StatusClientClosedRequest
	// (499) when the request's context was canceled first: its client
	// hung up.
	Status int
	// Code is the error code, empty on success.
	Code     string
	Duration time.Duration
	// WorkerID is the worker of a signed request, or the {id} of an
	// operator route on a worker; empty otherwise.
	WorkerID string
	// JobIDs are the job of the route's path ({id}), or the jobs a lease
	// request was granted; empty otherwise.
	JobIDs []string
}

// ContextMetrics is an optional extension of Metrics: a Config.Metrics
// that implements it is called with ObserveRequestContext, and the
// request's context, instead of ObserveRequest, so that it can annotate
// what the context carries (workerapi/oteltrace sets the attributes of
// the request's span).
type ContextMetrics interface {
	ObserveRequestContext(ctx context.Context, ri RequestInfo)
}

// hookQueue is how many hook events wait for delivery before the newest
// are dropped.
const hookQueue = 1024

// hookEvent delivers one committed event to the host's Hooks.
type hookEvent func(ctx context.Context, h Hooks)

// hookRunner delivers events to Hooks off the request path, on the
// goroutine that Server.Start runs. Events emitted before Start wait in the
// queue; events emitted after Stop are dropped.
type hookRunner struct {
	hooks Hooks
	log   *slog.Logger
	q     chan hookEvent

	mu      sync.Mutex
	stopped bool
}

func newHookRunner(h Hooks, log *slog.Logger) *hookRunner {
	r := &hookRunner{hooks: h, log: log}
	if h != nil {
		r.q = make(chan hookEvent, hookQueue)
	}
	return r
}

// run delivers events until stop is closed, then delivers what is queued
// unless ctx ended, and returns. Hooks get ctx, which ends when Stop gives
// up waiting for them.
func (r *hookRunner) run(ctx context.Context, stop <-chan struct{}) {
	if r.hooks == nil {
		return
	}
	for {
		select {
		case f := <-r.q:
			r.call(ctx, f)
		case <-stop:
			for ctx.Err() == nil {
				select {
				case f := <-r.q:
					r.call(ctx, f)
				default:
					return
				}
			}
			return
		}
	}
}

func (r *hookRunner) call(ctx context.Context, f hookEvent) {
	defer func() {
		if p := recover(); p != nil {
			r.log.Error("hook panicked", "panic", p)
		}
	}()
	f(ctx, r.hooks)
}

// emit queues events without ever blocking.
func (r *hookRunner) emit(evs []hookEvent) {
	if r.hooks == nil || len(evs) == 0 {
		return
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.stopped {
		r.log.Warn("server stopped: hook events dropped", "events", len(evs))
		return
	}
	for _, f := range evs {
		select {
		case r.q <- f:
		default:
			r.log.Warn("hook queue full: event dropped")
		}
	}
}

// close makes every later emit drop its events.
func (r *hookRunner) close() {
	r.mu.Lock()
	r.stopped = true
	r.mu.Unlock()
}
