package client_test

import (
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"log"
	"net/http"
	"net/http/httptest"
	"os"
	"os/signal"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/nodelane/nodelane/credential"
	"github.com/nodelane/nodelane/internal/apitest"
	"github.com/nodelane/nodelane/internal/waitfor"
	"github.com/nodelane/nodelane/lease"
	"github.com/nodelane/nodelane/workerapi"
	"github.com/nodelane/nodelane/workerapi/client"
	"github.com/nodelane/nodelane/workerapi/wire"
)

// The Client and the Runner runtime against the real handler over HTTP
// (internal/apitest on SQLite), behind a proxy that can inject failures.

// clFault makes the next n requests whose path ends with suffix fail
// with status. With after set, the request first reaches the real handler
// (which acts on it and consumes its nonce) and only its answer is
// replaced: the client cannot tell whether it was done.
type clFault struct {
	suffix     string
	n          int
	status     int
	retryAfter string
	after      bool
}

// clSeen is one request the proxy saw.
type clSeen struct {
	path   string
	nonce  string
	status int
	code   string
}

// clProxy sits in front of an Env's handler.
type clProxy struct {
	env *apitest.Env
	URL string

	mu     sync.Mutex
	faults []*clFault
	seen   []clSeen
}

var clNonceRE = regexp.MustCompile(`nonce="([^"]+)"`)

func newClProxy(t *testing.T, opts ...apitest.Option) *clProxy {
	t.Helper()
	env := apitest.New(t, "sqlite", opts...)
	p := &clProxy{env: env}
	h := env.Server.Handler()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		nonce := ""
		if m := clNonceRE.FindStringSubmatch(r.Header.Get("Signature-Input")); m != nil {
			nonce = m[1]
		}
		var f *clFault
		p.mu.Lock()
		for _, x := range p.faults {
			if x.n > 0 && strings.HasSuffix(r.URL.Path, x.suffix) {
				x.n--
				f = x
				break
			}
		}
		p.mu.Unlock()
		rec := httptest.NewRecorder()
		if f == nil || f.after {
			h.ServeHTTP(rec, r)
		}
		status, body := rec.Code, rec.Body.Bytes()
		hdr := rec.Header()
		if f != nil {
			status = f.status
			hdr = http.Header{"Content-Type": {"application/json"}}
			if f.retryAfter != "" {
				hdr.Set("Retry-After", f.retryAfter)
			}
			body, _ = json.Marshal(wire.ErrorBody{Error: wire.ErrorDetail{
				Code: "injected", Message: "injected failure", ServerTime: env.Clock.Now().UTC()}})
		}
		var eb wire.ErrorBody
		_ = json.Unmarshal(body, &eb)
		p.mu.Lock()
		p.seen = append(p.seen, clSeen{path: r.URL.Path, nonce: nonce, status: status, code: eb.Error.Code})
		p.mu.Unlock()
		for k, v := range hdr {
			w.Header()[k] = v
		}
		w.WriteHeader(status)
		w.Write(body)
	}))
	t.Cleanup(srv.Close)
	p.URL = srv.URL
	return p
}

func (p *clProxy) inject(f clFault) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.faults = append(p.faults, &f)
}

// requests returns what the proxy saw for paths ending with suffix.
func (p *clProxy) requests(suffix string) []clSeen {
	p.mu.Lock()
	defer p.mu.Unlock()
	var out []clSeen
	for _, s := range p.seen {
		if strings.HasSuffix(s.path, suffix) {
			out = append(out, s)
		}
	}
	return out
}

// okHeartbeats counts the heartbeats the proxy saw answered 200.
func (p *clProxy) okHeartbeats() int {
	n := 0
	for _, h := range p.requests(wire.PathHeartbeat) {
		if h.status == http.StatusOK {
			n++
		}
	}
	return n
}

func (p *clProxy) reset() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.seen = nil
}

