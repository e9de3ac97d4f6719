// Package replaytest is the conformance suite that every replay.Store
// must pass. An adapter's test calls Run with a function that returns a
// new, empty store whose per-node quota is Quota:
//
//	func TestStore(t *testing.T) {
//		replaytest.Run(t, func(t *testing.T) replay.Store { return newEmptyStore(t, replaytest.Quota) })
//	}
//
// The suite's tests run in parallel, each on a store of its own: the
// function is called concurrently, from parallel subtests, and must
// return a store independent of every other it returned (a database, or
// a schema, of its own), so that no test sees another's writes.
//
// The suite checks single use per (node, nonce), expiry to the
// microsecond and re-use after it, Collect, quotas that count only live
// nonces and never spill over to other nodes, node ids and nonces that
// differ only in case or Unicode form, and three races: concurrent inserts
// of one fresh nonce and concurrent re-uses of one expired nonce, of which
// exactly one must win, and concurrent inserts of distinct nonces by one
// node, of which exactly its quota must win. A store that checks and then
// writes without holding a lock across both fails the races; the suite's
// own tests prove that it does (wrong_test.go).
package replaytest

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/nodelane/nodelane/replay"
)

// Quota is the per-node quota of live nonces that the stores given to Run
// must have. Their total capacity must be at least 1,000 nonces.
const Quota = 10

// epoch has a microsecond part so that stores that do not round-trip
// microseconds are caught.
var epoch = time.Date(2026, 11, 30, 9, 0, 0, 123456000, time.UTC)

const window = 300 * time.Second

// Run runs the suite, each test on a new store from newStore and in
// parallel with the others, so newStore is called concurrently, from
// parallel subtests, and must return independent stores: nonces one test
// inserts must never show, or count against a quota, in another's store.
func Run(t *testing.T, newStore func(t *testing.T) replay.Store) {
	tests := []struct {
		name string
		fn   func(t *testing.T, s replay.Store)
	}{
		{"InsertReplay", testInsertReplay},
		{"Scope", testScope},
		{"Expiry", testExpiry},
		{"Timestamps", testTimestamps},
		{"Collect", testCollect},
		{"Quota", testQuota},
		{"QuotaFreedByExpiry", testQuotaFreedByExpiry},
		{"IDsAreBytes", testIDsAreBytes},
		{"Concurrent", testConcurrent},
		{"ConcurrentReuse", testConcurrentReuse},
		{"ConcurrentQuota", testConcurrentQuota},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			tc.fn(t, newStore(t))
		})
	}
}

// nonce returns a distinct nonce shaped like the Verifier's (22 base64url
// characters).
func nonce(i int) string { return fmt.Sprintf("n%021d", i) }

func insert(t *testing.T, s replay.Store, node, n string, expires, now time.Time, want error) {
	t.Helper()
	err := s.Insert(context.Background(), node, n, expires, now)
	if want == nil {
		if err != nil {
			t.Fatalf("Insert(%q, %q, expires %s, now %s) = %v, want nil", node, n, expires, now, err)
		}
		return
	}
	if !errors.Is(err, want) {
		t.Fatalf("Insert(%q, %q, expires %s, now %s) = %v, want %v", node, n, expires, now, err, want)
	}
}

func collect(t *testing.T, s replay.Store, now time.Time, want int) {
	t.Helper()
	n, err := s.Collect(context.Background(), now)
	if err != nil {
		t.Fatalf("Collect(%s) = %v", now, err)
	}
	if n != want {
		t.Fatalf("Collect(%s) deleted %d nonces, want %d", now, n, want)
	}
}

func testInsertReplay(t *testing.T, s replay.Store) {
	exp := epoch.Add(window)
	insert(t, s, "node-a", nonce(1), exp, epoch, nil)
	insert(t, s, "node-a", nonce(1), exp, epoch, replay.ErrReplayedNonce)
	insert(t, s, "node-a", nonce(1), exp, epoch.Add(window-time.Microsecond), replay.ErrReplayedNonce)
	// A replay with another expiry is still a replay.
	insert(t, s, "node-a", nonce(1), exp.Add(time.Hour), epoch.Add(time.Second), replay.ErrReplayedNonce)
	insert(t, s, "node-a", nonce(2), exp, epoch, nil)
	insert(t, s, "node-a", nonce(2), exp, epoch, replay.ErrReplayedNonce)
}

