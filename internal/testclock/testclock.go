// Package testclock is the one fake clock of nodelane's tests. A fixed
// clock (New) reads only what the test sets, so that a test decides, to
// the nanosecond, what now is: the conformance suites give its Now to the
// Managers they drive, and move it to cross a TTL, a deadline or a window
// exactly. A following clock (Real) reads real time plus an offset, for
// end-to-end tests in which real timers run (long-polls, leases that a
// live worker renews) but a test still needs to jump ahead.
//
// It imports only the standard library, so that any package of the module,
// a conformance suite included, may use it.
package testclock

import (
	"sync"
	"time"
)

// Clock is a fake clock. It is safe for concurrent use: its Now may serve
// as the Now of a Config read by many goroutines while the test moves it.
// The zero Clock is fixed at the zero time.
type Clock struct {
	mu     sync.Mutex
	t      time.Time     // the fixed time, unless following
	follow bool          // read real time plus offset
	offset time.Duration // ahead of real time, when following
}

// New returns a fixed Clock that reads t until it is moved.
func New(t time.Time) *Clock { return &Clock{t: t} }

// Real returns a Clock that follows real time until it is Set.
func Real() *Clock { return &Clock{follow: true} }

// Now returns the clock's time: exactly as it was set or advanced, or,
// when following, real time plus the advances.
func (c *Clock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.follow {
		return time.Now().Add(c.offset)
	}
	return c.t
}

// Advance moves the clock by d: forward, or back if d is negative. A
// following clock keeps following, d ahead.
func (c *Clock) Advance(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.follow {
		c.offset += d
		return
	}
	c.t = c.t.Add(d)
}

// Set fixes the clock at t.
func (c *Clock) Set(t time.Time) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.t, c.follow, c.offset = t, false, 0
}

// Follow makes the clock follow real time again, with no offset.
func (c *Clock) Follow() {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.t, c.follow, c.offset = time.Time{}, true, 0
}