// newClClient returns a Client with a fresh in-memory identity and quick
// retries.
func newClClient(t *testing.T, url string, mod func(*client.Config)) *client.Client {
	t.Helper()
	_, key, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	id, err := client.NewIdentity(key)
	if err != nil {
		t.Fatal(err)
	}
	cfg := &client.Config{Identity: id, RetryBase: 10 * time.Millisecond, RetryMax: 100 * time.Millisecond}
	if mod != nil {
		mod(cfg)
	}
	c, err := client.New(url, cfg)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func clRegistration(node string) wire.RegisterRequest {
	return wire.RegisterRequest{
		NodeID: node, Name: node, Hostname: node + ".local", Role: "local_gpu_compute",
		Capabilities:   wire.Capabilities{JobTypes: []string{"status_check"}},
		GovernorLimits: wire.GovernorLimits{MaxJobs: 4},
		Version:        "worker/test", HeartbeatIntervalSeconds: 1,
	}
}

func clRegister(t *testing.T, p *clProxy, c *client.Client, node string) {
	t.Helper()
	if _, err := c.Register(context.Background(), p.env.ProvisioningToken, clRegistration(node)); err != nil {
		t.Fatalf("register: %v", err)
	}
}

func TestClientIdentityFile(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	path := filepath.Join(dir, "sub", "identity.json")
	id, err := client.LoadOrCreateIdentity(path)
	if err != nil {
		t.Fatal(err)
	}
	st, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	if st.Mode().Perm() != 0o600 {
		t.Errorf("mode = %04o, want 0600", st.Mode().Perm())
	}
	if id.Token() != "" || id.WorkerID() != "" {
		t.Errorf("a new identity has a registration: %q %q", id.WorkerID(), id.Token())
	}
	exp := time.Date(2027, 1, 2, 3, 4, 5, 0, time.UTC)
	if err := id.SetCredential("node-1", "wrk_1", "nlc_secret", exp); err != nil {
		t.Fatal(err)
	}
	again, err := client.LoadOrCreateIdentity(path)
	if err != nil {
		t.Fatal(err)
	}
	if again.PublicKey() != id.PublicKey() || again.KeyID() != id.KeyID() {
		t.Errorf("reloaded key differs")
	}
	if again.NodeID() != "node-1" || again.WorkerID() != "wrk_1" || again.Token() != "nlc_secret" || !again.TokenExpiresAt().Equal(exp) {
		t.Errorf("reloaded = %q %q %q %v", again.NodeID(), again.WorkerID(), again.Token(), again.TokenExpiresAt())
	}
	ents, _ := os.ReadDir(filepath.Dir(path))
	if len(ents) != 1 {
		t.Errorf("directory holds %d files (temporary files left?)", len(ents))
	}

	t.Run("wider permissions refused", func(t *testing.T) {
		t.Parallel()
		if err := os.Chmod(path, 0o644); err != nil {
			t.Fatal(err)
		}
		defer os.Chmod(path, 0o600)
		if _, err := client.LoadOrCreateIdentity(path); err == nil || !strings.Contains(err.Error(), "0600") {
			t.Errorf("loading a 0644 file: %v", err)
		}
	})
	t.Run("corrupt", func(t *testing.T) {
		t.Parallel()
		bad := filepath.Join(dir, "bad.json")
		os.WriteFile(bad, []byte(`{"version":1,"private_key":"short"}`), 0o600)
		if _, err := client.LoadOrCreateIdentity(bad); err == nil {
			t.Error("a bad key loaded")
		}
	})
	t.Run("concurrent creation agrees", func(t *testing.T) {
		t.Parallel()
		p := filepath.Join(dir, "race.json")
		keys := make([]string, 8)
		var wg sync.WaitGroup
		for i := range keys {
			wg.Go(func() {
				id, err := client.LoadOrCreateIdentity(p)
				if err != nil {
					t.Error(err)
					return
				}
				keys[i] = id.PublicKey()
			})
		}
		wg.Wait()
		for _, k := range keys[1:] {
			if k != keys[0] {
				t.Fatalf("keys differ: %v", keys)
			}
		}
	})
}

func TestClientRegister(t *testing.T) {
	t.Parallel()
	p := newClProxy(t)
	ctx := context.Background()
	dir := t.TempDir()
	id, err := client.LoadOrCreateIdentity(filepath.Join(dir, "id.json"))
	if err != nil {
		t.Fatal(err)
	}
	c, err := client.New(p.URL+"/", &client.Config{Identity: id})
	if err != nil {
		t.Fatal(err)
	}
	first, err := c.Register(ctx, p.env.ProvisioningToken, clRegistration("node-r"))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.Heartbeat(ctx, wire.HeartbeatRequest{Status: "idle"}); err != nil {
		t.Fatalf("heartbeat: %v", err)
	}
	// Again with the same key: 200, a new token, saved.
	second, err := c.Register(ctx, p.env.ProvisioningToken, clRegistration("node-r"))
	if err != nil {
		t.Fatal(err)
	}
	if second.WorkerID != first.WorkerID || second.WorkerToken == first.WorkerToken {
		t.Errorf("re-registration: %s/%s", first.WorkerID, second.WorkerID)
	}
	if got := p.requests("/workers/register"); got[len(got)-1].status != http.StatusOK || got[0].status != http.StatusCreated {
		t.Errorf("register statuses: %+v", got)
	}
	reload, err := client.LoadOrCreateIdentity(filepath.Join(dir, "id.json"))
	if err != nil {
		t.Fatal(err)
	}
	if reload.Token() != second.WorkerToken || reload.WorkerID() != second.WorkerID || reload.NodeID() != "node-r" {
		t.Errorf("saved identity: %q %q", reload.WorkerID(), reload.NodeID())
	}
	if _, err := c.Heartbeat(ctx, wire.HeartbeatRequest{Status: "idle"}); err != nil {
		t.Fatalf("heartbeat with the rotated token: %v", err)
	}

	// Another key for the same node: 409 node_exists, an *APIError.
	other := newClClient(t, p.URL, nil)
	_, err = other.Register(ctx, p.env.ProvisioningToken, clRegistration("node-r"))
	var ae *client.APIError
	if !errors.As(err, &ae) || ae.Status != http.StatusConflict || ae.Code != wire.CodeNodeExists {
		t.Errorf("other key: %v", err)
	}
	if client.IsRetryable(err) {
		t.Error("409 is retryable")
	}
}

func TestClientRetries(t *testing.T) {
	t.Parallel()
	p := newClProxy(t)
	ctx := context.Background()
	c := newClClient(t, p.URL, nil)
	clRegister(t, p, c, "node-retry")

	t.Run("503 after the server acted, re-signed each time", func(t *testing.T) {
		p.reset()
		// The real handler runs (and consumes each nonce) before the answer
		// is replaced: a retry with the same signature would be refused as
		// replayed_nonce.
		p.inject(clFault{suffix: "/heartbeat", n: 3, status: http.StatusServiceUnavailable, after: true})
		if _, err := c.Heartbeat(ctx, wire.HeartbeatRequest{Status: "idle"}); err != nil {
			t.Fatalf("heartbeat: %v", err)
		}
		seen := p.requests("/heartbeat")
		if len(seen) != 4 {
			t.Fatalf("%d attempts, want 4: %+v", len(seen), seen)
		}
		nonces := map[string]bool{}
		for _, s := range seen {
			if s.code == wire.CodeReplayedNonce {
				t.Errorf("replayed nonce: %+v", s)
			}
			nonces[s.nonce] = true
		}
		if len(nonces) != 4 {
			t.Errorf("%d distinct nonces in 4 attempts", len(nonces))
		}
		if seen[3].status != http.StatusOK {
			t.Errorf("last attempt: %+v", seen[3])
		}
	})
	t.Run("429 honours Retry-After", func(t *testing.T) {
		p.reset()
		p.inject(clFault{suffix: "/heartbeat", n: 1, status: http.StatusTooManyRequests, retryAfter: "1"})
		start := time.Now()
		if _, err := c.Heartbeat(ctx, wire.HeartbeatRequest{Status: "idle"}); err != nil {
			t.Fatalf("heartbeat: %v", err)
		}
		if d := time.Since(start); d < time.Second {
			t.Errorf("retried after %v, before Retry-After", d)
		}
		if n := len(p.requests("/heartbeat")); n != 2 {
			t.Errorf("%d attempts, want 2", n)
		}
	})
	t.Run("gives up after MaxAttempts", func(t *testing.T) {
		p.reset()
		p.inject(clFault{suffix: "/heartbeat", n: 100, status: http.StatusBadGateway})
		_, err := c.Heartbeat(ctx, wire.HeartbeatRequest{Status: "idle"})
		var ae *client.APIError
		if !errors.As(err, &ae) || ae.Status != http.StatusBadGateway || !client.IsRetryable(err) {
			t.Errorf("err = %v", err)
		}
		if n := len(p.requests("/heartbeat")); n != 5 {
			t.Errorf("%d attempts, want the default 5", n)
		}
		p.mu.Lock()
		p.faults = nil
		p.mu.Unlock()
	})
	t.Run("no retry on 4xx", func(t *testing.T) {
		p.reset()
		_, err := c.Accept(ctx, "no-such-job", wire.TokenRequest{LeaseToken: "nll_bogus"})
		if err == nil || client.IsRetryable(err) {
			t.Fatalf("err = %v", err)
		}
		if n := len(p.requests("/accept")); n != 1 {
			t.Errorf("%d attempts of a 4xx", n)
		}
		if code := client.ErrorCode(err); code != wire.CodeInvalidRequest {
			t.Errorf("code = %q", code)
		}
	})
	t.Run("network error", func(t *testing.T) {
		srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			hj, _ := w.(http.Hijacker)
			conn, _, _ := hj.Hijack()
			conn.Close()
		}))
		defer srv.Close()
		nc := newClClient(t, srv.URL, func(c *client.Config) { c.MaxAttempts = 3 })
		_, err := nc.Heartbeat(ctx, wire.HeartbeatRequest{Status: "idle"})
		if err == nil || !client.IsRetryable(err) {
			t.Errorf("err = %v", err)
		}
		cctx, cancel := context.WithCancel(ctx)
		cancel()
		if _, err := nc.Heartbeat(cctx, wire.HeartbeatRequest{Status: "idle"}); !errors.Is(err, context.Canceled) {
			t.Errorf("cancelled: %v", err)
		}
	})
}

