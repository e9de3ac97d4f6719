package fingerprinttest_test

import (
	"cmp"
	"context"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/nodelane/nodelane/fingerprint"
	"github.com/nodelane/nodelane/fingerprint/fingerprinttest"
	"github.com/nodelane/nodelane/internal/wrongstore"
)

// The suite must refuse stores that are wrong in the ways real adapters
// are: each variant below passes every test but one. TestWrongStores runs
// the suite on each in a child process (a failing suite fails its
// *testing.T, which a parent cannot catch in process) and checks that it
// fails, and where.

// wrongEnv names the variant a child process runs the suite on.
const wrongEnv = "FINGERPRINTTEST_WRONG_STORE"

var wrongStores = []struct {
	name string
	new  func() fingerprint.Store
	// fails is the one subtest of Run that must fail.
	fails string
}{
	// Kinds and ids in a PAD SPACE collation (MariaDB's utf8mb4_bin):
	// trailing spaces are ignored, so 'a' and 'a ' are one key.
	{"PAD SPACE ids", func() fingerprint.Store { return newCollating(trimSpaces, trimSpaces) }, "IDs"},
	// Kinds and ids in a case-insensitive collation (MySQL's
	// utf8mb4_general_ci, SQLite's NOCASE): 'a' and 'A' are one key.
	{"case-insensitive ids", func() fingerprint.Store { return newCollating(strings.ToLower, strings.ToLower) }, "IDs"},
	// Kinds and ids kept apart but ordered as a linguistic collation
	// (PostgreSQL's en_US.UTF-8) orders them, case folded first.
	{"ids in locale order", func() fingerprint.Store { return newCollating(nil, strings.ToLower) }, "IDs"},
}

func TestWrongStores(t *testing.T) {
	t.Parallel()
	fails := map[string]string{}
	stores := map[string]func() fingerprint.Store{}
	for _, w := range wrongStores {
		fails[w.name], stores[w.name] = w.fails, w.new
	}
	wrongstore.Check(t, wrongEnv, fails, func(t *testing.T, name string) {
		fingerprinttest.Run(t, func(*testing.T) fingerprint.Store { return stores[name]() })
	})
}

func trimSpaces(s string) string { return strings.TrimRight(s, " ") }

// collating is a MemoryStore behind a primary key of (kind, id) under a
// collation: keys equal once mapped by same are one fingerprint (the
// first stored wins, as INSERT IGNORE does), and Add orders by the keys
// mapped by order, then as bytes. A nil same keeps every key apart.
type collating struct {
	*fingerprint.MemoryStore
	same, order func(string) string

	mu    sync.Mutex
	known map[[2]string]bool // (same(kind), same(id)) of every stored key
}

func newCollating(same, order func(string) string) *collating {
	if same == nil {
		same = func(s string) string { return s }
	}
	return &collating{MemoryStore: fingerprint.NewMemoryStore(), same: same, order: order, known: map[[2]string]bool{}}
}

func (c *collating) Add(ctx context.Context, fps []fingerprint.Fingerprint) ([]fingerprint.Fingerprint, error) {
	if err := fingerprint.ValidateAll(fps); err != nil {
		return nil, err
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	var fresh []fingerprint.Fingerprint
	for _, f := range fps {
		k := [2]string{c.same(string(f.Kind)), c.same(f.ID)}
		if !c.known[k] {
			c.known[k] = true
			fresh = append(fresh, f)
		}
	}
	got, err := c.MemoryStore.Add(ctx, fresh)
	slices.SortStableFunc(got, func(a, b fingerprint.Fingerprint) int {
		return cmp.Or(strings.Compare(c.order(string(a.Kind)), c.order(string(b.Kind))), strings.Compare(c.order(a.ID), c.order(b.ID)))
	})
	return got, err
}
