package workerapi

import (
	"context"
	"errors"
	"sync"
	"time"
)

// ErrStarted is returned by Start on a Server that was started before.
var ErrStarted = errors.New("workerapi: server already started")

// lifecycle is the Server's background work between Start and Stop.
type lifecycle struct {
	mu      sync.Mutex
	started bool
	cancel  context.CancelFunc // ends the maintainer
	stopped chan struct{}      // closed by Stop: hooks deliver what is queued
	endHook context.CancelFunc // ends the hooks' context
	stopCtx func() bool        // unregisters the AfterFunc on Start's ctx
	once    sync.Once
	done    sync.WaitGroup
}

// running reports whether the background work runs: Start was called,
// and neither Stop nor the end of Start's context stopped it.
func (lc *lifecycle) running() bool {
	lc.mu.Lock()
	defer lc.mu.Unlock()
	if !lc.started || lc.cancel == nil {
		return false
	}
	select {
	case <-lc.stopped:
		return false
	default:
		return true
	}
}

// stop closes stopped once, whoever calls it first: Stop or the end of
// Start's context.
func (lc *lifecycle) stop(stopped chan struct{}) {
	lc.once.Do(func() { close(stopped) })
}

// Start starts the Server's background work and returns at once:
//   - the maintainer, every Config.MaintainInterval: it expires leases,
//     records the end of timed activations (with their receipts), collects
//     expired nonces, forgets expired answers (answers.go), deletes the
//     jobs past Config.Lease.Retention (when set), every
//     Config.Artifacts.SweepInterval sweeps the artifact store
//     (SweepArtifacts), and sequences receipts and
//     signs checkpoints
//     continuously. It is safe to run on every replica at once: each step
//     is conditional on what it read, and the sequencer is one at a time
//     across replicas. The same checks also run lazily where a request
//     needs them, so requests are correct without it, only slower to see
//     expiries and proofs;
//   - with Stores.Clock, the clock check (CheckClock), at once and then
//     every Config.ClockCheckInterval: until the first succeeds, and while
//     the clock is more than Config.MaxClockSkew off the database's, the
//     maintainer's expiries and collections and Lease's expiry sweeps are
//     held (sequencing goes on: it reads no clock) and Ready reports not
//     ready;
//   - the delivery of events to Config.Hooks.
//
// Before anything it runs CheckSecrets, and returns its error: a replica
// whose secrets differ from the database's does not start.
//
// The work runs until Stop is called or ctx ends. Start may be called
// once; a second call returns ErrStarted. Call Stop before the stores
// close, even when ctx ended, to wait for the work to end.
func (s *Server) Start(ctx context.Context) error {
	if err := s.CheckSecrets(ctx); err != nil {
		return err
	}
	lc := &s.life
	lc.mu.Lock()
	defer lc.mu.Unlock()
	if lc.started {
		return ErrStarted
	}
	lc.started = true
	mctx, cancel := context.WithCancel(ctx)
	hctx, endHook := context.WithCancel(context.WithoutCancel(ctx))
	lc.cancel, lc.endHook, lc.stopped = cancel, endHook, make(chan struct{})
	if s.st.Clock != nil {
		// The clock-bound work waits for the clock's first measurement.
		s.clock.mu.Lock()
		s.clock.held.Store(!s.clock.measured || s.clock.held.Load())
		s.clock.mu.Unlock()
	}
	lc.done.Add(4)
	go func() {
		defer lc.done.Done()
		s.seq.Run(mctx)
	}()
	go func() {
		defer lc.done.Done()
		if s.st.Clock != nil {
			s.watchClock(mctx)
		}
	}()
	go func() {
		defer lc.done.Done()
		s.maintain(mctx)
	}()
	go func() {
		defer lc.done.Done()
		s.hooks.run(hctx, lc.stopped)
	}()
	// The end of ctx stops the work as Stop does, but waits for nothing.
	stopped := lc.stopped
	lc.stopCtx = context.AfterFunc(ctx, func() { lc.stop(stopped) })
	return nil
}

// Stop stops the background work that Start started and waits for it to
// end: the maintainer stops after its current step; events already queued
// for Hooks are delivered, and later ones are dropped. If ctx ends first,
// the context the hooks were given is cancelled and Stop returns ctx's
// error without waiting further (a hook that ignores its context keeps
// its goroutine until it returns). Stop on a Server that was never
// started, or a second time, returns nil.
func (s *Server) Stop(ctx context.Context) error {
	lc := &s.life
	lc.mu.Lock()
	if !lc.started || lc.cancel == nil {
		lc.mu.Unlock()
		return nil
	}
	cancel, endHook, stopped := lc.cancel, lc.endHook, lc.stopped
	lc.cancel = nil // a second Stop returns at once
	lc.mu.Unlock()

	lc.stopCtx()
	s.hooks.close()
	cancel()
	lc.stop(stopped)
	done := make(chan struct{})
	go func() {
		lc.done.Wait()
		close(done)
	}()
	defer endHook()
	select {
	case <-done:
		return nil
	case <-ctx.Done():
		endHook()
		return ctx.Err()
	}
}

// maintain runs MaintainOnce every Config.MaintainInterval until ctx ends.
func (s *Server) maintain(ctx context.Context) {
	t := time.NewTicker(s.cfg.MaintainInterval)
	defer t.Stop()
	for {
		switch err := s.MaintainOnce(ctx); {
		case errors.Is(err, ErrNotReady):
			// The clock is off the database's: CheckClock said so.
		case err != nil && ctx.Err() == nil:
			s.maintOutage.fail(err)
		case err == nil:
			s.maintOutage.ok()
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}
