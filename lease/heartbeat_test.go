package lease_test

import (
	"context"
	"encoding/json"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"

	"github.com/nodelane/nodelane/lease"
)

// plainStore is a Store that is not a HeartbeatStore.
type plainStore struct{ lease.Store }

// A Store that is not a HeartbeatStore records a heartbeat as one that
// is does: Manager.Heartbeat reads the worker and puts it back.
func TestHeartbeatWithoutHeartbeatStore(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	now := time.Date(2026, 12, 4, 12, 0, 0, 0, time.UTC)
	clock := func() time.Time { return now }
	var got [2]*lease.Worker
	for i, st := range []lease.Store{lease.NewMemoryStore(), plainStore{lease.NewMemoryStore()}} {
		m := lease.NewManager(st, &lease.Config{Now: clock})
		w, err := m.RegisterWorker(ctx, &lease.Worker{ID: "wrk_a", NodeID: "node-a", Status: "idle"})
		if err != nil {
			t.Fatal(err)
		}
		now = now.Add(time.Second)
		if _, err := m.Heartbeat(ctx, w.ID, "busy", json.RawMessage(`{"gpu_util":1}`)); err != nil {
			t.Fatal(err)
		}
		now = now.Add(time.Second)
		if got[i], err = m.Heartbeat(ctx, w.ID, "", nil); err != nil {
			t.Fatal(err)
		}
		now = now.Add(-2 * time.Second)
	}
	if _, ok := any(plainStore{}).(lease.HeartbeatStore); ok {
		t.Fatal("plainStore is a HeartbeatStore: the test proves nothing")
	}
	if d := cmp.Diff(got[0], got[1], cmpopts.EquateEmpty()); d != "" {
		t.Errorf("a heartbeat through a HeartbeatStore (-) and through Get and Put (+):\n%s", d)
	}
	if got[1].Status != "busy" || string(got[1].Metrics) != `{"gpu_util":1}` {
		t.Errorf("after a heartbeat without status or metrics: %+v", got[1])
	}
}
