// Package pollnotify is a workerapi.Notifier for databases without
// LISTEN/NOTIFY: every Notify adds one to a counter in the database, in
// the caller's transaction, and every replica's Notifier reads the
// counter every Config.Interval and wakes its subscribers when it
// changed.
//
// Which Notifier to choose: on PostgreSQL, bunstore's (LISTEN/NOTIFY,
// wake-ups in milliseconds, no polling). On MySQL or MariaDB, or SQLite
// shared by several processes, this one; bunstore's wakes across
// processes on PostgreSQL only. Within one process on SQLite, bunstore's
// is enough (workerapi.LocalNotifier is not: it wakes before the commit).
//
// The contract: a Notify whose context carries a transaction wakes no
// subscriber, on any replica, before that transaction commits, because
// the counter changes only when the transaction commits (and not at all
// if it rolls back, which then wakes no one). Once it has committed, every
// subscriber of every replica's Notifier is woken within Config.Interval
// plus the duration of one Read, plus, while reads fail, the backoff of
// the retries (up to Config.RetryMax each). A Notify without a
// transaction is bound the same way from its return.
//
// The database part is a Counter; SQLCounter is one on a one-row table
// for any database/sql driver, and its doc gives the table's DDL and the
// cost of the scheme.
package pollnotify

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/nodelane/nodelane/workerapi"
)

// ErrConfig reports an invalid setting of New or NewSQLCounter.
var ErrConfig = errors.New("pollnotify: invalid configuration")

// The bounds and defaults of Config's settings.
const (
	// DefaultInterval is the default of Config.Interval.
	DefaultInterval = 250 * time.Millisecond
	// MinInterval is the shortest Config.Interval: shorter would be
	// a read a replica sends more often than a wake-up is worth.
	MinInterval = 10 * time.Millisecond
	// MaxInterval is the longest Config.Interval: a long-poll that
	// waits longer than its wake-up needs to arrive gains little.
	MaxInterval = 10 * time.Second
	// DefaultRetryMax is the default of Config.RetryMax.
	DefaultRetryMax = 10 * time.Second
)

// Config holds a Notifier's optional settings. A nil *Config means all
// defaults.
type Config struct {
	// Interval is how long the Notifier waits after one read of the
	// counter before the next. Defaults to DefaultInterval (250 ms);
	// from MinInterval (10 ms) to MaxInterval (10 s).
	Interval time.Duration
	// RetryMax bounds the wait after a read that failed: it starts at
	// twice Interval and doubles up to RetryMax. Defaults to
	// DefaultRetryMax (10 s); may not be less than Interval.
	RetryMax time.Duration
	// Logger receives the failed reads (the Counter's errors; the first
	// of a run at WARN, the rest at DEBUG) and the recovery (INFO).
	// Defaults to discarding them.
	Logger *slog.Logger
	// After returns a channel that receives once d has passed: the
	// Notifier's clock, which it calls before each read with the wait
	// that precedes it. Defaults to time.After.
	After func(d time.Duration) <-chan time.Time
}

// withDefaults validates c and returns it with every zero setting
// replaced by its default.
func (c *Config) withDefaults() (Config, error) {
	var out Config
	if c != nil {
		out = *c
	}
	for _, d := range []struct {
		name string
		v    *time.Duration
		def  time.Duration
	}{
		{"Interval", &out.Interval, DefaultInterval},
		{"RetryMax", &out.RetryMax, DefaultRetryMax},
	} {
		if *d.v < 0 {
			return Config{}, fmt.Errorf("%w: Config.%s is negative (%v)", ErrConfig, d.name, *d.v)
		}
		if *d.v == 0 {
			*d.v = d.def
		}
	}
	if out.Interval < MinInterval || out.Interval > MaxInterval {
		return Config{}, fmt.Errorf("%w: Config.Interval (%v) is not from %v to %v", ErrConfig, out.Interval, MinInterval, MaxInterval)
	}
	if out.RetryMax < out.Interval {
		return Config{}, fmt.Errorf("%w: Config.RetryMax (%v) is less than Config.Interval (%v)", ErrConfig, out.RetryMax, out.Interval)
	}
	if out.Logger == nil {
		out.Logger = slog.New(slog.DiscardHandler)
	}
	if out.After == nil {
		out.After = time.After
	}
	return out, nil
}

