package lease_test

import (
	"context"
	"slices"
	"testing"
	"time"

	"github.com/nodelane/nodelane/internal/testclock"
	"github.com/nodelane/nodelane/lease"
)

// batchStore records the limit of every DeleteEnded and what it deleted.
type batchStore struct {
	*lease.MemoryStore
	calls [][2]int // limit, deleted
}

func (s *batchStore) DeleteEnded(ctx context.Context, before time.Time, limit int) (int, error) {
	n, err := s.MemoryStore.DeleteEnded(ctx, before, limit)
	s.calls = append(s.calls, [2]int{limit, n})
	return n, err
}

// Prune deletes in batches of PruneBatch until one comes back short, and
// runs at most PruneMaxBatches of them; the next Prune goes on.
func TestPruneBatches(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	clock := testclock.New(time.Date(2026, 12, 1, 9, 0, 0, 0, time.UTC))
	s := &batchStore{MemoryStore: lease.NewMemoryStore()}
	m := lease.NewManager(s, &lease.Config{Retention: time.Hour, Now: clock.Now})
	const jobs = lease.PruneBatch*lease.PruneMaxBatches + 1
	for range jobs {
		j, err := m.Enqueue(ctx, lease.NewJob{Type: "status_check"})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := m.Cancel(ctx, j.ID); err != nil {
			t.Fatal(err)
		}
	}
	clock.Advance(time.Hour + time.Microsecond)

	n, err := m.Prune(ctx)
	if err != nil || n != jobs-1 {
		t.Fatalf("first Prune = %d, %v; want %d", n, err, jobs-1)
	}
	want := slices.Repeat([][2]int{{lease.PruneBatch, lease.PruneBatch}}, lease.PruneMaxBatches)
	if !slices.Equal(s.calls, want) {
		t.Fatalf("first Prune's batches (limit, deleted) = %v, want %v", s.calls, want)
	}
	s.calls = nil
	if n, err := m.Prune(ctx); err != nil || n != 1 {
		t.Fatalf("second Prune = %d, %v; want 1", n, err)
	}
	if want := [][2]int{{lease.PruneBatch, 1}}; !slices.Equal(s.calls, want) {
		t.Fatalf("second Prune's batches = %v, want %v", s.calls, want)
	}
	s.calls = nil
	if n, err := lease.NewManager(s, &lease.Config{Now: clock.Now}).Prune(ctx); err != nil || n != 0 || len(s.calls) != 0 {
		t.Fatalf("Prune without Retention = %d, %v, batches %v; want 0 and no call of the store", n, err, s.calls)
	}
}