func TestClientClockOffset(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	t.Run("server clock ahead", func(t *testing.T) {
		t.Parallel()
		p := newClProxy(t)
		p.env.Clock.Advance(10 * time.Minute)
		c := newClClient(t, p.URL, nil)
		clRegister(t, p, c, "node-ahead")
		off, ok := c.ClockOffset()
		if !ok || off < 10*time.Minute-5*time.Second || off > 10*time.Minute+5*time.Second {
			t.Errorf("offset = %v %v, want about 10m", off, ok)
		}
		regs := p.requests("/register")
		if len(regs) != 2 || regs[0].code != wire.CodeStaleTimestamp || regs[1].status != http.StatusCreated {
			t.Errorf("register attempts: %+v", regs)
		}
		p.reset()
		for range 3 {
			if _, err := c.Heartbeat(ctx, wire.HeartbeatRequest{Status: "idle"}); err != nil {
				t.Fatalf("heartbeat: %v", err)
			}
		}
		if n := len(p.requests("/heartbeat")); n != 3 {
			t.Errorf("%d heartbeat requests for 3 heartbeats: the offset did not stick", n)
		}
		// The server's clock jumps again: the next request is corrected.
		p.env.Clock.Advance(-20 * time.Minute)
		if _, err := c.Heartbeat(ctx, wire.HeartbeatRequest{Status: "idle"}); err != nil {
			t.Fatalf("heartbeat after a jump back: %v", err)
		}
	})
	t.Run("node clock behind", func(t *testing.T) {
		t.Parallel()
		p := newClProxy(t)
		c := newClClient(t, p.URL, func(cfg *client.Config) {
			cfg.Now = func() time.Time { return time.Now().Add(-7 * time.Minute) }
		})
		clRegister(t, p, c, "node-behind")
		if _, err := c.Heartbeat(ctx, wire.HeartbeatRequest{Status: "idle"}); err != nil {
			t.Fatal(err)
		}
		if d := time.Until(c.ServerNow()); d > 2*time.Second || d < -2*time.Second {
			t.Errorf("ServerNow is %v off the server", d)
		}
	})
	t.Run("Date header", func(t *testing.T) {
		t.Parallel()
		srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("Date", time.Now().Add(time.Hour).UTC().Format(http.TimeFormat))
			w.Header().Set("Content-Type", "application/json")
			w.Write([]byte(`{"job":{}}`))
		}))
		defer srv.Close()
		c := newClClient(t, srv.URL, nil)
		if _, err := c.Release(ctx, "j", wire.ReleaseRequest{LeaseToken: "t"}); err != nil {
			t.Fatal(err)
		}
		if off, _ := c.ClockOffset(); off < time.Hour-2*time.Second || off > time.Hour+2*time.Second {
			t.Errorf("offset from Date = %v", off)
		}
	})
}

