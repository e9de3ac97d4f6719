package leasetest

import (
	"errors"
	"testing"

	"github.com/nodelane/nodelane/lease"
)

// retireTests check Manager.Retire: the worker is retired for good, and
// its live leases end.
var retireTests = []test{
	{"Retire", testRetire},
}

// Retiring a worker ends its live leases (a leased and a running job go
// back to the queue without using an attempt, a job whose cancel was
// requested ends canceled), leaves the other worker's alone, and the
// worker is granted nothing again; a heartbeat does not revive it, and
// retiring again changes nothing.
func testRetire(t *testing.T, f *fixture) {
	w := f.defaultWorker("w")
	other := f.defaultWorker("other")
	jl := f.enqueue("status_check")
	_, lref := f.leaseOne(w)
	jr := f.enqueue("status_check")
	_, rref := f.leaseOne(w)
	f.accept(rref)
	jc := f.enqueue("status_check")
	_, cref := f.leaseOne(w)
	f.accept(cref)
	f.cancel(jc.ID)
	jo := f.enqueue("status_check")
	_, oref := f.leaseOne(other)
	if lref.JobID != jl.ID || rref.JobID != jr.ID || cref.JobID != jc.ID || oref.JobID != jo.ID {
		t.Fatalf("leased %s %s %s %s, want %s %s %s %s", lref.JobID, rref.JobID, cref.JobID, oref.JobID, jl.ID, jr.ID, jc.ID, jo.ID)
	}

	got, changed, ended, err := f.m.Retire(f.ctx, w.ID, "decommissioned")
	if err != nil || !changed || got.Status != lease.StatusRetired {
		t.Fatalf("Retire: %+v, changed %v, %v", got, changed, err)
	}
	from := map[string]lease.State{}
	for _, e := range ended {
		from[e.Job.ID] = e.From
	}
	want := map[string]lease.State{jl.ID: lease.StateLeased, jr.ID: lease.StateRunning, jc.ID: lease.StateRunning}
	if len(from) != len(want) || from[jl.ID] != want[jl.ID] || from[jr.ID] != want[jr.ID] || from[jc.ID] != want[jc.ID] {
		t.Errorf("ended %v, want %v", from, want)
	}
	for id, st := range map[string]lease.State{jl.ID: lease.StateQueued, jr.ID: lease.StateQueued, jc.ID: lease.StateCanceled, jo.ID: lease.StateLeased} {
		j := f.state(id, st)
		if id == jo.ID {
			continue
		}
		if j.LastError == nil || j.LastError.Code != lease.CodeWorkerRetired || j.Attempt != 1 {
			t.Errorf("job %s: attempt %d, last error %+v", id, j.Attempt, j.LastError)
		}
	}
	// The old tokens hold nothing.
	if _, err := f.m.Accept(f.ctx, lref); !errors.Is(err, lease.ErrLeaseLost) {
		t.Errorf("accept under the retired worker's lease: %v, want ErrLeaseLost", err)
	}
	// Granted nothing, whatever is queued; a heartbeat keeps it retired.
	if gs := f.lease(w, 4); len(gs) != 0 {
		t.Errorf("the retired worker leased %d jobs", len(gs))
	}
	hb, err := f.m.Heartbeat(f.ctx, w.ID, "idle", nil)
	if err != nil || hb.Status != lease.StatusRetired {
		t.Errorf("Heartbeat: %+v, %v", hb, err)
	}
	if gs := f.lease(other, 4); len(gs) != 2 {
		t.Errorf("the other worker leased %d jobs, want the 2 queued again", len(gs))
	}
	// Again: nothing changes.
	got, changed, ended, err = f.m.Retire(f.ctx, w.ID, "again")
	if err != nil || changed || len(ended) != 0 || got.Status != lease.StatusRetired {
		t.Errorf("Retire again: %+v, changed %v, ended %v, %v", got, changed, ended, err)
	}
	if _, _, _, err := f.m.Retire(f.ctx, "wrk_nobody", ""); !errors.Is(err, lease.ErrNotFound) {
		t.Errorf("Retire an unknown worker: %v, want ErrNotFound", err)
	}
}
