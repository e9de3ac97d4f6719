package examples

import (
	"context"
	"errors"
	"log/slog"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/nodelane/nodelane/examples/internal/jobs"
	"github.com/nodelane/nodelane/workerapi/client"
	"github.com/nodelane/nodelane/workerapi/wire"
)

// Pools end to end (issue 13): a job dispatched with requirements.tags
// ["lab-a"] is never leased by a worker without that tag. The control
// plane is a real examples/server process; the worker outside the pool
// is a real examples/worker process (it registers the tag "example"
// only), polling all along; the worker in the pool is a
// workerapi/client Runner in this process, with the example handlers,
// registered with the tags "example" and "lab-a", over real HTTP on
// loopback. (examples/worker has no flag for tags yet; once it has one,
// both workers can be processes.)
func TestE2EPools(t *testing.T) {
	c := newCluster(t)
	plain := c.startWorker("plain")
	plainID := c.workerID("plain")

	// The plain worker is alive and leasing: it runs an untagged job.
	warm := c.dispatchTagged(nil)
	if d := c.waitDone(warm.Job.ID, "succeeded"); d.Job.WorkerID == nil || *d.Job.WorkerID != plainID {
		t.Fatalf("untagged job ran on %v, want the plain worker %s", d.Job.WorkerID, plainID)
	}

	// Jobs for pool lab-a wait while only the plain worker polls.
	const n = 6
	var ids []string
	for range n {
		d := c.dispatchTagged([]string{"lab-a"})
		if d.Leasable || d.Reason != "no registered worker that supports status_check has tags lab-a" {
			t.Fatalf("dispatch to lab-a with no worker in it: leasable %v, reason %q", d.Leasable, d.Reason)
		}
		if !slices.Equal(d.Job.Requirements.Tags, []string{"lab-a"}) {
			t.Fatalf("dispatched job's tags: %q", d.Job.Requirements.Tags)
		}
		ids = append(ids, d.Job.ID)
	}
	time.Sleep(3 * time.Second) // more than one long-poll of the plain worker (-wait-seconds 2)
	for _, id := range ids {
		if d := c.job(id); d.Job.State != "queued" || d.Job.WorkerID != nil {
			t.Fatalf("job %s, tagged lab-a, is %s on %v with no worker in the pool", id, d.Job.State, d.Job.WorkerID)
		}
	}
	if plain.exited() {
		t.Fatalf("the plain worker exited: %s", plain.stderr.String())
	}

	// A worker in the pool joins and runs them all; untagged jobs
	// dispatched meanwhile may go to either.
	labID, stop := c.startPoolRunner(t, "lab", "example", "lab-a")
	defer stop()
	var plainJobs []string
	for range 3 {
		plainJobs = append(plainJobs, c.dispatchTagged(nil).Job.ID)
	}
	for _, id := range ids {
		d := c.waitDone(id, "succeeded")
		if d.Job.WorkerID == nil || *d.Job.WorkerID != labID {
			t.Errorf("job %s, tagged lab-a, ran on %v, want the lab worker %s", id, d.Job.WorkerID, labID)
		}
		if !slices.Equal(d.Job.Requirements.Tags, []string{"lab-a"}) {
			t.Errorf("job %s shows tags %q", id, d.Job.Requirements.Tags)
		}
		c.checkSucceeded(d)
	}
	for _, id := range plainJobs {
		c.waitDone(id, "succeeded")
	}
	if plain.exited() {
		t.Fatalf("the plain worker exited: %s", plain.stderr.String())
	}
}

// dispatchTagged dispatches a status_check job with tags.
func (c *cluster) dispatchTagged(tags []string) wire.DispatchResponse {
	c.t.Helper()
	var d wire.DispatchResponse
	c.call("POST", "/operator/jobs", wire.DispatchRequest{JobType: jobs.StatusCheck, Payload: []byte(`{}`),
		Requirements: wire.Requirements{Tags: tags}, MaxAttempts: 5}, &d)
	return d
}

// startPoolRunner runs, in this process, a worker with the example
// handlers registered as node with tags, and returns its worker id and a
// function that stops it (drained) and waits for it.
func (c *cluster) startPoolRunner(t *testing.T, node string, tags ...string) (string, func()) {
	t.Helper()
	id, err := client.LoadOrCreateIdentity(c.identityPath(node))
	if err != nil {
		t.Fatal(err)
	}
	log := slog.New(slog.NewTextHandler(&syncBuffer{}, nil))
	cl, err := client.New(c.base(), &client.Config{Identity: id, Logger: log})
	if err != nil {
		t.Fatal(err)
	}
	reg := jobs.Registration(node, node, []wire.GPU{{SKU: "rtx-4090", VRAMMB: 24576}}, 2)
	reg.Tags = tags
	r, err := client.NewRunner(cl, &client.RunnerConfig{
		MaxConcurrent: 2, ProvisioningToken: c.tokens.ProvisioningToken, Registration: reg,
		WaitSeconds: 2, DrainTimeout: 5 * time.Second, Logger: log,
	})
	if err != nil {
		t.Fatal(err)
	}
	jobs.Register(r, filepath.Join(c.dir, "work-"+node))
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- r.Run(ctx) }()
	wid := c.workerID(node)
	return wid, func() {
		cancel()
		select {
		case err := <-done:
			if err != nil && !errors.Is(err, context.Canceled) {
				t.Errorf("the %s runner: %v", node, err)
			}
		case <-time.After(30 * time.Second):
			t.Errorf("the %s runner did not stop", node)
		}
	}
}