// clWorker runs a Runner until the test ends.
type clWorker struct {
	w    *client.Runner
	c    *client.Client
	done chan error

	mu   sync.Mutex
	ends []client.JobEnd
}

func startClWorker(t *testing.T, p *clProxy, node string, mod func(*client.RunnerConfig), handlers map[string]client.HandlerFunc) *clWorker {
	t.Helper()
	return startClWorkerWith(t, p, node, nil, mod, handlers)
}

// startClWorkerWith is startClWorker with cmod to change the Client's
// Config.
func startClWorkerWith(t *testing.T, p *clProxy, node string, cmod func(*client.Config), mod func(*client.RunnerConfig), handlers map[string]client.HandlerFunc) *clWorker {
	t.Helper()
	c := newClClient(t, p.URL, cmod)
	cw := &clWorker{c: c, done: make(chan error, 1)}
	reg := clRegistration(node)
	cfg := &client.RunnerConfig{
		ProvisioningToken: p.env.ProvisioningToken,
		Registration:      &reg,
		MaxConcurrent:     2,
		WaitSeconds:       1,
		IdlePoll:          100 * time.Millisecond,
		HeartbeatInterval: 100 * time.Millisecond,
		LogFlushInterval:  50 * time.Millisecond,
		DrainTimeout:      5 * time.Second,
		DrainGrace:        time.Second,
		OnJobEnd: func(e client.JobEnd) {
			cw.mu.Lock()
			cw.ends = append(cw.ends, e)
			cw.mu.Unlock()
		},
	}
	if mod != nil {
		mod(cfg)
	}
	w, err := client.NewRunner(c, cfg)
	if err != nil {
		t.Fatal(err)
	}
	cw.w = w
	for typ, h := range handlers {
		cw.w.Handle(typ, h)
	}
	ctx, cancel := context.WithCancel(context.Background())
	go func() { cw.done <- cw.w.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		select {
		case <-cw.done:
		case <-time.After(20 * time.Second):
			t.Error("the worker did not stop")
		}
	})
	return cw
}

func (cw *clWorker) end(t *testing.T, jobID string) client.JobEnd {
	t.Helper()
	var end client.JobEnd
	waitfor.Until(t, "job "+jobID+" to end", func() bool {
		cw.mu.Lock()
		defer cw.mu.Unlock()
		for _, e := range cw.ends {
			if e.Job.ID == jobID {
				end = e
				return true
			}
		}
		return false
	})
	return end
}

// clSignal sends v if ch has room: a handler that runs again must not
// block on it.
func clSignal[T any](ch chan<- T, v T) {
	select {
	case ch <- v:
	default:
	}
}

// clWait waits for a signal from a handler.
func clWait[T any](t *testing.T, ch <-chan T, what string) T {
	t.Helper()
	return waitfor.Receive(t, what, ch)
}

func clLogLines(t *testing.T, p *clProxy, jobID string) []*lease.Event {
	t.Helper()
	evs, err := p.env.Server.Leases().Events(context.Background(), jobID, 0, 1000)
	if err != nil {
		t.Fatal(err)
	}
	var out []*lease.Event
	for _, e := range evs {
		if e.Kind == lease.EventLog {
			out = append(out, e)
		}
	}
	return out
}

