package replaytest_test

import (
	"context"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nodelane/nodelane/internal/wrongstore"
	"github.com/nodelane/nodelane/replay"
	"github.com/nodelane/nodelane/replay/replaytest"
)

// The suite must refuse stores that are wrong in the ways real adapters
// were: each variant below passes every test but one. TestWrongStores runs the suite on each in a child process (a
// failing suite fails its *testing.T, which a parent cannot catch in
// process) and checks that it fails, and where.

// wrongEnv names the variant a child process runs the suite on.
const wrongEnv = "REPLAYTEST_WRONG_STORE"

// raceWindow is how long a wrong store waits between its check and its
// write, so that concurrent callers all check before any writes. The
// sleep is the mistake the store models (a check-then-act race with a
// window as wide as a round trip to a database), not a wait for an event.
const raceWindow = 2 * time.Millisecond

var wrongStores = []struct {
	name string
	new  func() replay.Store
	// fails is the one subtest of Run that must fail.
	fails string
}{
	// A store without per-node serialisation: it counts the node's live
	// nonces, then inserts, so concurrent inserts all see room.
	{"UnlockedQuota", func() replay.Store { return newMirrored(true, false) }, "ConcurrentQuota"},
	// A store that reads a dead record, then overwrites it, so concurrent
	// re-uses of an expired nonce all replace it.
	{"RacyReplace", func() replay.Store { return newMirrored(false, true) }, "ConcurrentReuse"},
	// Node ids under a case-insensitive collation (MySQL's
	// utf8mb4_general_ci, SQLite's NOCASE): "Node-A" and "node-a" share
	// their nonces and their quota.
	{"FoldedIDs", func() replay.Store {
		return folded{replay.NewMemoryStore(&replay.MemoryConfig{PerNode: replaytest.Quota})}
	}, "IDsAreBytes"},
}

func TestWrongStores(t *testing.T) {
	t.Parallel()
	fails := map[string]string{}
	stores := map[string]func() replay.Store{}
	for _, w := range wrongStores {
		fails[w.name], stores[w.name] = w.fails, w.new
	}
	wrongstore.Check(t, wrongEnv, fails, func(t *testing.T, name string) {
		replaytest.Run(t, func(*testing.T) replay.Store { return stores[name]() })
	})
}

// mirrored is a Store over a MemoryStore that decides some outcomes
// itself, from a mirror of the live records read under a lock that it
// releases before it writes: a check-then-act race, as in an adapter that
// SELECTs and then INSERTs without a lock across both. Called one at a
// time it answers exactly as the MemoryStore does.
type mirrored struct {
	mem *replay.MemoryStore
	// racyQuota: count the node's live nonces in the mirror, refuse at
	// the quota, then insert into a MemoryStore that has no quota.
	racyQuota bool
	// racyReplace: when the mirror holds the pair dead, replace it without
	// asking whether someone else has meanwhile.
	racyReplace bool

	mu     sync.Mutex
	mirror map[[2]string]time.Time // (node, nonce) -> expiry
}

func newMirrored(racyQuota, racyReplace bool) *mirrored {
	cfg := &replay.MemoryConfig{PerNode: replaytest.Quota}
	if racyQuota {
		cfg.PerNode = 1 << 30
	}
	return &mirrored{mem: replay.NewMemoryStore(cfg), racyQuota: racyQuota, racyReplace: racyReplace, mirror: map[[2]string]time.Time{}}
}

func (m *mirrored) Insert(ctx context.Context, node, nonce string, expires, now time.Time) error {
	key := [2]string{node, nonce}
	m.mu.Lock()
	old, held := m.mirror[key]
	dead := held && !old.After(now)
	live := 0
	for k, exp := range m.mirror {
		if k[0] == node && exp.After(now) {
			live++
		}
	}
	m.mu.Unlock()

	if m.racyQuota && !(held && !dead) && live >= replaytest.Quota {
		return replay.ErrQuota
	}
	if (m.racyQuota && live < replaytest.Quota) || (m.racyReplace && dead) {
		time.Sleep(raceWindow)
	}
	err := m.mem.Insert(ctx, node, nonce, expires, now)
	if m.racyReplace && dead && errors.Is(err, replay.ErrReplayedNonce) {
		// It saw the record dead, so it overwrites whatever is there now.
		err = nil
	}
	if err == nil {
		m.mu.Lock()
		m.mirror[key] = expires
		m.mu.Unlock()
	}
	return err
}

func (m *mirrored) Collect(ctx context.Context, now time.Time) (int, error) {
	m.mu.Lock()
	for k, exp := range m.mirror {
		if !exp.After(now) {
			delete(m.mirror, k)
		}
	}
	m.mu.Unlock()
	return m.mem.Collect(ctx, now)
}

// folded is a MemoryStore whose node ids are case-insensitive.
type folded struct{ *replay.MemoryStore }

func (f folded) Insert(ctx context.Context, node, nonce string, expires, now time.Time) error {
	return f.MemoryStore.Insert(ctx, strings.ToLower(node), nonce, expires, now)
}
