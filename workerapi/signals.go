package workerapi

import (
	"context"
	"net/http"
	"slices"
	"sync"
	"time"

	"github.com/nodelane/nodelane/credential"
	"github.com/nodelane/nodelane/lease"
	"github.com/nodelane/nodelane/workerapi/wire"
)

// Signals in seconds (PROTOCOL.md §5.18). A worker keeps POST
// /workers/signals open; an operator's cancel, ban, retirement or drain
// request, once committed, wakes that worker's signals long-poll (and its
// lease long-poll) through the Notifier, which looks again in a
// transaction of its own and answers. The wait holds no transaction.

// SignalNotifier is a Notifier that also carries signals for one worker:
// a cancel of a job it holds, its ban or retirement, an operator's drain
// request. A Server whose Stores.Notifier implements it wakes only the
// worker concerned, and a job dispatched wakes no signals long-poll.
// bunstore's Notifier and LocalNotifier implement it.
//
// With a Notifier that does not, the Server falls back on the Notifier
// alone: a signal calls Notify, and every signals long-poll looks again
// (one read) at each Notify, a job dispatched included: correct, and as
// fast, but every dispatch then costs a read per open signals long-poll.
type SignalNotifier interface {
	Notifier
	// NotifyWorker announces a signal for worker workerID, on every
	// replica. Called with a context that carries a transaction, it may
	// deliver only once that transaction commits; the Server calls it
	// after the commit.
	NotifyWorker(ctx context.Context, workerID string) error
	// SubscribeWorker returns a channel that receives after every
	// NotifyWorker of workerID (on any replica; several fold into one)
	// until cancel is called. A wake-up that may have missed
	// notifications (a listener reconnected) wakes it too.
	SubscribeWorker(workerID string) (ch <-chan struct{}, cancel func())
}

// subscribeSignals subscribes to the signals of worker id: its own
// channel with a SignalNotifier, else every Notify.
func (s *Server) subscribeSignals(id string) (<-chan struct{}, func()) {
	if sn, ok := s.st.Notifier.(SignalNotifier); ok {
		return sn.SubscribeWorker(id)
	}
	return s.st.Notifier.Subscribe()
}

// signalWorkers wakes the signals and lease long-polls of workers ids
// once the request commits (a note: an operator route's handler has
// committed its transaction when it returns), so that what they read when
// they look again is the committed change.
func (s *Server) signalWorkers(c *call, ids ...string) {
	if len(ids) == 0 {
		return
	}
	ids = slices.Clone(ids)
	c.note(func() {
		ctx := context.WithoutCancel(c.r.Context())
		sn, ok := s.st.Notifier.(SignalNotifier)
		if !ok {
			if err := s.st.Notifier.Notify(ctx); err != nil {
				s.log.Warn("waking the signals long-polls", "workers", ids, "err", err)
			}
			return
		}
		for _, id := range ids {
			if err := sn.NotifyWorker(ctx, id); err != nil {
				s.log.Warn("waking a worker's signals long-poll", "worker", id, "err", err)
			}
		}
	})
}

// checkGranted refuses, in the transaction of ctx, a worker whose
// principal was banned (a retirement bans it too) since the request's
// credential was verified: a long-poll that woke, and every claim, look
// again before they grant or answer.
func (s *Server) checkGranted(ctx context.Context, id string) error {
	banned, err := s.banned(ctx, id)
	if err != nil {
		return err
	}
	if banned {
		return credential.ErrBanned
	}
	return nil
}

// signals: POST /workers/signals. The first look runs in the request's
// transaction; if it finds nothing due and the worker asked to wait, the
// wait runs after the commit and holds no transaction: each wake-up looks
// again in a transaction of its own, until a signal is due or the wait
// ends.
func (s *Server) signals(ctx context.Context, c *call) (int, any, error) {
	var req wire.SignalsRequest
	if err := c.decode(&req); err != nil {
		return 0, nil, err
	}
	wait := 0
	if req.WaitSeconds != nil {
		if wait = *req.WaitSeconds; wait < 0 || wait > wire.MaxSignalsWaitSeconds {
			return 0, nil, invalid("wait_seconds must be 0 to %d", wire.MaxSignalsWaitSeconds)
		}
	}
	id := c.principal.ID
	d := time.Duration(wait) * time.Second
	var wake <-chan struct{}
	if d > 0 {
		if err := s.longPoll(c); err != nil {
			return 0, nil, err
		}
		// Subscribe before the first look, so that a signal committed
		// while it runs still wakes the wait.
		var cancel func()
		wake, cancel = s.subscribeSignals(id)
		c.cleanup(cancel)
	}
	out, due, err := s.signalsOnce(ctx, id, &req)
	if err != nil {
		return 0, nil, err
	}
	if due || d <= 0 {
		return http.StatusOK, out, nil
	}
	deadline := time.Now().Add(d)
	c.then = func(ctx context.Context) (int, any, error) {
		defer s.park()()
		timer := time.NewTimer(time.Until(deadline))
		defer timer.Stop()
		for {
			select {
			case <-ctx.Done():
				return 0, nil, context.Cause(ctx)
			case <-timer.C:
				out.ServerTime = s.now()
				return http.StatusOK, out, nil
			case <-wake:
			}
			var next *wire.SignalsResponse
			err := s.st.Tx.InTx(ctx, func(ctx context.Context) error {
				var err error
				next, due, err = s.signalsOnce(ctx, id, &req)
				return err
			})
			if err != nil {
				return 0, nil, err
			}
			if out = next; due {
				return http.StatusOK, out, nil
			}
		}
	}
	return http.StatusOK, out, nil
}