func TestClientWorkerRunsJobs(t *testing.T) {
	t.Parallel()
	p := newClProxy(t)
	art := filepath.Join(t.TempDir(), "out.bin")
	content := []byte("adapter weights")
	if err := os.WriteFile(art, content, 0o600); err != nil {
		t.Fatal(err)
	}
	cw := startClWorker(t, p, "node-run", nil, map[string]client.HandlerFunc{
		"status_check": func(ctx context.Context, job *wire.Job, r *client.Reporter) error {
			var in struct{ Mode string }
			json.Unmarshal(job.Payload, &in)
			r.Logf("starting %s", in.Mode)
			if err := r.Progress(ctx, "50%", map[string]int{"step": 5}); err != nil {
				return err
			}
			r.Log("with payload", map[string]any{"loss": 0.5})
			r.Log("not an object", 42)
			switch in.Mode {
			case "permanent":
				return client.Permanent(errors.New("bad input"))
			case "retry":
				return client.WithErrorCode("oom", errors.New("out of memory"))
			case "panic":
				panic("boom")
			}
			if _, err := r.Artifact(ctx, client.ArtifactInfo{Type: "adapter", Name: "out.bin", URI: "file:///out.bin", Path: art,
				Metadata: map[string]string{"format": "raw"}}); err != nil {
				return err
			}
			r.SetOutput("s3://bucket/out", map[string]float64{"loss": 0.12}, "done")
			return nil
		},
	})
	ok := p.env.Enqueue(t, lease.NewJob{Type: "status_check", Payload: json.RawMessage(`{"mode":"ok"}`)})
	perm := p.env.Enqueue(t, lease.NewJob{Type: "status_check", Payload: json.RawMessage(`{"mode":"permanent"}`)})
	retry := p.env.Enqueue(t, lease.NewJob{Type: "status_check", Payload: json.RawMessage(`{"mode":"retry"}`)})
	pan := p.env.Enqueue(t, lease.NewJob{Type: "status_check", Payload: json.RawMessage(`{"mode":"panic"}`)})

	e := cw.end(t, ok.ID)
	if e.Outcome != client.JobSucceeded || e.Complete == nil || e.Complete.ReceiptID == "" {
		t.Fatalf("ok: %+v", e)
	}
	j := p.env.Job(t, ok.ID)
	if j.State != lease.StateSucceeded || j.Result == nil || j.Result.OutputURI != "s3://bucket/out" || j.Result.FinalMessage != "done" {
		t.Errorf("ok job: %+v", j)
	}
	lines := clLogLines(t, p, ok.ID)
	if len(lines) != 3 || lines[0].Message != "starting ok" || !strings.Contains(string(lines[2].Payload), `"value":42`) {
		for _, l := range lines {
			t.Logf("line %d %q %s", l.Seq, l.Message, l.Payload)
		}
		t.Errorf("%d log lines", len(lines))
	}
	for i := 1; i < len(lines); i++ {
		if lines[i].Seq <= lines[i-1].Seq {
			t.Errorf("seqs do not increase: %d after %d", lines[i].Seq, lines[i-1].Seq)
		}
	}
	arts, err := p.env.Server.Leases().Artifacts(context.Background(), lease.ArtifactFilter{JobID: ok.ID})
	if err != nil {
		t.Fatal(err)
	}
	sum := sha256.Sum256(content)
	if len(arts) != 1 || arts[0].SHA256 != hex.EncodeToString(sum[:]) || arts[0].SizeBytes != int64(len(content)) {
		t.Errorf("artifacts: %+v", arts)
	}

	if e := cw.end(t, perm.ID); e.Outcome != client.JobFailed || e.Fail == nil || e.Fail.Requeued {
		t.Errorf("permanent: %+v", e)
	}
	if j := p.env.Job(t, perm.ID); j.State != lease.StateFailed || j.LastError.Code != "handler_error" {
		t.Errorf("permanent job: %s %+v", j.State, j.LastError)
	}
	if e := cw.end(t, retry.ID); e.Outcome != client.JobFailed || e.Fail == nil || !e.Fail.Requeued {
		t.Errorf("retryable: %+v", e)
	}
	if j := p.env.Job(t, retry.ID); j.State != lease.StateQueued || j.LastError.Code != "oom" {
		t.Errorf("retryable job: %s %+v", j.State, j.LastError)
	}
	if e := cw.end(t, pan.ID); e.Outcome != client.JobFailed {
		t.Errorf("panic: %+v", e)
	}
	if j := p.env.Job(t, pan.ID); j.LastError == nil || j.LastError.Code != "panic" {
		t.Errorf("panic job: %+v", j.LastError)
	}
}

func TestClientCancelReachesHandler(t *testing.T) {
	t.Parallel()
	p := newClProxy(t)
	running := make(chan string, 1)
	causes := make(chan error, 1)
	cw := startClWorker(t, p, "node-cancel", nil, map[string]client.HandlerFunc{
		"status_check": func(ctx context.Context, job *wire.Job, r *client.Reporter) error {
			r.Log("working", nil)
			running <- job.ID
			<-ctx.Done()
			causes <- context.Cause(ctx)
			r.Log("stopping", nil)
			return ctx.Err()
		},
	})
	j := p.env.Enqueue(t, lease.NewJob{Type: "status_check"})
	clWait(t, running, "the handler")
	p.reset()
	if _, err := p.env.Server.Leases().Cancel(context.Background(), j.ID); err != nil {
		t.Fatal(err)
	}
	if cause := clWait(t, causes, "the cancel"); !errors.Is(cause, client.ErrJobCanceled) {
		t.Errorf("cause = %v", cause)
	}
	e := cw.end(t, j.ID)
	if e.Outcome != client.JobCanceled {
		t.Errorf("outcome %+v", e)
	}
	got := p.env.Job(t, j.ID)
	if got.State != lease.StateCanceled || got.LastError == nil || got.LastError.Code != "canceled" {
		t.Errorf("job: %s %+v", got.State, got.LastError)
	}
	if lines := clLogLines(t, p, j.ID); len(lines) != 2 {
		t.Errorf("%d log lines, want both", len(lines))
	}
	// A cancel made in Go wakes no signals long-poll: a heartbeat carries
	// it, or the signals long-poll's first look after the jobs changed.
	if len(p.requests("/heartbeat"))+len(p.requests("/workers/signals")) == 0 {
		t.Error("no heartbeat or signals answer carried the cancel")
	}
}

func TestClientLeaseLost(t *testing.T) {
	t.Parallel()
	p := newClProxy(t)
	running := make(chan string, 1)
	causes := make(chan error, 1)
	cw := startClWorker(t, p, "node-lost", func(c *client.RunnerConfig) { c.MaxConcurrent = 1 }, map[string]client.HandlerFunc{
		"status_check": func(ctx context.Context, job *wire.Job, r *client.Reporter) error {
			clSignal(running, job.ID)
			<-ctx.Done()
			clSignal(causes, context.Cause(ctx))
			return nil // even a "success" must not complete a lost lease
		},
	})
	j := p.env.Enqueue(t, lease.NewJob{Type: "status_check"})
	clWait(t, running, "the handler")
	p.reset()
	// The server's clock passes the lease's TTL and its maintainer expires it.
	p.env.Clock.Advance(11 * time.Minute)
	if n, err := p.env.Server.Leases().Expire(context.Background()); err != nil || n != 1 {
		t.Fatalf("expire: %d %v", n, err)
	}
	cause := clWait(t, causes, "the lease loss")
	if !errors.Is(cause, client.ErrLeaseLost) && !errors.Is(cause, client.ErrLeaseExpiring) {
		t.Errorf("cause = %v", cause)
	}
	if e := cw.end(t, j.ID); e.Outcome != client.JobLost {
		t.Errorf("outcome %+v", e)
	}
	for _, s := range []string{"/complete", "/fail", "/logs"} {
		if got := p.requests(s); len(got) != 0 {
			t.Errorf("%s sent after the lease was lost: %+v", s, got)
		}
	}
	if got := p.env.Job(t, j.ID); got.State != lease.StateQueued || got.Attempt != 2 {
		t.Errorf("job: %s attempt %d", got.State, got.Attempt)
	}
}

