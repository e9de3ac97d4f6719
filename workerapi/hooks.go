package workerapi

import (
	"context"
	"log/slog"
	"time"

	"github.com/nodelane/nodelane/lease"
	"github.com/nodelane/nodelane/receipts"
)

// Hooks let a host react in Go to what happens, for example to put a
// trained adapter into its own model registry when a lora_train job
// succeeds, without polling its database. Hooks run after the request's
// transaction committed, on a goroutine of their own, one at a time in
// order: a hook that fails, panics or is slow never blocks or rolls back
// a request. If hooks fall more than 1,024 events behind, the newest are
// dropped and logged.
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
	Route  string
	Status int
	// Code is the error code, empty on success.
	Code     string
	Duration time.Duration
}

const hookQueue = 1024

// hookRunner delivers events to Hooks off the request path.
type hookRunner struct {
	hooks Hooks
	log   *slog.Logger
	q     chan func(Hooks)
}

func newHookRunner(h Hooks, log *slog.Logger) *hookRunner {
	r := &hookRunner{hooks: h, log: log}
	if h != nil {
		r.q = make(chan func(Hooks), hookQueue)
		go r.loop()
	}
	return r
}

func (r *hookRunner) loop() {
	for f := range r.q {
		r.call(f)
	}
}

func (r *hookRunner) call(f func(Hooks)) {
	defer func() {
		if p := recover(); p != nil {
			r.log.Error("hook panicked", "panic", p)
		}
	}()
	f(r.hooks)
}

// emit queues events without ever blocking.
func (r *hookRunner) emit(evs []func(Hooks)) {
	if r.hooks == nil {
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
