package workerapi

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"sync"
	"sync/atomic"
	"time"
)

// DatabaseClock reads the database's clock, the one clock every replica
// of a Server follows. bunstore.DB implements it. DatabaseTime returns
// the database's current instant, in any zone.
type DatabaseClock interface {
	DatabaseTime(ctx context.Context) (time.Time, error)
}

// ErrNotReady is wrapped by the error of Server.Ready when the Server
// should get no traffic; the message says why.
var ErrNotReady = errors.New("workerapi: not ready")

// clockTimeout bounds one reading of the database's clock.
const clockTimeout = 5 * time.Second

// dbClock is what a Server knows of its clock against the database's
// (Stores.Clock): the offset its clock follows, and whether the skew is
// over Config.MaxClockSkew.
type dbClock struct {
	// offset is added to Config.Now: the database's clock minus this
	// host's, as last measured, in nanoseconds.
	offset atomic.Int64
	// held is set while the clock-bound work is held: before the first
	// measurement, and while the skew is over the bound.
	held atomic.Bool

	mu       sync.Mutex
	measured bool
	skew     time.Duration // this host's clock minus the database's
	failures *outage
}

// clockNow is the Server's clock: Config.Now plus the offset measured
// against the database (zero without Stores.Clock). Every decision the
// cores make on time (lease expiry, signature windows, nonce expiry,
// tokens, activations) reads it, so replicas whose own clocks disagree
// still decide by one clock.
func (s *Server) clockNow() time.Time {
	return s.cfg.Now().Add(time.Duration(s.clock.offset.Load()))
}

// clockHeld reports whether the work that needs a clock agreed with the
// database's is held: the maintainer's expiries and collections, and the
// lease expiry sweeps of Lease.
func (s *Server) clockHeld() bool { return s.clock.held.Load() }

// CheckClock measures the Server's clock (Config.Now) against the
// database's (Stores.Clock), as the background work of Start does at once
// and then every Config.ClockCheckInterval: the Server's clock follows the database's
// from then on, and while the two differ by more than Config.MaxClockSkew
// the maintainer's expiries and collections and Lease's expiry sweeps are
// held and Ready reports the Server not ready. The change into and out of
// that state is logged (an ERROR, then an INFO). A failed reading changes
// nothing and is returned. Without Stores.Clock it does nothing.
func (s *Server) CheckClock(ctx context.Context) error {
	if s.st.Clock == nil {
		return nil
	}
	ctx, cancel := context.WithTimeout(ctx, clockTimeout)
	defer cancel()
	before := s.cfg.Now()
	db, err := s.st.Clock.DatabaseTime(ctx)
	after := s.cfg.Now()
	c := &s.clock
	if err != nil {
		c.failures.fail(err)
		return fmt.Errorf("workerapi: read the database's clock: %w", err)
	}
	c.failures.ok()
	skew := before.Add(after.Sub(before) / 2).Sub(db)
	c.offset.Store(int64(-skew))
	over := skew > s.cfg.MaxClockSkew || skew < -s.cfg.MaxClockSkew
	c.mu.Lock()
	defer c.mu.Unlock()
	was, first := c.held.Load(), !c.measured
	c.measured, c.skew = true, skew
	c.held.Store(over)
	switch {
	case over && (first || !was):
		s.log.Error("clock skew against the database over the bound: this replica follows the database's clock, holds its maintainer and lease expiry sweeps, and reports not ready",
			"skew", skew.Round(time.Millisecond), "max", s.cfg.MaxClockSkew)
	case !over && was && !first:
		s.log.Info("clock skew against the database back within the bound: resuming", "skew", skew.Round(time.Millisecond), "max", s.cfg.MaxClockSkew)
	default:
		s.log.Debug("clock measured against the database", "skew", skew.Round(time.Millisecond))
	}
	return nil
}

// watchClock runs CheckClock at once and then every
// Config.ClockCheckInterval until ctx ends; every second, at most, while
// no reading has succeeded yet.
func (s *Server) watchClock(ctx context.Context) {
	for {
		s.CheckClock(ctx) // a failure is logged, once per outage, and changes nothing
		d := s.cfg.ClockCheckInterval
		s.clock.mu.Lock()
		if !s.clock.measured {
			d = min(d, time.Second)
		}
		s.clock.mu.Unlock()
		t := time.NewTimer(d)
		select {
		case <-ctx.Done():
			t.Stop()
			return
		case <-t.C:
		}
	}
}

// Ready reports whether the Server should receive traffic: nil, or an
// error wrapping ErrNotReady that says why. With Stores.Clock, a Server
// is not ready until its clock has been measured against the database's
// (Start, CheckClock), nor while the skew is over Config.MaxClockSkew.
func (s *Server) Ready() error {
	if s.st.Clock == nil {
		return nil
	}
	c := &s.clock
	c.mu.Lock()
	defer c.mu.Unlock()
	switch {
	case !c.measured:
		return fmt.Errorf("%w: the clock has not been measured against the database's yet", ErrNotReady)
	case c.held.Load():
		return fmt.Errorf("%w: the clock is %v off the database's, over the %v allowed", ErrNotReady, c.skew.Round(time.Millisecond), s.cfg.MaxClockSkew)
	}
	return nil
}

// readyTimeout bounds the database reads of one CheckReady.
const readyTimeout = 2 * time.Second

// CheckReady is Ready, and then asks the database, within 2 seconds:
// with Stores.Clock, it reads the database's clock, so that a database
// that does not answer makes the Server not ready at once (not at the
// next clock check); with Stores.Schema, it checks that every migration is
// applied. It returns nil or an error wrapping ErrNotReady that says why,
// in words fit for a probe's answer. ReadyHandler answers with it.
func (s *Server) CheckReady(ctx context.Context) error {
	if err := s.Ready(); err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, readyTimeout)
	defer cancel()
	if s.st.Clock != nil {
		if _, err := s.st.Clock.DatabaseTime(ctx); err != nil {
			s.log.Debug("readiness: the database did not answer", "err", err)
			return fmt.Errorf("%w: the database did not answer", ErrNotReady)
		}
	}
	if s.st.Schema != nil {
		if err := s.st.Schema.CheckMigrations(ctx); err != nil {
			s.log.Debug("readiness: the schema check failed", "err", err)
			return fmt.Errorf("%w: the database's schema is not this version's (are its migrations applied?)", ErrNotReady)
		}
	}
	return nil
}

// ReadyResponse is the body of ReadyHandler's answer.
type ReadyResponse struct {
	Ready bool `json:"ready"`
	// Reason says why the Server is not ready.
	Reason string `json:"reason,omitempty"`
}

// ReadyHandler answers a readiness probe (say, at /readyz) with CheckReady:
// 200 {"ready":true}, or 503 {"ready":false,"reason":"..."}. It needs no
// credential and tells nothing secret; it answers GET and HEAD only (405
// otherwise). It is not part of Handler: the host mounts it where its
// load balancer or orchestrator looks.
func (s *Server) ReadyHandler() http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method != http.MethodGet && r.Method != http.MethodHead {
			w.Header().Set("Allow", "GET, HEAD")
			http.Error(w, "method not allowed", http.StatusMethodNotAllowed)
			return
		}
		out, code := ReadyResponse{Ready: true}, http.StatusOK
		if err := s.CheckReady(r.Context()); err != nil {
			out, code = ReadyResponse{Reason: publicMessage(err.Error())}, http.StatusServiceUnavailable
		}
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("Cache-Control", "no-store")
		w.WriteHeader(code)
		if r.Method == http.MethodGet {
			json.NewEncoder(w).Encode(out)
		}
	})
}
