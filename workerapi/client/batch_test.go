package client_test

import (
	"bytes"
	"context"
	"crypto/ed25519"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nodelane/nodelane/internal/apitest"
	"github.com/nodelane/nodelane/internal/waitfor"
	"github.com/nodelane/nodelane/lease"
	"github.com/nodelane/nodelane/receipts"
	"github.com/nodelane/nodelane/replay"
	"github.com/nodelane/nodelane/workerapi/client"
	"github.com/nodelane/nodelane/workerapi/wire"
)

// Lease with accept and the batch complete, from the Client and the
// Runner, against the real handler over HTTP; and the Runner against a
// server older than both.

func TestClientLeaseAcceptAndCompleteBatch(t *testing.T) {
	t.Parallel()
	p := newClProxy(t)
	ctx := context.Background()
	c := newClClient(t, p.URL, nil)
	clRegister(t, p, c, "node-batch")
	for range 3 {
		p.env.Enqueue(t, lease.NewJob{Type: "status_check"})
	}
	lr, err := c.Lease(ctx, wire.LeaseRequest{MaxJobs: 3, Accept: true})
	if err != nil {
		t.Fatal(err)
	}
	if len(lr.Leases) != 3 {
		t.Fatalf("%d grants", len(lr.Leases))
	}
	var cs []wire.Completion
	for _, g := range lr.Leases {
		if g.Job.State != wire.JobStateRunning {
			t.Errorf("grant %s is %s, want running", g.Job.ID, g.Job.State)
		}
		cs = append(cs, wire.Completion{JobID: g.Job.ID, CompleteRequest: wire.CompleteRequest{LeaseToken: g.LeaseToken}})
	}
	// A completion under another job's token is refused alone.
	cs = append(cs, wire.Completion{JobID: lr.Leases[0].Job.ID, CompleteRequest: wire.CompleteRequest{LeaseToken: lr.Leases[1].LeaseToken}})
	out, err := c.CompleteBatch(ctx, wire.CompleteBatchRequest{Completions: cs})
	if err != nil {
		t.Fatal(err)
	}
	for i, r := range out.Results[:3] {
		if err := client.CompletionError(&r); err != nil || r.Completed.ReceiptID == "" {
			t.Errorf("result %d: %+v, %v", i, r, err)
		}
		if j := p.env.Job(t, r.JobID); j.State != lease.StateSucceeded || j.ReceiptID != r.Completed.ReceiptID {
			t.Errorf("job %s as stored: %s %q", j.ID, j.State, j.ReceiptID)
		}
	}
	last := out.Results[3]
	err = client.CompletionError(&last)
	var ae *client.APIError
	if !client.IsLeaseLost(err) || client.IsRetryable(err) || !errors.As(err, &ae) || ae.Status != http.StatusConflict || ae.Message == "" {
		t.Errorf("the refused completion: %+v, %v", last, err)
	}
	if n := len(p.requests("/accept")); n != 0 {
		t.Errorf("%d accept requests after a lease with accept", n)
	}

	// Sent again, the same receipts.
	again, err := c.CompleteBatch(ctx, wire.CompleteBatchRequest{Completions: cs[:3]})
	if err != nil {
		t.Fatal(err)
	}
	for i, r := range again.Results {
		if !r.OK || r.Completed.ReceiptID != out.Results[i].Completed.ReceiptID {
			t.Errorf("again, result %d: %+v", i, r)
		}
	}

	// A batch malformed as a whole is one 400 for all, not retried.
	p.reset()
	over := cs[0]
	over.FinalMessage = new(string)
	*over.FinalMessage = strings.Repeat("m", wire.MaxMessageBytes+1)
	_, err = c.CompleteBatch(ctx, wire.CompleteBatchRequest{Completions: []wire.Completion{cs[1], over}})
	if client.ErrorCode(err) != wire.CodeInvalidRequest || client.IsRetryable(err) {
		t.Errorf("over a limit: %v", err)
	}
	if n := len(p.requests(wire.PathCompleteBatch)); n != 1 {
		t.Errorf("%d attempts of a 400", n)
	}
}

// clBarrier holds handlers until n of them run, so that their jobs end
// together.
type clBarrier struct {
	n       int
	mu      sync.Mutex
	running int
	all     chan struct{}
}

func newClBarrier(n int) *clBarrier { return &clBarrier{n: n, all: make(chan struct{})} }

func (b *clBarrier) handler(ctx context.Context, job *wire.Job, r *client.Reporter) error {
	b.mu.Lock()
	if b.running++; b.running == b.n {
		close(b.all)
	}
	b.mu.Unlock()
	select {
	case <-b.all:
	case <-ctx.Done():
		return context.Cause(ctx)
	}
	r.SetOutput("", map[string]string{"job": job.ID}, "done")
	return nil
}

