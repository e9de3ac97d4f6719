package console

import (
	"sync"
	"time"

	"golang.org/x/time/rate"
)

// limiter is a token bucket per client address (sign-ins), in a table of
// at most max addresses: when it is full, the addresses whose bucket has
// refilled are forgotten (a new bucket is the same), and if none has, the
// one seen least recently.
type limiter struct {
	mu    sync.Mutex
	m     map[string]*bucket
	every rate.Limit
	burst int
	max   int
	now   func() time.Time
}

type bucket struct {
	l    *rate.Limiter
	seen time.Time
}

func newLimiter(interval time.Duration, burst, max int, now func() time.Time) *limiter {
	return &limiter{m: map[string]*bucket{}, every: rate.Every(interval), burst: burst, max: max, now: now}
}

// allow takes a token of addr's bucket; when there is none, it reports
// how long until there is one.
func (l *limiter) allow(addr string) (time.Duration, bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	now := l.now()
	b := l.m[addr]
	if b == nil {
		if len(l.m) >= l.max {
			l.evict(now)
		}
		b = &bucket{l: rate.NewLimiter(l.every, l.burst)}
		l.m[addr] = b
	}
	b.seen = now
	r := b.l.ReserveN(now, 1)
	if d := r.DelayFrom(now); d > 0 {
		r.CancelAt(now)
		return d, false
	}
	return 0, true
}

// evict makes room for one address.
func (l *limiter) evict(now time.Time) {
	var oldest string
	for a, b := range l.m {
		if b.l.TokensAt(now) >= float64(l.burst) {
			delete(l.m, a)
		} else if oldest == "" || b.seen.Before(l.m[oldest].seen) {
			oldest = a
		}
	}
	if len(l.m) >= l.max {
		delete(l.m, oldest)
	}
}