// signalsOnce looks once at the signals of worker id for req: whether it
// is banned (credential.ErrBanned), the drain request, and of the jobs of
// req.CurrentJobs those whose cancel was requested and those it no longer
// holds. due reports a signal the worker does not know of yet.
func (s *Server) signalsOnce(ctx context.Context, id string, req *wire.SignalsRequest) (out *wire.SignalsResponse, due bool, err error) {
	if err := s.checkGranted(ctx, id); err != nil {
		return nil, false, err
	}
	w, err := s.leases.Worker(ctx, id)
	if err != nil {
		return nil, false, err
	}
	out = &wire.SignalsResponse{CancelJobs: []string{}, LostJobs: []string{}, Drain: w.Drain != nil, ServerTime: s.now()}
	due = out.Drain != req.Draining
	if len(req.CurrentJobs) == 0 {
		return out, due, nil
	}
	// One read of the worker's live jobs, whatever current_jobs holds
	// (at most MaxLeasesPerWorker of them, and wire.MaxCurrentJobs ids).
	live, _, err := s.leases.List(ctx, lease.JobFilter{WorkerID: id, Limit: maxPage})
	if err != nil {
		return nil, false, err
	}
	held := make(map[string]*lease.Job, len(live))
	for _, j := range live {
		held[j.ID] = j
	}
	known := make(map[string]bool, len(req.KnownCancels))
	for _, jid := range req.KnownCancels {
		known[jid] = true
	}
	seen := make(map[string]bool, len(req.CurrentJobs))
	for _, jid := range req.CurrentJobs {
		if seen[jid] {
			continue
		}
		seen[jid] = true
		j, ok := held[jid]
		switch {
		case !ok:
			out.LostJobs = append(out.LostJobs, jid)
			due = true
		case j.CancelRequested:
			out.CancelJobs = append(out.CancelJobs, jid)
			if !known[jid] {
				due = true
			}
		}
	}
	return out, due, nil
}

// SignalNotifier for LocalNotifier.

// workerSubs are the subscribers of each worker's signals.
type workerSubs struct {
	mu   sync.Mutex
	subs map[string]map[chan struct{}]struct{}
}

func (w *workerSubs) subscribe(id string) (<-chan struct{}, func()) {
	ch := make(chan struct{}, 1)
	w.mu.Lock()
	if w.subs == nil {
		w.subs = map[string]map[chan struct{}]struct{}{}
	}
	m := w.subs[id]
	if m == nil {
		m = map[chan struct{}]struct{}{}
		w.subs[id] = m
	}
	m[ch] = struct{}{}
	w.mu.Unlock()
	return ch, func() {
		w.mu.Lock()
		defer w.mu.Unlock()
		if m := w.subs[id]; m != nil {
			delete(m, ch)
			if len(m) == 0 {
				delete(w.subs, id)
			}
		}
	}
}

func (w *workerSubs) wake(id string) {
	w.mu.Lock()
	defer w.mu.Unlock()
	for ch := range w.subs[id] {
		select {
		case ch <- struct{}{}:
		default: // a wake-up is already pending
		}
	}
}

// NotifyWorker implements SignalNotifier: it wakes the subscribers of
// workerID's signals at once (it does not wait for a transaction).
func (n *LocalNotifier) NotifyWorker(_ context.Context, workerID string) error {
	n.workers.wake(workerID)
	return nil
}

// SubscribeWorker implements SignalNotifier.
func (n *LocalNotifier) SubscribeWorker(workerID string) (<-chan struct{}, func()) {
	return n.workers.subscribe(workerID)
}