// wantSucceeded waits for each job's end and checks it succeeded, with a
// receipt, in the JobEnd and in the store.
func wantSucceeded(t *testing.T, cw *clWorker, env *apitest.Env, jobs []*lease.Job) {
	t.Helper()
	for _, j := range jobs {
		e := cw.end(t, j.ID)
		if e.Outcome != client.JobSucceeded || e.Err != nil || e.Complete == nil || e.Complete.ReceiptID == "" ||
			e.Complete.Job.ID != j.ID || e.Complete.Job.State != wire.JobStateSucceeded ||
			e.Complete.Job.ReceiptID == nil || *e.Complete.Job.ReceiptID != e.Complete.ReceiptID {
			t.Errorf("job %s ended %+v", j.ID, e)
			continue
		}
		if got := env.Job(t, j.ID); got.State != lease.StateSucceeded || got.ReceiptID != e.Complete.ReceiptID || got.Attempt != 1 {
			t.Errorf("job %s as stored: %s %q attempt %d", j.ID, got.State, got.ReceiptID, got.Attempt)
		}
	}
}

// runTogether starts a Runner of node that runs n status_check jobs at
// once, each ending when all have started, with mod applied to its
// config, enqueues n jobs and waits for them to succeed.
func runTogether(t *testing.T, node string, n int, mod func(*client.RunnerConfig)) (*clProxy, *clWorker, []*lease.Job) {
	t.Helper()
	p := newClProxy(t)
	b := newClBarrier(n)
	cw := startClWorker(t, p, node, func(c *client.RunnerConfig) {
		c.MaxConcurrent = n
		c.Registration.GovernorLimits.MaxJobs = n
		mod(c)
	}, map[string]client.HandlerFunc{"status_check": b.handler})
	var jobs []*lease.Job
	for range n {
		jobs = append(jobs, p.env.Enqueue(t, lease.NewJob{Type: "status_check"}))
	}
	wantSucceeded(t, cw, p.env, jobs)
	return p, cw, jobs
}

func TestClientRunnerLeasesAcceptingAndBatchesCompletes(t *testing.T) {
	t.Parallel()
	const n = 8
	p, cw, jobs := runTogether(t, "node-runner-batch", n, func(c *client.RunnerConfig) {
		// Wide, so that the jobs that end together surely share a batch.
		c.CompleteWindow = 200 * time.Millisecond
	})
	if got := p.requests("/accept"); len(got) != 0 {
		t.Errorf("the Runner accepted %d jobs that the lease accepted", len(got))
	}
	batches, singles := 0, 0
	for _, s := range p.requests("/complete") {
		if s.status != http.StatusOK {
			t.Errorf("a completion answered %+v", s)
		}
		if s.path == wire.PathCompleteBatch {
			batches++
		} else {
			singles++
		}
	}
	if batches == 0 || batches+singles >= n {
		t.Errorf("%d jobs completed in %d batch and %d single requests: not batched", n, batches, singles)
	}
	// By default a completion does not wait for its proofs.
	for _, j := range jobs {
		if c := cw.end(t, j.ID).Complete; len(c.Receipts) != 2 || len(c.Proofs) != 0 || c.Checkpoint != "" {
			t.Errorf("job %s: %d receipts, %d proofs, checkpoint %q: want its receipts and no proofs", j.ID, len(c.Receipts), len(c.Proofs), c.Checkpoint)
		}
	}
}

// TestClientRunnerWaitsForProofs checks that RunnerConfig.WaitForProofs
// makes every completion, alone or in a batch, come with the proofs of
// its receipts, which verify offline.
func TestClientRunnerWaitsForProofs(t *testing.T) {
	t.Parallel()
	p, cw, jobs := runTogether(t, "node-runner-proofs", 4, func(c *client.RunnerConfig) { c.WaitForProofs = true })
	key, origin := p.env.Server.ReceiptVerifierKey(), p.env.Config.Origin
	for _, j := range jobs {
		c := cw.end(t, j.ID).Complete
		if len(c.Receipts) != 2 || len(c.Proofs) != 2 || c.Checkpoint == "" {
			t.Fatalf("job %s: %d receipts, %d proofs, checkpoint %q: want proofs", j.ID, len(c.Receipts), len(c.Proofs), c.Checkpoint)
		}
		for i, r := range c.Receipts {
			if rc, err := receipts.Verify(key, origin, r.Body, c.Proofs[i], []byte(c.Checkpoint)); err != nil || rc.JobID != j.ID {
				t.Errorf("job %s: receipt %s: %+v, %v", j.ID, r.ID, rc, err)
			}
		}
	}
}

// oldServer serves an Env's handler as a server older than lease with
// accept and the batch complete would: it answers the batch route 404,
// as an unknown route, and leases without accepting (the lease body's
// accept is dropped and the request signed again with the node's key).
type oldServer struct {
	env *apitest.Env
	URL string
	key atomic.Pointer[ed25519.PrivateKey]

	mu     sync.Mutex
	paths  []string
	bodies [][]byte // lease bodies as forwarded
}

