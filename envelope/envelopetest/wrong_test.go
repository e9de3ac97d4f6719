package envelopetest_test

import (
	"context"
	"strings"
	"testing"

	"github.com/nodelane/nodelane/envelope"
	"github.com/nodelane/nodelane/envelope/envelopetest"
	"github.com/nodelane/nodelane/internal/wrongstore"
)

// The suite must refuse stores that are wrong in the ways real adapters
// are: each variant below passes every test but one. TestWrongStores runs
// the suite on each in a child process (a failing suite fails its
// *testing.T, which a parent cannot catch in process) and checks that it
// fails, and where.

// wrongEnv names the variant a child process runs the suite on.
const wrongEnv = "ENVELOPETEST_WRONG_STORE"

var wrongStores = []struct {
	name string
	new  func() envelope.Store
	// fails is the one subtest of Run that must fail.
	fails string
}{
	// A store that reads a limit of 0 or less as "all", as the contract
	// once allowed: one caller's bug away from reading a whole table.
	{"UnlimitedHistory", func() envelope.Store { return unlimited{envelope.NewMemoryStore()} }, "StoreLimits"},
	// Text trimmed on the way in, as a form layer or a CHAR column would.
	{"TrimmedText", func() envelope.Store { return trimmed{envelope.NewMemoryStore()} }, "TextRoundTrip"},
}

func TestWrongStores(t *testing.T) {
	t.Parallel()
	fails := map[string]string{}
	stores := map[string]func() envelope.Store{}
	for _, w := range wrongStores {
		fails[w.name], stores[w.name] = w.fails, w.new
	}
	wrongstore.Check(t, wrongEnv, fails, func(t *testing.T, name string) {
		envelopetest.Run(t, func(*testing.T) envelope.Store { return stores[name]() })
	})
}

// unlimited is a MemoryStore whose History returns every record for a
// limit of 0 or less.
type unlimited struct{ *envelope.MemoryStore }

func (s unlimited) History(ctx context.Context, after int64, limit int) ([]envelope.Record, error) {
	if limit <= 0 {
		limit = 1 << 30
	}
	return s.MemoryStore.History(ctx, after, limit)
}

// trimmed is a MemoryStore that trims the space around who made a change
// and why before it keeps them.
type trimmed struct{ *envelope.MemoryStore }

func (s trimmed) Apply(ctx context.Context, prev int64, next envelope.State, rec envelope.Record) error {
	next.By, next.Reason = strings.TrimSpace(next.By), strings.TrimSpace(next.Reason)
	rec.By, rec.Reason = strings.TrimSpace(rec.By), strings.TrimSpace(rec.Reason)
	return s.MemoryStore.Apply(ctx, prev, next, rec)
}