func TestClientLeaseExpiringStopsJob(t *testing.T) {
	t.Parallel()
	// Heartbeats fail: the worker cannot extend the lease and stops the
	// job before it expires, instead of running on while another worker
	// may take it.
	p := newClProxy(t, apitest.WithConfig(func(c *workerapi.Config) { c.Lease.LeaseTTL = 3 * time.Second }))
	running := make(chan string, 1)
	causes := make(chan error, 1)
	cw := startClWorker(t, p, "node-expiring", func(c *client.RunnerConfig) {
		c.MaxConcurrent = 1
		c.DrainTimeout = 200 * time.Millisecond
	}, map[string]client.HandlerFunc{
		"status_check": untilStopped(running, causes),
	})
	j := p.env.Enqueue(t, lease.NewJob{Type: "status_check"})
	clWait(t, running, "the handler")
	p.inject(clFault{suffix: "/heartbeat", n: 1000, status: http.StatusServiceUnavailable})
	cause := clWait(t, causes, "the watchdog")
	stoppedAt := time.Now()
	if !errors.Is(cause, client.ErrLeaseExpiring) {
		t.Errorf("cause = %v", cause)
	}
	if l := p.env.Job(t, j.ID).Lease; l != nil && !stoppedAt.Before(l.ExpiresAt) {
		t.Errorf("stopped at %v, after the lease expired at %v", stoppedAt, l.ExpiresAt)
	}
	if e := cw.end(t, j.ID); e.Outcome != client.JobLost {
		t.Errorf("outcome %+v", e)
	}
	if got := p.requests("/complete"); len(got) != 0 {
		t.Errorf("complete sent: %+v", got)
	}
	p.mu.Lock()
	p.faults = nil
	p.mu.Unlock()
}

func TestClientOfflineStopsJob(t *testing.T) {
	t.Parallel()
	// Heartbeats fail: before the heartbeat_deadline the last answer gave
	// (when the control plane may deem the worker offline and give its
	// job to another), the worker stops the job, although its lease (600 s)
	// is far from expiring.
	p := newClProxy(t, apitest.WithConfig(func(c *workerapi.Config) {
		c.Lease.HeartbeatInterval, c.Lease.OfflineAfter = time.Second, 3*time.Second
	}))
	running := make(chan string, 1)
	causes := make(chan error, 1)
	cw := startClWorker(t, p, "node-offline", func(c *client.RunnerConfig) {
		c.MaxConcurrent = 1
		c.HeartbeatInterval = 0 // the server's, 1 s
	}, map[string]client.HandlerFunc{
		"status_check": untilStopped(running, causes),
	})
	j := p.env.Enqueue(t, lease.NewJob{Type: "status_check"})
	clWait(t, running, "the handler")
	// The deadline is known once a heartbeat got through: the signals
	// long-poll's first request may have delayed the first one.
	waitfor.Until(t, "a heartbeat to get through", func() bool { return p.okHeartbeats() > 0 })
	p.inject(clFault{suffix: "/heartbeat", n: 1000, status: http.StatusServiceUnavailable})
	cause := clWait(t, causes, "the offline watchdog")
	stoppedAt := time.Now()
	if !errors.Is(cause, client.ErrOffline) {
		t.Errorf("cause = %v, want ErrOffline", cause)
	}
	w, err := p.env.Server.Leases().Worker(context.Background(), cw.c.Identity().WorkerID())
	if err != nil {
		t.Fatal(err)
	}
	if offline := p.env.Server.Leases().OfflineAt(w); !stoppedAt.Before(offline) {
		t.Errorf("stopped at %v, after the worker went offline at %v", stoppedAt, offline)
	}
	if e := cw.end(t, j.ID); e.Outcome != client.JobLost {
		t.Errorf("outcome %+v", e)
	}
	if got := p.requests("/complete"); len(got) != 0 {
		t.Errorf("complete sent: %+v", got)
	}
	p.mu.Lock()
	p.faults = nil
	p.mu.Unlock()
}

