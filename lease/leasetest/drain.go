package leasetest

import (
	"errors"
	"testing"

	"github.com/nodelane/nodelane/lease"
)

// drainTests check Manager.SetDrain on a store that is a lease.DrainStore
// (skipped on one that is not).
var drainTests = []test{
	{"Drain", testDrain},
}

// A drain request is kept (through PutWorker too: a registration or a
// heartbeat does not clear it); a draining worker is granted nothing and
// ExplainLease says why; it keeps the jobs it holds; resuming lets it
// lease again; asking twice changes nothing.
func testDrain(t *testing.T, f *fixture) {
	if _, ok := f.store.(lease.DrainStore); !ok {
		t.Skip("the store is not a lease.DrainStore")
	}
	w := f.defaultWorker("w")
	f.enqueue("status_check")
	_, held := f.leaseOne(w)
	f.enqueue("status_check")

	got, changed, err := f.m.SetDrain(f.ctx, w.ID, true, "op")
	if err != nil || !changed || got.Drain == nil || got.Drain.By != "op" || got.Drain.At.IsZero() {
		t.Fatalf("SetDrain(true): %+v, changed %v, %v", got, changed, err)
	}
	at := got.Drain.At
	if again, changed, err := f.m.SetDrain(f.ctx, w.ID, true, "other"); err != nil || changed || again.Drain == nil || !again.Drain.At.Equal(at) || again.Drain.By != "op" {
		t.Errorf("SetDrain(true) again: %+v, changed %v, %v", again, changed, err)
	}
	// Kept through a heartbeat and a registration (PutWorker).
	if _, err := f.m.Heartbeat(f.ctx, w.ID, "busy", nil); err != nil {
		t.Fatal(err)
	}
	re := *w
	re.Drain = nil
	if _, err := f.m.RegisterWorker(f.ctx, &re); err != nil {
		t.Fatal(err)
	}
	stored, err := f.m.Worker(f.ctx, w.ID)
	if err != nil || stored.Drain == nil || !stored.Drain.At.Equal(at) || stored.Drain.By != "op" {
		t.Fatalf("the stored worker after a heartbeat and a registration: %+v, %v", stored, err)
	}
	if gs := f.lease(w, 4); len(gs) != 0 {
		t.Errorf("a draining worker leased %d jobs", len(gs))
	}
	ex := f.explainLease(lease.LeaseRequest{WorkerID: w.ID}, nil)
	if !ex.Draining || len(ex.Reasons) != 1 || ex.Reasons[0].Code != lease.ReasonDraining {
		t.Errorf("ExplainLease of a draining worker: %+v", ex)
	}
	// It keeps what it holds.
	f.accept(held)
	if _, changed, err := f.m.SetDrain(f.ctx, w.ID, false, "op"); err != nil || !changed {
		t.Fatalf("SetDrain(false): changed %v, %v", changed, err)
	}
	if gs := f.lease(w, 4); len(gs) != 1 {
		t.Errorf("a resumed worker leased %d jobs, want 1", len(gs))
	}
	if _, changed, err := f.m.SetDrain(f.ctx, w.ID, false, "op"); err != nil || changed {
		t.Errorf("SetDrain(false) again: changed %v, %v", changed, err)
	}
	if _, _, err := f.m.SetDrain(f.ctx, "wrk_nobody", true, "op"); !errors.Is(err, lease.ErrNotFound) {
		t.Errorf("SetDrain of an unknown worker: %v, want ErrNotFound", err)
	}
	if err := f.store.(lease.DrainStore).SetDrain(f.ctx, "wrk_nobody", nil); !errors.Is(err, lease.ErrNotFound) {
		t.Errorf("DrainStore.SetDrain of an unknown worker: %v, want ErrNotFound", err)
	}
}
