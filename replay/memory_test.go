package replay_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/nodelane/nodelane/replay"
	"github.com/nodelane/nodelane/replay/replaytest"
)

func TestMemoryStore(t *testing.T) {
	t.Parallel()
	replaytest.Run(t, func(t *testing.T) replay.Store {
		return replay.NewMemoryStore(&replay.MemoryConfig{PerNode: replaytest.Quota})
	})
}

func TestMemoryStoreTotal(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s := replay.NewMemoryStore(&replay.MemoryConfig{PerNode: 3, Total: 5})
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	for i := range 5 {
		// Nodes a, b, c, d, e: one nonce each, expiring a second apart.
		if err := s.Insert(ctx, string(rune('a'+i)), "n", t0.Add(time.Duration(i+1)*time.Second), t0); err != nil {
			t.Fatalf("Insert %d: %v", i, err)
		}
	}
	if err := s.Insert(ctx, "f", "n", t0.Add(time.Minute), t0); !errors.Is(err, replay.ErrQuota) {
		t.Fatalf("Insert beyond Total = %v, want ErrQuota", err)
	}
	if s.Len() != 5 {
		t.Fatalf("Len = %d after a refused Insert, want 5", s.Len())
	}
	// Expired nonces make room as the clock moves, without a Collect.
	if err := s.Insert(ctx, "f", "n", t0.Add(time.Minute), t0.Add(time.Second)); err != nil {
		t.Fatalf("Insert after one expired = %v", err)
	}
	if s.Len() != 5 {
		t.Fatalf("Len = %d, want 5", s.Len())
	}
}

// TestMemoryStoreHorizon checks that a nonce that expires before a time the store
// already collected up to may have been seen and deleted, so it is
// refused, even when the caller's clock is behind.
func TestMemoryStoreHorizon(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s := replay.NewMemoryStore(nil)
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	exp := t0.Add(300 * time.Second)
	if err := s.Insert(ctx, "a", "n", exp, t0); err != nil {
		t.Fatal(err)
	}
	// A caller whose clock reads exp collects the record ...
	if err := s.Insert(ctx, "a", "m", exp.Add(300*time.Second), exp); err != nil {
		t.Fatal(err)
	}
	// ... so a replay checked a microsecond earlier must still be refused.
	if err := s.Insert(ctx, "a", "n", exp, exp.Add(-time.Microsecond)); !errors.Is(err, replay.ErrReplayedNonce) {
		t.Fatalf("late replay = %v, want ErrReplayedNonce", err)
	}
	if n, _ := s.Collect(ctx, t0); n != 0 {
		t.Fatalf("Collect(earlier) = %d, want 0", n)
	}
	if err := s.Insert(ctx, "a", "n", exp.Add(time.Second), exp); err != nil {
		t.Fatalf("fresh nonce after the horizon = %v", err)
	}
}
