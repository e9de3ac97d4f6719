package client_test

import (
	"context"
	"errors"
	"net/http"
	"testing"
	"time"

	"github.com/nodelane/nodelane/lease"
	"github.com/nodelane/nodelane/workerapi/client"
	"github.com/nodelane/nodelane/workerapi/wire"
)

// The Runner's control long-poll (POST /workers/signals): with a
// heartbeat interval of an hour, only it can bring a cancel, a ban, a
// retirement or a drain within the tests' waits.

// slowHeartbeats is a Runner whose heartbeats come once an hour, and whose
// lease long-polls wait 30 s.
func slowHeartbeats(c *client.RunnerConfig) {
	c.HeartbeatInterval = time.Hour
	c.WaitSeconds = 30
}

func operatorOK(t *testing.T, p *clProxy, path string) {
	t.Helper()
	if st, b := p.env.Operator(t, http.MethodPost, path, nil); st != http.StatusOK {
		t.Fatalf("POST %s: %d %s", path, st, b)
	}
}

// An operator's cancel reaches a running handler through the signals
// long-poll, though heartbeats come once an hour.
func TestRunnerSignalsCancel(t *testing.T) {
	t.Parallel()
	p := newClProxy(t)
	running := make(chan string, 1)
	causes := make(chan error, 1)
	cw := startClWorker(t, p, "node-signals-cancel", slowHeartbeats, map[string]client.HandlerFunc{
		"status_check": untilStopped(running, causes),
	})
	j := p.env.Enqueue(t, lease.NewJob{Type: "status_check"})
	clWait(t, running, "the handler")
	// From here every heartbeat fails: only the signals long-poll can
	// bring the cancel.
	p.inject(clFault{suffix: "/heartbeat", n: 1 << 20, status: http.StatusServiceUnavailable})
	start := time.Now()
	operatorOK(t, p, "/operator/jobs/"+j.ID+"/cancel")
	if cause := clWait(t, causes, "the cancel"); !errors.Is(cause, client.ErrJobCanceled) {
		t.Errorf("cause = %v", cause)
	}
	t.Logf("the cancel reached the handler after %v", time.Since(start))
	if e := cw.end(t, j.ID); e.Outcome != client.JobCanceled {
		t.Errorf("outcome %+v", e)
	}
	if got := p.env.Job(t, j.ID); got.State != lease.StateCanceled {
		t.Errorf("job: %s", got.State)
	}
	if len(p.requests("/workers/signals")) == 0 {
		t.Error("no signals request answered")
	}
}

// A worker banned while its lease long-poll waits stops with the ban
// (Run returns worker_banned), and a job enqueued right after the ban is
// granted to nobody: it stays queued.
func TestRunnerSignalsBanDuringLeaseLongPoll(t *testing.T) {
	t.Parallel()
	p := newClProxy(t)
	ran := make(chan string, 1)
	cw := startClWorker(t, p, "node-signals-ban", slowHeartbeats, map[string]client.HandlerFunc{
		"status_check": func(ctx context.Context, job *wire.Job, r *client.Reporter) error {
			clSignal(ran, job.ID)
			return nil
		},
	})
	p.env.AwaitLongPolls(t, 2) // the signals long-poll and the lease long-poll
	id := cw.c.Identity().WorkerID()
	operatorOK(t, p, "/operator/workers/"+id+"/ban")
	j := p.env.Enqueue(t, lease.NewJob{Type: "status_check"})
	err := clWait(t, cw.done, "the Runner to stop")
	if !client.IsCode(err, wire.CodeWorkerBanned) {
		t.Errorf("Run = %v, want worker_banned", err)
	}
	select {
	case got := <-ran:
		t.Errorf("the banned worker ran job %s", got)
	default:
	}
	if got := p.env.Job(t, j.ID); got.State != lease.StateQueued || got.Lease != nil {
		t.Errorf("job after the ban: %s %+v", got.State, got.Lease)
	}
	cw.done <- err // for the cleanup
}

// A retirement stops the Runner at once, and its running job is stopped.
func TestRunnerSignalsRetire(t *testing.T) {
	t.Parallel()
	p := newClProxy(t)
	running := make(chan string, 1)
	causes := make(chan error, 1)
	cw := startClWorker(t, p, "node-signals-retire", slowHeartbeats, map[string]client.HandlerFunc{
		"status_check": untilStopped(running, causes),
	})
	j := p.env.Enqueue(t, lease.NewJob{Type: "status_check"})
	clWait(t, running, "the handler")
	operatorOK(t, p, "/operator/workers/"+cw.c.Identity().WorkerID()+"/retire")
	if cause := clWait(t, causes, "the handler to stop"); cause == nil {
		t.Error("the handler's context has no cause")
	}
	err := clWait(t, cw.done, "the Runner to stop")
	if !client.IsCode(err, wire.CodeWorkerBanned) && !client.IsCode(err, wire.CodeTokenRevoked) {
		t.Errorf("Run = %v, want worker_banned or token_revoked", err)
	}
	if got := p.env.Job(t, j.ID); got.State != lease.StateQueued || got.LastError == nil || got.LastError.Code != lease.CodeWorkerRetired {
		t.Errorf("job after the retirement: %s %+v", got.State, got.LastError)
	}
	cw.done <- err
}

// An operator's drain request drains the Runner: Run returns nil, and the
// job it ran finished normally.
func TestRunnerSignalsDrain(t *testing.T) {
	t.Parallel()
	p := newClProxy(t)
	running := make(chan string, 1)
	release := make(chan struct{})
	cw := startClWorker(t, p, "node-signals-drain", slowHeartbeats, map[string]client.HandlerFunc{
		"status_check": func(ctx context.Context, job *wire.Job, r *client.Reporter) error {
			clSignal(running, job.ID)
			select {
			case <-release:
				return nil
			case <-ctx.Done():
				return ctx.Err()
			}
		},
	})
	j := p.env.Enqueue(t, lease.NewJob{Type: "status_check"})
	clWait(t, running, "the handler")
	id := cw.c.Identity().WorkerID()
	operatorOK(t, p, "/operator/workers/"+id+"/drain")
	// Draining: leases nothing more, lets the job finish.
	other := p.env.Enqueue(t, lease.NewJob{Type: "status_check"})
	close(release)
	if e := cw.end(t, j.ID); e.Outcome != client.JobSucceeded {
		t.Errorf("the running job: %+v", e)
	}
	if err := clWait(t, cw.done, "the Runner to drain"); err != nil {
		t.Errorf("Run = %v, want nil after a drain", err)
	}
	if got := p.env.Job(t, other.ID); got.State != lease.StateQueued {
		t.Errorf("a job queued during the drain: %s", got.State)
	}
	cw.done <- nil
}