func testScope(t *testing.T, s replay.Store) {
	exp := epoch.Add(window)
	// Nonces are per node: the same nonce is fresh for another node.
	insert(t, s, "node-a", nonce(1), exp, epoch, nil)
	insert(t, s, "node-b", nonce(1), exp, epoch, nil)
	insert(t, s, "node-b", nonce(1), exp, epoch, replay.ErrReplayedNonce)
	// The pair is the key, not the concatenation of node and nonce.
	insert(t, s, "ab", "c"+nonce(2), exp, epoch, nil)
	insert(t, s, "abc", nonce(2), exp, epoch, nil)
	insert(t, s, "a", "bc"+nonce(2), exp, epoch, nil)
	// Long node ids and the longest nonces (64 bytes, 86 characters).
	long := strings.Repeat("n", 128)
	big := strings.Repeat("A", 85) + "w"
	insert(t, s, long, big, exp, epoch, nil)
	insert(t, s, long, big, exp, epoch, replay.ErrReplayedNonce)
	insert(t, s, long, big[:85]+"g", exp, epoch, nil)
	insert(t, s, "node-a", big, exp, epoch, nil)
}

func testExpiry(t *testing.T, s replay.Store) {
	exp := epoch.Add(window)
	insert(t, s, "node-a", nonce(1), exp, epoch, nil)
	insert(t, s, "node-a", nonce(1), exp, exp.Add(-time.Microsecond), replay.ErrReplayedNonce)
	// At its expiry the record is dead and the nonce may be recorded
	// again, until the new expiry.
	exp2 := exp.Add(window)
	insert(t, s, "node-a", nonce(1), exp2, exp, nil)
	insert(t, s, "node-a", nonce(1), exp2, exp.Add(time.Second), replay.ErrReplayedNonce)
	insert(t, s, "node-a", nonce(1), exp2, exp2.Add(-time.Microsecond), replay.ErrReplayedNonce)
	insert(t, s, "node-a", nonce(1), exp2.Add(window), exp2.Add(time.Minute), nil)
}

func testTimestamps(t *testing.T, s replay.Store) {
	// Far from the epoch in both directions; times only go forward here,
	// as a store may refuse a nonce that expires before a time it was
	// given (see replay.Store).
	old := time.Date(1971, 1, 1, 0, 0, 0, 1000, time.UTC)
	insert(t, s, "node-c", nonce(1), old.Add(window), old, nil)
	insert(t, s, "node-c", nonce(1), old.Add(window), old, replay.ErrReplayedNonce)
	far := time.Date(2199, 12, 31, 23, 59, 59, 999999000, time.UTC)
	insert(t, s, "node-b", nonce(1), far, epoch.Add(-window), nil)

	// Expiries one microsecond apart are told apart and compared exactly.
	for i := range 3 {
		exp := epoch.Add(time.Duration(i) * time.Microsecond)
		insert(t, s, "node-a", nonce(i), exp, epoch.Add(-window), nil)
	}
	now := epoch.Add(time.Microsecond)
	insert(t, s, "node-a", nonce(0), now.Add(window), now, nil)
	insert(t, s, "node-a", nonce(1), now.Add(window), now, nil)
	insert(t, s, "node-a", nonce(2), now.Add(window), now, replay.ErrReplayedNonce)
	insert(t, s, "node-b", nonce(1), far, far.Add(-time.Microsecond), replay.ErrReplayedNonce)
	insert(t, s, "node-b", nonce(1), far.Add(window), far, nil)
}

func testCollect(t *testing.T, s replay.Store) {
	collect(t, s, epoch, 0)
	// Expiries at epoch + 1 s, ..., + 5 s on two nodes.
	for i := 1; i <= 5; i++ {
		exp := epoch.Add(time.Duration(i) * time.Second)
		insert(t, s, "node-a", nonce(i), exp, epoch, nil)
		insert(t, s, "node-b", nonce(i), exp, epoch, nil)
	}
	collect(t, s, epoch, 0)
	collect(t, s, epoch.Add(time.Second-time.Microsecond), 0)
	collect(t, s, epoch.Add(2*time.Second), 4)
	collect(t, s, epoch.Add(2*time.Second), 0)
	// Collected nonces are gone, the others stay.
	now := epoch.Add(2 * time.Second)
	insert(t, s, "node-a", nonce(3), epoch.Add(window), now, replay.ErrReplayedNonce)
	insert(t, s, "node-b", nonce(5), epoch.Add(window), now, replay.ErrReplayedNonce)
	insert(t, s, "node-a", nonce(1), now.Add(window), now, nil)
	collect(t, s, epoch.Add(5*time.Second), 6)
	insert(t, s, "node-a", nonce(1), now.Add(window), now, replay.ErrReplayedNonce)
	collect(t, s, now.Add(window), 1)
}