func TestClientDrain(t *testing.T) {
	t.Parallel()
	p := newClProxy(t)
	running := make(chan string, 3)
	finishA := make(chan struct{})
	causes := make(chan error, 2)
	stubborn := make(chan struct{})
	defer close(stubborn)
	cw := startClWorker(t, p, "node-drain", func(c *client.RunnerConfig) {
		c.MaxConcurrent = 3
		c.DrainTimeout = 3 * time.Second
		c.DrainGrace = 300 * time.Millisecond
	}, map[string]client.HandlerFunc{
		"status_check": func(ctx context.Context, job *wire.Job, r *client.Reporter) error {
			running <- string(job.Payload)
			switch {
			case strings.Contains(string(job.Payload), "quick"):
				<-finishA
				r.Log("finished during the drain", nil)
				return nil
			case strings.Contains(string(job.Payload), "stubborn"):
				<-stubborn // ignores its context
				return nil
			}
			<-ctx.Done()
			causes <- context.Cause(ctx)
			return ctx.Err()
		},
	})
	a := p.env.Enqueue(t, lease.NewJob{Type: "status_check", Payload: json.RawMessage(`{"k":"quick"}`)})
	b := p.env.Enqueue(t, lease.NewJob{Type: "status_check", Payload: json.RawMessage(`{"k":"slow"}`)})
	s := p.env.Enqueue(t, lease.NewJob{Type: "status_check", Payload: json.RawMessage(`{"k":"stubborn"}`)})
	for range 3 {
		clWait(t, running, "the handlers")
	}

	cw.w.Drain()
	close(finishA)
	if e := cw.end(t, a.ID); e.Outcome != client.JobSucceeded {
		t.Errorf("a: %+v", e)
	}
	// A job dispatched while the worker drains is not leased.
	c := p.env.Enqueue(t, lease.NewJob{Type: "status_check"})
	if err := clWait(t, cw.done, "Run to return"); err != nil {
		t.Fatalf("Run: %v", err)
	}
	cw.done <- nil // for the cleanup

	if j := p.env.Job(t, a.ID); j.State != lease.StateSucceeded {
		t.Errorf("a: %s", j.State)
	}
	if cause := clWait(t, causes, "b's cancel"); !errors.Is(cause, client.ErrDrained) {
		t.Errorf("b's cause = %v", cause)
	}
	if e := cw.end(t, b.ID); e.Outcome != client.JobReleased {
		t.Errorf("b: %+v", e)
	}
	if j := p.env.Job(t, b.ID); j.State != lease.StateQueued || j.Attempt != 1 {
		t.Errorf("b: %s attempt %d, want queued with no attempt used", j.State, j.Attempt)
	}
	if e := cw.end(t, s.ID); e.Outcome != client.JobReleased {
		t.Errorf("stubborn: %+v", e)
	}
	if j := p.env.Job(t, s.ID); j.State != lease.StateQueued || j.Attempt != 1 {
		t.Errorf("stubborn: %s attempt %d, want released", j.State, j.Attempt)
	}
	if j := p.env.Job(t, c.ID); j.State != lease.StateQueued || j.Lease != nil && j.Lease.WorkerID == cw.c.Identity().WorkerID() {
		t.Errorf("c was leased during the drain: %s", j.State)
	}
	w, err := p.env.Server.Leases().Worker(context.Background(), cw.c.Identity().WorkerID())
	if err != nil {
		t.Fatal(err)
	}
	if w.Status != "draining" {
		t.Errorf("worker status %q, want draining", w.Status)
	}
}

func TestClientLogsResent(t *testing.T) {
	t.Parallel()
	p := newClProxy(t)
	flushErr := make(chan error, 1)
	cw := startClWorker(t, p, "node-logs", func(c *client.RunnerConfig) {
		c.LogFlushInterval = time.Hour // only explicit and final flushes
	}, map[string]client.HandlerFunc{
		"status_check": func(ctx context.Context, job *wire.Job, r *client.Reporter) error {
			for i := range 5 {
				r.Logf("line %d", i)
			}
			flushErr <- r.Flush(ctx)
			for i := 5; i < 10; i++ {
				r.Logf("line %d", i)
			}
			return nil
		},
	})
	// The first batch reaches the server every time, but its answers are
	// lost until the Client gives up; the lines stay buffered and go again
	// with the next batch.
	p.inject(clFault{suffix: "/logs", n: 5, status: http.StatusServiceUnavailable, after: true})
	j := p.env.Enqueue(t, lease.NewJob{Type: "status_check"})
	if err := clWait(t, flushErr, "the flush"); err == nil || !client.IsRetryable(err) {
		t.Errorf("flush during the outage: %v", err)
	}
	if e := cw.end(t, j.ID); e.Outcome != client.JobSucceeded {
		t.Fatalf("outcome %+v", e)
	}
	lines := clLogLines(t, p, j.ID)
	seqs := map[int64]bool{}
	for i, l := range lines {
		if want := fmt.Sprintf("line %d", i); l.Message != want {
			t.Errorf("line %d = %q", i, l.Message)
		}
		seqs[l.Seq] = true
	}
	if len(lines) != 10 || len(seqs) != 10 {
		t.Errorf("%d lines stored (%d seqs), want 10 once each", len(lines), len(seqs))
	}
	if n := len(p.requests("/logs")); n < 6 {
		t.Errorf("%d logs requests: not resent?", n)
	}
}

