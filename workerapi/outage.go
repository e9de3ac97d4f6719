package workerapi

import (
	"log/slog"
	"sync"
	"time"
)

// outage logs a background task that fails on every attempt while its
// database is unreachable once per change of state, not once per
// attempt: an ERROR at the first failure, the failures that follow at
// DEBUG, and an INFO with their count and duration at the first success.
// It is safe for concurrent use.
type outage struct {
	log  *slog.Logger
	what string
	now  func() time.Time

	mu       sync.Mutex
	failures int
	since    time.Time
}

func newOutage(log *slog.Logger, what string, now func() time.Time) *outage {
	return &outage{log: log, what: what, now: now}
}

// fail records a failed attempt.
func (o *outage) fail(err error) {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.failures++
	if o.failures == 1 {
		o.since = o.now()
		o.log.Error(o.what+" failing (the database may be unreachable); further failures are logged at DEBUG until it recovers", "err", err)
		return
	}
	o.log.Debug(o.what+" failing", "failures", o.failures, "err", err)
}

// ok records a successful attempt.
func (o *outage) ok() {
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.failures == 0 {
		return
	}
	o.log.Info(o.what+" recovered", "failures", o.failures, "over", o.now().Sub(o.since).Round(time.Millisecond))
	o.failures = 0
}