func testQuota(t *testing.T, s replay.Store) {
	exp := epoch.Add(window)
	for i := range Quota {
		insert(t, s, "node-a", nonce(i), exp, epoch, nil)
	}
	insert(t, s, "node-a", nonce(Quota), exp, epoch, replay.ErrQuota)
	insert(t, s, "node-a", nonce(Quota+1), exp, epoch.Add(time.Second), replay.ErrQuota)
	// A nonce it holds is still a replay, not a quota error.
	insert(t, s, "node-a", nonce(0), exp, epoch, replay.ErrReplayedNonce)
	// Other nodes are not affected, and nothing was evicted.
	for i := range Quota {
		insert(t, s, "node-b", nonce(i), exp, epoch, nil)
	}
	insert(t, s, "node-b", nonce(Quota), exp, epoch, replay.ErrQuota)
	for i := range Quota {
		insert(t, s, "node-a", nonce(i), exp, epoch, replay.ErrReplayedNonce)
	}
	insert(t, s, "node-c", nonce(0), exp, epoch, nil)
	// The refused nonce was not recorded: once there is room, it is fresh.
	collect(t, s, exp, 2*Quota+1)
	insert(t, s, "node-a", nonce(Quota), exp.Add(window), exp, nil)
}

func testQuotaFreedByExpiry(t *testing.T, s replay.Store) {
	// The quota counts live nonces only: expired ones free it without a
	// Collect.
	for i := range Quota {
		exp := epoch.Add(time.Duration(i+1) * time.Second)
		insert(t, s, "node-a", nonce(i), exp, epoch, nil)
	}
	insert(t, s, "node-a", nonce(Quota), epoch.Add(window), epoch, replay.ErrQuota)
	now := epoch.Add(time.Second)
	insert(t, s, "node-a", nonce(Quota), now.Add(window), now, nil)
	insert(t, s, "node-a", nonce(Quota+1), now.Add(window), now, replay.ErrQuota)
	now = epoch.Add(3 * time.Second)
	insert(t, s, "node-a", nonce(Quota+1), now.Add(window), now, nil)
	insert(t, s, "node-a", nonce(Quota+2), now.Add(window), now, nil)
	insert(t, s, "node-a", nonce(Quota+3), now.Add(window), now, replay.ErrQuota)
}

func testConcurrent(t *testing.T, s replay.Store) {
	const goroutines, rounds = 16, 20
	exp := epoch.Add(window)
	for round := range rounds {
		var (
			start = make(chan struct{})
			wg    sync.WaitGroup
			errs  = make([]error, goroutines)
		)
		node := fmt.Sprintf("node-%d", round%3)
		for g := range goroutines {
			wg.Go(func() {
				<-start
				errs[g] = s.Insert(context.Background(), node, nonce(round), exp, epoch)
			})
		}
		close(start)
		wg.Wait()
		var got struct{ OK, Replayed, Other int }
		for _, err := range errs {
			switch {
			case err == nil:
				got.OK++
			case errors.Is(err, replay.ErrReplayedNonce):
				got.Replayed++
			default:
				got.Other++
				t.Errorf("round %d: Insert = %v", round, err)
			}
		}
		want := struct{ OK, Replayed, Other int }{1, goroutines - 1, 0}
		if diff := cmp.Diff(want, got); diff != "" {
			t.Fatalf("round %d: outcomes of %d concurrent Inserts of one nonce (-want +got):\n%s", round, goroutines, diff)
		}
	}
}

// testIDsAreBytes: node ids and nonces are compared as bytes, so ids that
// a case-insensitive or Unicode-normalising collation would take for one
// are distinct.
func testIDsAreBytes(t *testing.T, s replay.Store) {
	exp := epoch.Add(window)
	nodes := []string{"Node-A", "node-a", "NODE-A", "nœud-é", "nœud-e\u0301", "NŒUD-É", "узел-1", "节点-1", "node-a "}
	for _, node := range nodes {
		insert(t, s, node, nonce(1), exp, epoch, nil)
	}
	for _, node := range nodes {
		insert(t, s, node, nonce(1), exp, epoch, replay.ErrReplayedNonce)
	}
	// Nonces differ in case only (base64url is case-sensitive).
	insert(t, s, "node-b", "AbCdEfGhIjKlMnOpQrStUv", exp, epoch, nil)
	insert(t, s, "node-b", "abcdefghijklmnopqrstuv", exp, epoch, nil)
	insert(t, s, "node-b", "ABCDEFGHIJKLMNOPQRSTUV", exp, epoch, nil)
	insert(t, s, "node-b", "AbCdEfGhIjKlMnOpQrStUv", exp, epoch, replay.ErrReplayedNonce)
	// Each spelling of a node has a quota of its own.
	for i := 2; i <= Quota; i++ {
		insert(t, s, "Node-A", nonce(i), exp, epoch, nil)
	}
	insert(t, s, "Node-A", nonce(Quota+1), exp, epoch, replay.ErrQuota)
	insert(t, s, "node-a", nonce(2), exp, epoch, nil)
}

