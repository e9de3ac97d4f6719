package client_test

import (
	"context"
	"net/http"
	"testing"
	"time"

	"github.com/nodelane/nodelane/internal/waitfor"
	"github.com/nodelane/nodelane/lease"
	"github.com/nodelane/nodelane/workerapi/client"
	"github.com/nodelane/nodelane/workerapi/wire"
)

// A Runner that starts with a token it already has calls start: the job
// its previous run held (running, here) goes back to the queue at once
// (worker_restarted) rather than at its lease's expiry, and a job type it
// handles now but did not register is leasable at once.
func TestClientRunnerStartReconciles(t *testing.T) {
	t.Parallel()
	p := newClProxy(t)
	c := newClClient(t, p.URL, nil)
	clRegister(t, p, c, "node-restart")
	old := p.env.Enqueue(t, lease.NewJob{Type: "status_check"})
	got, err := c.Lease(context.Background(), wire.LeaseRequest{MaxJobs: 1, Accept: true})
	if err != nil || len(got.Leases) != 1 || got.Leases[0].Job.ID != old.ID || got.ServerTime.IsZero() {
		t.Fatalf("lease = %+v, %v", got, err)
	}
	// The previous run died holding it. The new run handles a new type.
	reg := clRegistration("node-restart")
	reg.Capabilities.JobTypes = nil // from the handlers
	done := make(chan string, 4)
	w, err := client.NewRunner(c, &client.RunnerConfig{
		ProvisioningToken: p.env.ProvisioningToken, Registration: &reg, MaxConcurrent: 2, WaitSeconds: 1,
		IdlePoll: 100 * time.Millisecond, HeartbeatInterval: 100 * time.Millisecond, DrainTimeout: 5 * time.Second, DrainGrace: time.Second,
		OnJobEnd: func(e client.JobEnd) { done <- e.Job.ID },
	})
	if err != nil {
		t.Fatal(err)
	}
	h := func(ctx context.Context, job *wire.Job, r *client.Reporter) error { return nil }
	w.Handle("status_check", h)
	w.Handle("telemetry_sync", h)
	ctx, cancel := context.WithCancel(context.Background())
	runErr := make(chan error, 1)
	go func() { runErr <- w.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		select {
		case <-runErr:
		case <-time.After(20 * time.Second):
			t.Error("the worker did not stop")
		}
	})
	// The proxy records the start request once its answer is written,
	// after the job ended in its transaction.
	var j *lease.Job
	waitfor.Until(t, "the start request to end the job the previous run held (worker_restarted)", func() bool {
		j = p.env.Job(t, old.ID)
		return j.LastError != nil && j.LastError.Code == lease.CodeWorkerRestarted && len(p.requests(wire.PathStart)) > 0
	})
	if j.Attempt != 2 {
		t.Errorf("the running job's attempt is %d, want 2 (an attempt used)", j.Attempt)
	}
	if n := len(p.requests(wire.PathStart)); n != 1 {
		t.Errorf("%d start requests, want 1", n)
	}
	if n := len(p.requests(wire.PathRegister)); n != 1 {
		t.Errorf("%d register requests, want 1 (the first run's)", n)
	}
	fresh := p.env.Enqueue(t, lease.NewJob{Type: "telemetry_sync"})
	if id := waitfor.Receive(t, "the new job type to run", done); id != fresh.ID {
		t.Fatalf("ended %s, want %s", id, fresh.ID)
	}
	if j := p.env.Job(t, fresh.ID); j.State != lease.StateSucceeded {
		t.Fatalf("the new type's job: %s", j.State)
	}
	// The heartbeats carry leases_through once a lease answer came: the
	// job run above was not ended by them (it succeeded), and they are
	// answered 200. The job may end before the first heartbeat is sent.
	waitfor.Until(t, "a heartbeat answered 200", func() bool {
		hb := p.requests(wire.PathHeartbeat)
		return len(hb) > 0 && hb[len(hb)-1].status == http.StatusOK
	})
}
