package workerapi_test

import (
	"context"
	"errors"
	"log/slog"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nodelane/nodelane/internal/apitest"
	"github.com/nodelane/nodelane/internal/logtest"
	"github.com/nodelane/nodelane/lease"
	"github.com/nodelane/nodelane/receipts"
	"github.com/nodelane/nodelane/workerapi"
)

func attr(r slog.Record, key string) slog.Value {
	var v slog.Value
	r.Attrs(func(a slog.Attr) bool {
		if a.Key == key {
			v = a.Value
			return false
		}
		return true
	})
	return v
}

var errDown = errors.New("injected: the database is unreachable")

// downLeases fails ExpiredJobs while down is set.
type downLeases struct {
	lease.Store
	down  *atomic.Bool
	calls *atomic.Int64
}

func (s downLeases) ExpiredJobs(ctx context.Context, now time.Time, limit int) ([]*lease.Job, error) {
	if s.down.Load() {
		s.calls.Add(1)
		return nil, errDown
	}
	return s.Store.ExpiredJobs(ctx, now, limit)
}

// downReceipts fails Sequence while down is set.
type downReceipts struct {
	receipts.Store
	down  *atomic.Bool
	calls *atomic.Int64
}

func (s downReceipts) Sequence(ctx context.Context, limit int, f receipts.IntegrateFunc) error {
	if s.down.Load() {
		s.calls.Add(1)
		return errDown
	}
	return s.Store.Sequence(ctx, limit, f)
}

// While the database is down the sequencer and the maintainer fail on
// every attempt; each logs one ERROR when its outage begins and one INFO,
// with the count of failures, when it ends.
func TestOutageLoggedOncePerStateChange(t *testing.T) {
	t.Parallel()
	var (
		down                 atomic.Bool
		leaseCalls, seqCalls atomic.Int64
	)
	down.Store(true)
	logs := logtest.New()
	apitest.New(t, "sqlite", apitest.Started(),
		apitest.WithConfig(func(c *workerapi.Config) {
			c.Logger = slog.New(logs)
			c.MaintainInterval = time.Millisecond
			c.SequenceInterval = time.Millisecond
		}),
		apitest.WithStores(func(s workerapi.Stores) workerapi.Stores {
			s.Leases = downLeases{s.Leases, &down, &leaseCalls}
			s.Receipts = downReceipts{s.Receipts, &down, &seqCalls}
			return s
		}))
	const attempts = 5
	logs.WaitFor(t, "attempts while down", func(slog.Record) bool {
		return leaseCalls.Load() >= attempts && seqCalls.Load() >= attempts
	})
	down.Store(false)
	for _, what := range []string{"receipt sequencer", "maintainer"} {
		r := logs.WaitFor(t, what+" recovered", func(r slog.Record) bool { return r.Message == what+" recovered" })
		if r.Level != slog.LevelInfo {
			t.Errorf("%q logged at %v", r.Message, r.Level)
		}
		if n := attr(r, "failures").Int64(); n < attempts {
			t.Errorf("%s recovered after %d failures, want at least %d", what, n, attempts)
		}
		if attr(r, "over").Kind() != slog.KindDuration {
			t.Errorf("%s recovered without its duration", what)
		}
	}
	errorsBy := map[string]int{}
	for _, r := range logs.Records() {
		if r.Level >= slog.LevelError {
			what, _, _ := strings.Cut(r.Message, " failing")
			errorsBy[what]++
		}
	}
	if errorsBy["receipt sequencer"] != 1 || errorsBy["maintainer"] != 1 || len(errorsBy) != 2 {
		t.Errorf("ERROR records by task: %v, want one each for the sequencer and the maintainer", errorsBy)
	}
}