// race runs fn in n goroutines at once and returns how many returned nil,
// how many each of wantErrs, and fails t for any other error.
func race(t *testing.T, n int, fn func(g int) error, wantErrs ...error) []int {
	t.Helper()
	var (
		start = make(chan struct{})
		wg    sync.WaitGroup
		errs  = make([]error, n)
	)
	for g := range n {
		wg.Go(func() {
			<-start
			errs[g] = fn(g)
		})
	}
	close(start)
	wg.Wait()
	counts := make([]int, 1+len(wantErrs))
next:
	for _, err := range errs {
		if err == nil {
			counts[0]++
			continue
		}
		for i, want := range wantErrs {
			if errors.Is(err, want) {
				counts[i+1]++
				continue next
			}
		}
		t.Errorf("unexpected error: %v", err)
	}
	return counts
}

// testConcurrentReuse: of concurrent re-uses of one nonce whose record
// has expired, exactly one replaces the record; the others see the new
// one and are replays. A store that reads the dead record and then
// overwrites it, without a lock between the two, admits several.
func testConcurrentReuse(t *testing.T, s replay.Store) {
	const goroutines, rounds = 16, 10
	for round := range rounds {
		node := fmt.Sprintf("node-%d", round%3)
		n := nonce(1000 + round)
		first := epoch.Add(time.Duration(round) * 2 * window)
		insert(t, s, node, n, first.Add(time.Second), first, nil)
		// From its expiry on, the record is dead and the nonce may be
		// recorded again, once.
		now := first.Add(time.Second)
		exp := now.Add(window)
		got := race(t, goroutines, func(int) error {
			return s.Insert(context.Background(), node, n, exp, now)
		}, replay.ErrReplayedNonce)
		if want := []int{1, goroutines - 1}; !cmp.Equal(want, got) {
			t.Fatalf("round %d: %d concurrent re-uses of an expired nonce: %d admitted, %d replays; want exactly 1 admitted and %d replays",
				round, goroutines, got[0], got[1], goroutines-1)
		}
		insert(t, s, node, n, exp, now.Add(time.Second), replay.ErrReplayedNonce)
	}
}

// testConcurrentQuota: of concurrent inserts of distinct nonces by one
// node, exactly its quota are admitted, counting only live nonces (the
// node's nonces of the round before have expired but are not collected);
// the others get ErrQuota and record nothing. A store that counts and
// then inserts, without a lock on the node between the two, admits more.
func testConcurrentQuota(t *testing.T, s replay.Store) {
	const goroutines, rounds = 3 * Quota, 5
	for round := range rounds {
		node := fmt.Sprintf("node-%d", round%2)
		now := epoch.Add(time.Duration(round) * 2 * window)
		exp := now.Add(window)
		ids := make([]string, goroutines)
		results := make([]error, goroutines)
		for g := range ids {
			ids[g] = nonce(round*goroutines + g)
		}
		got := race(t, goroutines, func(g int) error {
			results[g] = s.Insert(context.Background(), node, ids[g], exp, now)
			return results[g]
		}, replay.ErrQuota)
		if want := []int{Quota, goroutines - Quota}; !cmp.Equal(want, got) {
			t.Fatalf("round %d: %d concurrent inserts of distinct nonces by one node with a quota of %d: %d admitted, %d refused; want exactly %d admitted and %d refused",
				round, goroutines, Quota, got[0], got[1], Quota, goroutines-Quota)
		}
		// The admitted nonces are recorded, the refused ones are not, and
		// the node is at its quota.
		later := now.Add(time.Second)
		for g, err := range results {
			want := replay.ErrQuota
			if err == nil {
				want = replay.ErrReplayedNonce
			}
			insert(t, s, node, ids[g], exp, later, want)
		}
	}
}
