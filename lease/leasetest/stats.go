package leasetest

import (
	"errors"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/nodelane/nodelane/lease"
)

var statsTests = []test{
	{"Counts", testStatsCounts},
}

// Stats counts the queued, leased and running jobs by state and type
// (ended jobs not at all), and the workers by liveness. A store that
// does not implement lease.StatsCounter answers ErrNoStats.
func testStatsCounts(t *testing.T, f *fixture) {
	if _, ok := f.store.(lease.StatsCounter); !ok {
		if _, err := f.m.Stats(f.ctx); !errors.Is(err, lease.ErrNoStats) {
			t.Fatalf("Stats on a store that counts nothing: %v, want ErrNoStats", err)
		}
		return
	}
	empty, err := f.m.Stats(f.ctx)
	if err != nil {
		t.Fatalf("Stats of an empty store: %v", err)
	}
	if len(empty.Jobs) != 0 || !cmp.Equal(empty.Workers, map[lease.Liveness]int{lease.LivenessOnline: 0, lease.LivenessStale: 0, lease.LivenessOffline: 0}) {
		t.Fatalf("Stats of an empty store = %+v", empty)
	}
	for range 3 {
		f.enqueue("status_check")
	}
	f.enqueue("lora_train")
	f.enqueue("lora_train")
	f.defaultWorker("gone")
	f.clock.Advance(offlineAfter)
	f.defaultWorker("quiet")
	f.clock.Advance(hbInterval + hbInterval/2 + time.Microsecond)
	w := f.defaultWorker("busy")
	gs := f.lease(w, 3)
	if len(gs) != 3 || gs[0].Job.Type != "status_check" || gs[2].Job.Type != "status_check" {
		t.Fatalf("leased %d jobs, want the 3 status_check", len(gs))
	}
	refs := make([]lease.Ref, 3)
	for i, g := range gs {
		refs[i] = lease.Ref{JobID: g.Job.ID, WorkerID: w.ID, Token: g.Token}
	}
	f.accept(refs[0])
	f.accept(refs[1])
	f.complete(refs[0], lease.Result{})

	got, err := f.m.Stats(f.ctx)
	if err != nil {
		t.Fatalf("Stats: %v", err)
	}
	want := &lease.Stats{
		Jobs: []lease.JobCount{
			{State: lease.StateQueued, Type: "lora_train", N: 2},
			{State: lease.StateLeased, Type: "status_check", N: 1},
			{State: lease.StateRunning, Type: "status_check", N: 1},
		},
		Workers: map[lease.Liveness]int{lease.LivenessOnline: 1, lease.LivenessStale: 1, lease.LivenessOffline: 1},
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Fatalf("Stats (-want +got):\n%s", diff)
	}
}
