package receiptstest_test

import (
	"context"
	"strings"
	"sync"
	"testing"

	"github.com/nodelane/nodelane/internal/wrongstore"
	"github.com/nodelane/nodelane/receipts"
	"github.com/nodelane/nodelane/receipts/receiptstest"
)

// The suite must refuse stores that are wrong in the ways real adapters
// are: each variant below passes every test but one. TestWrongStores runs
// the suite on each in a child process (a failing suite fails its
// *testing.T, which a parent cannot catch in process) and checks that it
// fails, and where.

// wrongEnv names the variant a child process runs the suite on.
const wrongEnv = "RECEIPTSTEST_WRONG_STORE"

var wrongStores = []struct {
	name string
	new  func() receipts.Store
	// fails is the one subtest of Run that must fail.
	fails string
}{
	// Receipt ids under a case-insensitive collation (MySQL's
	// utf8mb4_general_ci, SQLite's NOCASE): "rcp_A" and "rcp_a" are one.
	{"FoldedIDs", func() receipts.Store {
		return &folded{MemoryStore: receipts.NewMemoryStore(), ids: map[string]string{}}
	}, "IDsAreBytes"},
	// A store that reads a limit of 0 or less as "all", as the contract
	// once allowed: one caller's bug away from reading a whole table.
	{"UnlimitedList", func() receipts.Store { return unlimited{receipts.NewMemoryStore()} }, "Limits"},
}

func TestWrongStores(t *testing.T) {
	t.Parallel()
	fails := map[string]string{}
	stores := map[string]func() receipts.Store{}
	for _, w := range wrongStores {
		fails[w.name], stores[w.name] = w.fails, w.new
	}
	wrongstore.Check(t, wrongEnv, fails, func(t *testing.T, name string) {
		receiptstest.Run(t, func(*testing.T) receipts.Store { return stores[name]() })
	})
}

// folded is a MemoryStore behind a case-insensitive unique index of
// receipt ids.
type folded struct {
	*receipts.MemoryStore

	mu  sync.Mutex
	ids map[string]string // folded id -> id as minted
}

func (f *folded) AddReceipt(ctx context.Context, s *receipts.Stored) error {
	f.mu.Lock()
	k := strings.ToLower(s.ID)
	if _, taken := f.ids[k]; taken {
		f.mu.Unlock()
		return receipts.ErrConflict
	}
	f.ids[k] = s.ID
	f.mu.Unlock()
	return f.MemoryStore.AddReceipt(ctx, s)
}

func (f *folded) GetReceipt(ctx context.Context, id string) (*receipts.Stored, error) {
	f.mu.Lock()
	if stored, ok := f.ids[strings.ToLower(id)]; ok {
		id = stored
	}
	f.mu.Unlock()
	return f.MemoryStore.GetReceipt(ctx, id)
}

// unlimited is a MemoryStore that reads a limit of 0 or less as "all".
type unlimited struct{ *receipts.MemoryStore }

func (s unlimited) ListReceipts(ctx context.Context, from int64, limit int) ([]*receipts.Stored, error) {
	if limit <= 0 {
		limit = 1 << 30
	}
	return s.MemoryStore.ListReceipts(ctx, from, limit)
}

func (s unlimited) Sequence(ctx context.Context, limit int, integrate receipts.IntegrateFunc) error {
	if limit <= 0 {
		limit = 1 << 30
	}
	return s.MemoryStore.Sequence(ctx, limit, integrate)
}