func TestClientTokenRenewal(t *testing.T) {
	t.Parallel()
	// Worker tokens live 30 days (the server's default); the worker renews
	// its own 72 h before expiry, on the server's clock.
	p := newClProxy(t)
	// The Env's provisioning token lives a day: this one outlives the
	// worker token.
	prov, _, err := p.env.Server.Issuer().Mint(context.Background(), apitest.ProvisionerID,
		[]credential.Scope{credential.ScopeNodeRegister}, 90*24*time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	// Days pass for the node too: its clock is the server's (a client
	// follows a server clock that jumps by at most MaxClockOffset).
	cw := startClWorkerWith(t, p, "node-renew", func(c *client.Config) { c.Now = p.env.Clock.Now },
		func(c *client.RunnerConfig) { c.ProvisioningToken = prov },
		map[string]client.HandlerFunc{"status_check": func(context.Context, *wire.Job, *client.Reporter) error { return nil }})
	id := cw.c.Identity()
	waitfor.Until(t, "the worker to register", func() bool { return id.Token() != "" })
	first, firstExp := id.Token(), id.TokenExpiresAt()
	if got := firstExp.Sub(p.env.Clock.Now()); got < 29*24*time.Hour {
		t.Fatalf("token lifetime %v", got)
	}
	p.env.Clock.Advance(28 * 24 * time.Hour)
	waitfor.Until(t, "the token to be renewed 2 days before it expires", func() bool { return id.Token() != first })
	if !id.TokenExpiresAt().After(firstExp) {
		t.Errorf("renewed token expires %v, not after %v", id.TokenExpiresAt(), firstExp)
	}
	// Past the first token's expiry the worker works on.
	p.env.Clock.Advance(3 * 24 * time.Hour)
	p.reset()
	waitfor.Until(t, "two heartbeats answered 200 after the first token expired", func() bool { return p.okHeartbeats() >= 2 })
	j := p.env.Enqueue(t, lease.NewJob{Type: "status_check"})
	if e := cw.end(t, j.ID); e.Outcome != client.JobSucceeded {
		t.Errorf("job after renewal: %+v", e)
	}
	if regs := len(p.requests("/register")); regs != 0 {
		t.Errorf("%d registrations after the renewal: it should hold for days", regs)
	}
}

func TestClientBaseURLPrefix(t *testing.T) {
	t.Parallel()
	env := apitest.New(t, "sqlite")
	var mu sync.Mutex
	var uris []string
	srv := httptest.NewServer(http.StripPrefix("/cp/nodelane", http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		uris = append(uris, r.RequestURI)
		mu.Unlock()
		env.Server.Handler().ServeHTTP(w, r)
	})))
	defer srv.Close()
	c := newClClient(t, srv.URL+"/cp/nodelane/", nil)
	ctx := context.Background()
	if _, err := c.Register(ctx, env.ProvisioningToken, clRegistration("node-prefix")); err != nil {
		t.Fatal(err)
	}
	// An odd job id is escaped once, and the signature covers it as sent:
	// the answer is about the body, not the signature.
	_, err := c.Accept(ctx, "a b/c", wire.TokenRequest{LeaseToken: "nll_bogus"})
	if code := client.ErrorCode(err); code != wire.CodeInvalidRequest {
		t.Errorf("accept: %v", err)
	}
	mu.Lock()
	defer mu.Unlock()
	if want := "/cp/nodelane/workers/jobs/a%20b%2Fc/accept"; uris[len(uris)-1] != want {
		t.Errorf("request-target %q, want %q", uris[len(uris)-1], want)
	}
}

// A worker node: its identity in a 0600 file, registered with a
// provisioning token on first start, draining on SIGTERM (a spot reclaim)
// or Ctrl-C.
func ExampleRunner() {
	id, err := client.LoadOrCreateIdentity("/var/lib/nodelane/identity.json")
	if err != nil {
		log.Fatal(err)
	}
	c, err := client.New("https://cp.example.com/nodelane", &client.Config{Identity: id})
	if err != nil {
		log.Fatal(err)
	}
	w, err := client.NewRunner(c, &client.RunnerConfig{
		ProvisioningToken: os.Getenv("NODELANE_PROVISIONING_TOKEN"),
		Registration: &wire.RegisterRequest{
			NodeID: "studio-gpu-1", Name: "Studio-GPU", Role: "local_gpu_compute",
			Capabilities:   wire.Capabilities{GPUs: []wire.GPU{{SKU: "rtx-4090", VRAMMB: 24576}}},
			GovernorLimits: wire.GovernorLimits{MaxJobs: 2, MaxVRAMMB: 24576},
		},
		DrainTimeout: 90 * time.Second,
	})
	if err != nil {
		log.Fatal(err)
	}
	w.Handle("status_check", func(ctx context.Context, job *wire.Job, r *client.Reporter) error {
		r.Logf("checking %s", job.ID)
		if err := r.Progress(ctx, "50%", map[string]int{"step": 1}); err != nil {
			return err
		}
		select {
		case <-ctx.Done(): // canceled, lease lost, or drained: stop
			return context.Cause(ctx)
		case <-time.After(time.Second):
		}
		r.SetOutput("", map[string]bool{"healthy": true}, "ok")
		return nil
	})
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := w.Run(ctx); err != nil {
		log.Fatal(err)
	}
}

// untilStopped is a handler that says on running which job it runs, waits
// until the Runner stops it, and says on causes why.
func untilStopped(running chan string, causes chan error) client.HandlerFunc {
	return func(ctx context.Context, job *wire.Job, r *client.Reporter) error {
		clSignal(running, job.ID)
		<-ctx.Done()
		clSignal(causes, context.Cause(ctx))
		return ctx.Err()
	}
}

// A job that prints a NUL loses none of its log lines: the server refuses
// NUL in text (PROTOCOL.md §5.14 "Characters"), so the Reporter replaces
// it with U+FFFD before the batch goes out.
func TestClientLogNUL(t *testing.T) {
	t.Parallel()
	p := newClProxy(t)
	cw := startClWorker(t, p, "node-nul", nil, map[string]client.HandlerFunc{
		"status_check": func(ctx context.Context, job *wire.Job, r *client.Reporter) error {
			r.Log("before", nil)
			r.Log("a\x00b \x1b[1mbold\x1b[0m", nil)
			r.Log("after", nil)
			return nil
		},
	})
	j := p.env.Enqueue(t, lease.NewJob{Type: "status_check"})
	if e := cw.end(t, j.ID); e.Outcome != client.JobSucceeded {
		t.Fatalf("outcome %+v", e)
	}
	var got []string
	for _, l := range clLogLines(t, p, j.ID) {
		got = append(got, l.Message)
	}
	if want := []string{"before", "a\uFFFDb \x1b[1mbold\x1b[0m", "after"}; !slices.Equal(got, want) {
		t.Errorf("stored lines %q, want %q", got, want)
	}
}