func newOldServer(t *testing.T) *oldServer {
	t.Helper()
	o := &oldServer{env: apitest.New(t, "sqlite")}
	h := o.env.Server.Handler()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		o.mu.Lock()
		o.paths = append(o.paths, r.URL.Path)
		o.mu.Unlock()
		switch r.URL.Path {
		case wire.PathCompleteBatch:
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(http.StatusNotFound)
			json.NewEncoder(w).Encode(wire.ErrorBody{Error: wire.ErrorDetail{Code: wire.CodeNotFound,
				Message: "no route " + r.URL.Path, ServerTime: time.Now().UTC()}})
		case wire.PathLease:
			o.lease(w, r)
		default:
			h.ServeHTTP(w, r)
		}
	}))
	t.Cleanup(srv.Close)
	o.URL = srv.URL
	return o
}

func (o *oldServer) lease(w http.ResponseWriter, r *http.Request) {
	body, err := io.ReadAll(r.Body)
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	var m map[string]any
	if err := json.Unmarshal(body, &m); err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	delete(m, "accept")
	body, _ = json.Marshal(m)
	o.mu.Lock()
	o.bodies = append(o.bodies, body)
	o.mu.Unlock()
	req, err := http.NewRequestWithContext(r.Context(), http.MethodPost, o.env.URL+wire.PathLease, bytes.NewReader(body))
	if err != nil {
		http.Error(w, err.Error(), http.StatusInternalServerError)
		return
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Authorization", r.Header.Get("Authorization"))
	if err := replay.NewSigner(*o.key.Load(), nil).Sign(req, body); err != nil {
		http.Error(w, err.Error(), http.StatusInternalServerError)
		return
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadGateway)
		return
	}
	defer resp.Body.Close()
	for k, v := range resp.Header {
		w.Header()[k] = v
	}
	w.WriteHeader(resp.StatusCode)
	io.Copy(w, resp.Body)
}

// count counts the requests whose path ends with suffix.
func (o *oldServer) count(suffix string) int {
	o.mu.Lock()
	defer o.mu.Unlock()
	n := 0
	for _, p := range o.paths {
		if strings.HasSuffix(p, suffix) {
			n++
		}
	}
	return n
}

func TestClientRunnerOlderServer(t *testing.T) {
	t.Parallel()
	const n = 4
	o := newOldServer(t)
	b := newClBarrier(n)
	c := newClClient(t, o.URL, nil)
	key := c.Identity().Key()
	o.key.Store(&key)
	reg := clRegistration("node-old-server")
	reg.GovernorLimits.MaxJobs = n
	var (
		mu   sync.Mutex
		ends = map[string]client.JobEnd{}
	)
	w, err := client.NewRunner(c, &client.RunnerConfig{
		ProvisioningToken: o.env.ProvisioningToken, Registration: &reg, MaxConcurrent: n,
		WaitSeconds: 1, IdlePoll: 100 * time.Millisecond, HeartbeatInterval: 100 * time.Millisecond,
		CompleteWindow: 200 * time.Millisecond, DrainTimeout: 5 * time.Second, DrainGrace: time.Second,
		OnJobEnd: func(e client.JobEnd) {
			mu.Lock()
			defer mu.Unlock()
			ends[e.Job.ID] = e
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	w.Handle("status_check", b.handler)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- w.Run(ctx) }()
	defer func() {
		cancel()
		select {
		case <-done:
		case <-time.After(20 * time.Second):
			t.Error("the worker did not stop")
		}
	}()
	var jobs []*lease.Job
	for range n {
		jobs = append(jobs, o.env.Enqueue(t, lease.NewJob{Type: "status_check"}))
	}
	for _, j := range jobs {
		var e client.JobEnd
		waitfor.Until(t, "job "+j.ID+" to end", func() bool {
			mu.Lock()
			defer mu.Unlock()
			e = ends[j.ID]
			return e.Outcome != ""
		})
		if e.Outcome != client.JobSucceeded || e.Complete == nil || e.Complete.Job.ID != j.ID || e.Complete.ReceiptID == "" {
			t.Errorf("job %s ended %+v", j.ID, e)
		}
		if got := o.env.Job(t, j.ID); got.State != lease.StateSucceeded {
			t.Errorf("job %s as stored: %s", j.ID, got.State)
		}
	}
	// The Runner asked to accept, was granted leased jobs, and accepted
	// each; the batch route answered 404 once, and each job was then
	// completed alone.
	o.mu.Lock()
	for _, body := range o.bodies {
		if bytes.Contains(body, []byte("accept")) {
			t.Errorf("the old server was sent %s", body)
		}
	}
	leases := len(o.bodies)
	o.mu.Unlock()
	if leases == 0 {
		t.Error("no lease reached the old server")
	}
	if got := o.count("/accept"); got != n {
		t.Errorf("%d accept requests for %d jobs", got, n)
	}
	if got := o.count(wire.PathCompleteBatch); got != 1 {
		t.Errorf("%d batch requests, want the 1 that found no route", got)
	}
	singles := 0
	for _, j := range jobs {
		singles += o.count(wire.JobPath(j.ID, wire.ActionComplete))
	}
	if singles != n {
		t.Errorf("%d single completions for %d jobs", singles, n)
	}
}