// Notifier is a workerapi.Notifier on a Counter: Notify bumps the
// counter, and one goroutine per Notifier reads it every Config.Interval
// and wakes every subscriber when it changed (see the package doc for the
// bound). It is not a workerapi.SignalNotifier: the Server's signals to
// one worker then call Notify and wake every long-poll, which look again
// and find nothing new but the worker concerned.
//
// When a read fails the Notifier logs it, retries after a growing wait,
// and, once a read succeeds again, wakes every subscriber once, since a
// change may have come and gone unseen meanwhile. Each subscriber channel
// holds one wake-up: changes seen while one is pending fold into it.
// Make one Notifier per replica and Close it before the database.
type Notifier struct {
	counter Counter
	cfg     Config // with defaults
	log     *slog.Logger

	// local holds the subscribers and wakes them (its Notify), only
	// ever from poll: n is no SignalNotifier, so its NotifyWorker, which
	// would wake this process alone, is not exposed.
	local *workerapi.LocalNotifier

	closeOnce sync.Once
	stop      context.CancelFunc // ends the goroutine and its read
	done      chan struct{}      // closed when the goroutine returns
}

// New returns a Notifier on c; cfg may be nil. It reads the counter once
// before it returns (ctx bounds that read only), so that any Notify committed after New returns wakes
// its subscribers, and fails (with the Counter's error: ErrNoRow for a
// SQLCounter whose row is missing) if it cannot; an invalid cfg is an
// error wrapping ErrConfig.
func New(ctx context.Context, c Counter, cfg *Config) (*Notifier, error) {
	if c == nil {
		return nil, fmt.Errorf("%w: New: the Counter is nil", ErrConfig)
	}
	conf, err := cfg.withDefaults()
	if err != nil {
		return nil, err
	}
	last, err := c.Read(ctx)
	if err != nil {
		return nil, fmt.Errorf("pollnotify: first read: %w", err)
	}
	life, stop := context.WithCancel(context.Background())
	n := &Notifier{counter: c, cfg: conf, log: conf.Logger, local: workerapi.NewLocalNotifier(), stop: stop, done: make(chan struct{})}
	go n.poll(life, last)
	return n, nil
}

// Notify implements workerapi.Notifier: it bumps the counter, in the
// transaction ctx carries if any (see the package doc for when the
// subscribers wake). It works after Close too, for the other replicas.
func (n *Notifier) Notify(ctx context.Context) error {
	return n.counter.Bump(ctx)
}

// Subscribe implements workerapi.Notifier: the channel receives after
// every change of the counter that n reads, and after a recovery from
// failed reads, until cancel is called or n is closed. The channel is
// never closed, so after Close (or from Subscribe after Close) it never
// receives again: a closed channel would make a long-poll that waits on it
// look again without end. cancel may be called more than once.
func (n *Notifier) Subscribe() (<-chan struct{}, func()) {
	return n.local.Subscribe()
}

// Close stops n's goroutine, cancelling a read in progress, and waits
// for it to return; n's subscribers are not woken again. Close always
// returns nil and may be called more than once.
func (n *Notifier) Close() error {
	n.closeOnce.Do(func() {
		n.stop()
		<-n.done
	})
	return nil
}

// poll reads the counter until ctx ends, every Interval, and wakes the
// subscribers when it differs from the value read before, last at first.
func (n *Notifier) poll(ctx context.Context, last int64) {
	defer close(n.done)
	wait := n.cfg.Interval
	failures := 0
	for {
		select {
		case <-ctx.Done():
			return
		case <-n.cfg.After(wait):
		}
		v, err := n.counter.Read(ctx)
		if err != nil {
			if ctx.Err() != nil {
				return
			}
			failures++
			wait = min(2*wait, n.cfg.RetryMax)
			level := slog.LevelDebug
			if failures == 1 {
				level = slog.LevelWarn
			}
			n.log.Log(ctx, level, "pollnotify: cannot read the counter; retrying, further failures logged at DEBUG", "err", err, "failed_reads", failures, "retry_in", wait)
			continue
		}
		switch {
		case failures > 0:
			n.log.Info("pollnotify: reading the counter again; waking every subscriber", "failed_reads", failures)
			failures, wait = 0, n.cfg.Interval
			n.local.Notify(ctx)
		case v != last:
			n.local.Notify(ctx)
		}
		last = v
	}
}
