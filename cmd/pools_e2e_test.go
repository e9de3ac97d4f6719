package cmd

import (
	"slices"
	"testing"

	"github.com/nodelane/nodelane/cmd/internal/jobs"
	"github.com/nodelane/nodelane/workerapi/wire"
)

// TestE2EPools checks pools end to end (issue 13): a job dispatched with
// requirements.tags ["lab-a"] is never leased by a worker without that
// tag. The control plane and both workers are real processes: one worker
// registers the tag "example" only and polls all along, the other joins
// later with -tag lab-a.
func TestE2EPools(t *testing.T) {
	t.Parallel()
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
	// An untagged job dispatched after them runs on the plain worker: it
	// leased since they were queued, and was not given them.
	after := c.waitDone(c.dispatchTagged(nil).Job.ID, "succeeded")
	if after.Job.WorkerID == nil || *after.Job.WorkerID != plainID {
		t.Fatalf("untagged job ran on %v, want the plain worker %s", after.Job.WorkerID, plainID)
	}
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
	c.startWorkerVia("lab", c.base(), "-tag", "lab-a")
	labID := c.workerID("lab")
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
