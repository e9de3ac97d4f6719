package client

import (
	"context"
	"fmt"
	"sort"
	"time"

	"github.com/nodelane/nodelane/workerapi/wire"
)

// signaled stops, of the tasks listed, those the server says are lost and
// those whose cancel it says was requested: a heartbeat's answer and a
// signals answer alike.
func (w *Runner) signaled(listed map[string]*task, lost, cancel []string) {
	for _, id := range lost {
		if t := listed[id]; t != nil {
			t.lose()
		}
	}
	for _, id := range cancel {
		if t := listed[id]; t != nil {
			t.stop(ErrJobCanceled)
		}
	}
}

// drainRequested drains the worker at an operator's request (POST
// /operator/workers/{id}/drain), as Drain does.
func (w *Runner) drainRequested() {
	select {
	case <-w.drainCh:
		return
	default:
	}
	w.log.Info("an operator asked this worker to drain: draining")
	w.Drain()
}

// signalsRestartDelay is how long after its jobs change the signals
// long-poll asks again with the new list: well within the 2 s a signal may
// take, and it folds a busy worker's changes into one request.
const signalsRestartDelay = 250 * time.Millisecond

// signalsLoop keeps the control long-poll (POST /workers/signals) open
// until ctx ends, so that a cancel, a lost job, a drain request, a ban or
// a retirement reaches the worker within seconds, whatever the heartbeat
// interval: it names the jobs it holds and the cancels they already know
// of, and asks again at once whenever its jobs change. It acts on an
// answer as on a heartbeat's (signaled), drains on a drain request, stops
// the Runner on a credential refused for good (a ban), and backs off on
// other errors. It ends quietly against a server without the route.
func (w *Runner) signalsLoop(ctx context.Context) {
	failures := 0
	wait := w.cfg.SignalsWaitSeconds
	for ctx.Err() == nil {
		w.mu.Lock()
		listed := make(map[string]*task, len(w.jobs))
		ids := make([]string, 0, len(w.jobs))
		known := []string{}
		for id, t := range w.jobs {
			listed[id] = t
			ids = append(ids, id)
			if t.ctx.Err() != nil {
				// Stopped already: a cancel is no news.
				known = append(known, id)
			}
		}
		changed := w.changed
		w.mu.Unlock()
		sort.Strings(ids)
		sort.Strings(known)
		pctx, cancel := context.WithCancel(ctx)
		go func() {
			select {
			case <-changed:
				// The jobs changed: ask again with the new list, once the
				// changes of the next moment have folded into it (a busy
				// worker's jobs change often; one request covers them).
				t := time.NewTimer(signalsRestartDelay)
				defer t.Stop()
				select {
				case <-t.C:
					cancel()
				case <-pctx.Done():
				}
			case <-pctx.Done():
			}
		}()
		used := w.c.id.Token()
		w.log.Debug("signals long-poll", "jobs", len(ids), "wait_seconds", wait)
		resp, err := w.c.Signals(pctx, wire.SignalsRequest{
			WaitSeconds: &wait, CurrentJobs: ids, KnownCancels: known, Draining: w.isDrainingRequested(),
		})
		restarted := pctx.Err() != nil && ctx.Err() == nil
		cancel()
		switch {
		case err == nil:
			failures = 0
			// Only the tasks still held: a job that ended while the
			// request waited is no longer the server's either.
			w.mu.Lock()
			for id, t := range listed {
				if w.jobs[id] != t {
					delete(listed, id)
				}
			}
			w.mu.Unlock()
			w.signaled(listed, resp.LostJobs, resp.CancelJobs)
			if resp.Drain {
				w.setDrainRequested()
				w.drainRequested()
			}
			continue
		case ctx.Err() != nil:
			return
		case restarted:
			continue
		case IsCode(err, wire.CodeNotFound) || IsCode(err, wire.CodeMethodNotAllowed):
			w.log.Warn("the server has no signals route: cancels and drains arrive with heartbeats only", "err", err)
			return
		case IsCode(err, wire.CodeTokenExpired):
			if rerr := w.renew(ctx, used); rerr != nil {
				w.setFatal(fmt.Errorf("%w; renewing: %w", err, rerr))
				return
			}
			continue
		case isAuthFatal(err):
			w.setFatal(err)
			return
		}
		failures++
		w.log.Warn("signals long-poll failed", "err", err, "failures", failures)
		t := time.NewTimer(backoffDelay(time.Second, 15*time.Second, failures))
		select {
		case <-ctx.Done():
			t.Stop()
			return
		case <-t.C:
		}
	}
}

// isDrainingRequested reports whether the server said an operator asked
// this worker to drain.
func (w *Runner) isDrainingRequested() bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.drainAsked
}

func (w *Runner) setDrainRequested() {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.drainAsked = true
}
