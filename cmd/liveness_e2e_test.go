package cmd

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"sync"
	"testing"
	"time"

	"github.com/nodelane/nodelane/internal/waitfor"
	"github.com/nodelane/nodelane/receipts"
	"github.com/nodelane/nodelane/workerapi/client"
	"github.com/nodelane/nodelane/workerapi/wire"
)

// leaseTap is a reverse proxy on loopback between a worker process and
// the control plane that keeps the lease tokens the control plane grants
// the worker (the worker never shows them), so that a test can use one
// after the worker is gone. It passes every request through unchanged,
// Host included, so the worker's signatures (over @authority) verify.
type leaseTap struct {
	URL string

	mu     sync.Mutex
	tokens map[string]string // job id -> its latest lease token
}

func newLeaseTap(t *testing.T, target string) *leaseTap {
	t.Helper()
	u, err := url.Parse(target)
	if err != nil {
		t.Fatal(err)
	}
	tap := &leaseTap{tokens: map[string]string{}}
	rp := httputil.NewSingleHostReverseProxy(u) // keeps the incoming Host
	rp.ModifyResponse = func(resp *http.Response) error {
		if resp.Request.URL.Path != wire.PathLease || resp.StatusCode != http.StatusOK {
			return nil
		}
		b, err := io.ReadAll(resp.Body)
		resp.Body.Close()
		if err != nil {
			return err
		}
		resp.Body = io.NopCloser(bytes.NewReader(b))
		var lr wire.LeaseResponse
		if json.Unmarshal(b, &lr) == nil {
			tap.mu.Lock()
			for _, g := range lr.Leases {
				tap.tokens[g.Job.ID] = g.LeaseToken
			}
			tap.mu.Unlock()
		}
		return nil
	}
	srv := httptest.NewServer(rp)
	t.Cleanup(srv.Close)
	tap.URL = srv.URL
	return tap
}

func (tap *leaseTap) token(jobID string) string {
	tap.mu.Lock()
	defer tap.mu.Unlock()
	return tap.tokens[jobID]
}

// TestE2EWorkerOffline is issue 12's acceptance: a worker SIGKILLed
// mid-job, with -heartbeat-interval 1s -offline-after 3s (and a lease TTL
// of 600 s, so that only liveness can free the job): within 5 s of the
// kill its job is back in the queue and the worker reads offline; the old
// lease token gets 409 lease_lost; another worker then runs the job to
// the end.
func TestE2EWorkerOffline(t *testing.T) {
	t.Parallel()
	c := newCluster(t, "-heartbeat-interval", "1s", "-offline-after", "3s", "-lease-ttl", "600s", "-accept-timeout", "60s")
	c.activate()
	tap := newLeaseTap(t, c.base())
	w1 := c.startWorkerVia("node-1", tap.URL)
	wid1 := c.workerID("node-1")

	// 3 s a run: the kill comes after its first step, 2.5 s before its end.
	d := c.dispatch("lora_train", map[string]any{"steps": 6, "step_ms": 500})
	waitfor.Within(c.t, jobTimeout, "lora_train running with progress on node-1", func() bool {
		var jd wire.JobDetailResponse
		return c.try("GET", "/operator/jobs/"+d.Job.ID, nil, &jd) == nil && jd.Job.State == "running" && progressEvents(jd) >= 1
	})
	var before wire.WorkerDetailResponse
	c.call("GET", "/operator/workers/"+wid1, nil, &before)
	if before.Worker.Liveness != wire.LivenessOnline {
		t.Errorf("a heartbeating worker reads %q, want online", before.Worker.Liveness)
	}
	oldToken := tap.token(d.Job.ID)
	if oldToken == "" {
		t.Fatal("the tap saw no lease token for the job")
	}

	w1.kill()
	killed := time.Now()
	var (
		jd     wire.JobDetailResponse
		wd     wire.WorkerDetailResponse
		within time.Duration
	)
	waitfor.Within(c.t, jobTimeout, "the job back in the queue and the worker offline", func() bool {
		if c.try("GET", "/operator/jobs/"+d.Job.ID, nil, &jd) != nil || c.try("GET", "/operator/workers/"+wid1, nil, &wd) != nil {
			return false
		}
		within = time.Since(killed)
		return jd.Job.State == "queued" && wd.Worker.Liveness == wire.LivenessOffline
	})
	if within > 5*time.Second {
		t.Errorf("the job was requeued and the worker read offline %v after the kill, over the 5 s the issue allows", within)
	}
	t.Logf("requeued and offline %v after the kill", within)
	if jd.Job.LastError == nil || jd.Job.LastError.Code != "worker_offline" || jd.Job.Attempt != 2 {
		t.Errorf("requeued job: attempt %d, last error %+v; want attempt 2 (it was accepted), worker_offline", jd.Job.Attempt, jd.Job.LastError)
	}
	if wd.Worker.Status == "" || !wd.Worker.LastSeenAt.Before(killed) || len(wd.Leases) != 0 {
		t.Errorf("offline worker: status %q, last_seen_at %v (killed at %v), leases %v", wd.Worker.Status, wd.Worker.LastSeenAt, killed, wd.Leases)
	}

	// The old lease token, signed with the dead worker's own key and
	// token, gets 409 lease_lost.
	id, err := client.LoadOrCreateIdentity(c.identityPath("node-1"))
	if err != nil {
		t.Fatal(err)
	}
	cl, err := client.New(c.base(), &client.Config{Identity: id})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	_, err = cl.Status(ctx, d.Job.ID, wire.StatusRequest{LeaseToken: oldToken, EventType: "progress", Message: "back from the dead"})
	var ae *client.APIError
	if !errors.As(err, &ae) || ae.Status != http.StatusConflict || ae.Code != wire.CodeLeaseLost {
		t.Errorf("status with the old lease token: %v, want 409 %s", err, wire.CodeLeaseLost)
	}
	if _, err = cl.Complete(ctx, d.Job.ID, wire.CompleteRequest{LeaseToken: oldToken}); !client.IsLeaseLost(err) {
		t.Errorf("complete with the old lease token: %v, want 409 %s", err, wire.CodeLeaseLost)
	}

	// Another worker takes the job (after its retry backoff, short here:
	// -retry-base) and ends it.
	c.startWorker("node-2")
	wid2 := c.workerID("node-2")
	done := c.waitDone(d.Job.ID, "succeeded")
	if done.Job.WorkerID == nil || *done.Job.WorkerID != wid2 {
		t.Errorf("the job was finished by %v, want the second worker %s", done.Job.WorkerID, wid2)
	}
	c.checkSucceeded(done)
	if n := len(c.receiptsOf(receipts.KindJobCompleted, d.Job.ID)); n != 1 {
		t.Fatalf("%d job_completed receipts for the job, want exactly 1", n)
	}
	c.checkNoTokensLogged()
}
