package cmd

// End-to-end tests with real processes: cmd/server and
// cmd/worker are built into a temporary directory and run on
// loopback, and the test drives them through the operator routes with
// plain net/http, as an operator's script would.

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/nodelane/nodelane/internal/apitest"
	"github.com/nodelane/nodelane/internal/syncbuf"
	"github.com/nodelane/nodelane/internal/waitfor"

	"github.com/nodelane/nodelane/cmd/internal/controlplane"
	"github.com/nodelane/nodelane/receipts"
	"github.com/nodelane/nodelane/workerapi/wire"
)

// Timeouts are generous (CI runs on two slow cores) but bounded.
const (
	startTimeout = 60 * time.Second
	jobTimeout   = 90 * time.Second
)

var (
	buildOnce sync.Once
	binDir    string
	buildErr  error
)

// binaries builds cmd/server, cmd/worker and cmd/nodelanectl once per
// test run, with CGO_ENABLED=0, and returns the server's and the
// worker's paths (ctlBinary gives nodelanectl's).
func binaries(t *testing.T) (server, worker string) {
	t.Helper()
	if testing.Short() {
		t.Skip("builds and runs processes")
	}
	buildOnce.Do(func() {
		goBin, err := exec.LookPath("go")
		if err != nil {
			buildErr = fmt.Errorf("no go command: %w", err)
			return
		}
		if binDir, buildErr = os.MkdirTemp("", "nodelane-e2e-bin-*"); buildErr != nil {
			return
		}
		// Built as the README deploys them: static, without cgo. One
		// build for the three, which share most of their packages.
		cmd := exec.Command(goBin, "build", "-trimpath", "-o", binDir+string(filepath.Separator),
			"github.com/nodelane/nodelane/cmd/server", "github.com/nodelane/nodelane/cmd/worker",
			"github.com/nodelane/nodelane/cmd/nodelanectl")
		cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
		if out, err := cmd.CombinedOutput(); err != nil {
			buildErr = fmt.Errorf("go build: %v\n%s", err, out)
		}
	})
	if buildErr != nil {
		t.Fatal(buildErr)
	}
	return filepath.Join(binDir, "server"), filepath.Join(binDir, "worker")
}

// TestMain runs the tests with more of them at once than -parallel's
// default (apitest.RaiseParallel): they wait on processes far more than
// they compute.
func TestMain(m *testing.M) {
	apitest.RaiseParallel()
	// pebble's constructors read these (acme_e2e_test.go): no random
	// sleeps before validating, no nonces rejected at random. Set for the
	// whole run rather than with t.Setenv, which would keep the ACME test
	// out of the parallel ones.
	for k, v := range map[string]string{"PEBBLE_VA_NOSLEEP": "1", "PEBBLE_WFE_NONCEREJECT": "0"} {
		if err := os.Setenv(k, v); err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
	}
	code := m.Run()
	if binDir != "" {
		os.RemoveAll(binDir)
	}
	os.Exit(code)
}

// proc is a running process.
type proc struct {
	name   string
	cmd    *exec.Cmd
	stdout *syncbuf.Buffer
	stderr *syncbuf.Buffer
	done   chan struct{}
}

func startProc(t *testing.T, name, bin string, env []string, args ...string) *proc {
	t.Helper()
	p := &proc{name: name, cmd: exec.Command(bin, args...), stdout: &syncbuf.Buffer{}, stderr: &syncbuf.Buffer{}, done: make(chan struct{})}
	p.cmd.Env = append(os.Environ(), env...)
	p.cmd.Stdout, p.cmd.Stderr = p.stdout, p.stderr
	if err := p.cmd.Start(); err != nil {
		t.Fatalf("starting %s: %v", name, err)
	}
	go func() {
		_ = p.cmd.Wait()
		close(p.done)
	}()
	t.Cleanup(func() {
		p.kill()
		if t.Failed() || os.Getenv("NODELANE_E2E_LOGS") != "" {
			t.Logf("--- %s stdout:\n%s\n--- %s stderr:\n%s", p.name, redact(p.stdout.String()), p.name, p.stderr.String())
		}
	})
	return p
}

// kill sends SIGKILL and waits for the process to be gone.
func (p *proc) kill() {
	if !p.exited() {
		_ = p.cmd.Process.Kill()
	}
	<-p.done
}

func (p *proc) exited() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

// redact hides the tokens the server shows on its terminal.
func redact(s string) string {
	var out []string
	for line := range strings.Lines(s) {
		if strings.Contains(line, "token") {
			line = "(token line redacted)\n"
		}
		out = append(out, line)
	}
	return strings.Join(out, "")
}

// cluster is one control plane (restartable on the same files and port)
// and the operator's view of it.
type cluster struct {
	t                *testing.T
	serverBin        string
	workerBin        string
	dir              string
	addr             string
	server           *proc
	tokens           controlplane.Tokens
	hc               *http.Client
	workers          []*proc
	serverGeneration int
	// serverArgs are more server flags, after (and so over) the usual ones.
	serverArgs []string
	// baseURL is where the operator reaches the server, when not
	// http://addr (over TLS: tls_e2e_test.go).
	baseURL string
}

// startWait bounds the wait for a started server to answer. One that
// obtains its certificate through ACME may need autocert's retry: after a
// failed issuance (a validation that timed out on a loaded machine, seen
// once in CI) autocert tries again only a minute later, on a new
// handshake.
func (c *cluster) startWait() time.Duration {
	if slices.Contains(c.serverArgs, "-acme-domain") {
		return startTimeout + time.Minute
	}
	return startTimeout
}

func newCluster(t *testing.T, serverArgs ...string) *cluster {
	t.Helper()
	serverBin, workerBin := binaries(t)
	c := &cluster{t: t, serverBin: serverBin, workerBin: workerBin, dir: t.TempDir(),
		hc: &http.Client{Timeout: 30 * time.Second}, serverArgs: serverArgs}
	c.startServer()
	b, err := os.ReadFile(filepath.Join(c.dir, "tokens.json"))
	if err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(b, &c.tokens); err != nil || c.tokens.OperatorToken == "" || c.tokens.ProvisioningToken == "" || c.tokens.ReceiptPublicKey == "" {
		t.Fatalf("tokens file: %v %q", err, redact(string(b)))
	}
	if fi, err := os.Stat(filepath.Join(c.dir, "tokens.json")); err != nil || fi.Mode().Perm() != 0o600 {
		t.Errorf("tokens file mode: %v %v", fi.Mode(), err)
	}
	return c
}

func freeAddr(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	return addr
}

func (c *cluster) base() string {
	if c.baseURL != "" {
		return c.baseURL
	}
	return "http://" + c.addr
}

// startServer starts the server on the cluster's files and waits until it
// answers the operator routes. The first start of a cluster without an
// address binds a port the kernel picks (no other process can take it
// between a test's choice and the bind) and reads it from the server's
// log; a restart binds the same address again.
func (c *cluster) startServer() {
	c.t.Helper()
	c.serverGeneration++
	addr := c.addr
	if addr == "" {
		addr = "127.0.0.1:0"
	}
	c.server = startProc(c.t, fmt.Sprintf("server#%d", c.serverGeneration), c.serverBin, nil,
		append([]string{"-addr", addr,
			"-db", "sqlite:" + filepath.Join(c.dir, "nodelane.db"),
			"-secrets-file", filepath.Join(c.dir, "secrets.json"),
			"-tokens-file", filepath.Join(c.dir, "tokens.json"),
			"-lease-ttl", "3s", "-accept-timeout", "3s",
			// A requeued job runs again at once, not after the default
			// backoff of 5 to 10 s.
			"-retry-base", "50ms",
			"-price", "rtx-4090=1800000"}, c.serverArgs...)...)
	waitfor.Within(c.t, c.startWait(), "the server to answer the operator routes", func() bool {
		if c.server.exited() {
			c.t.Fatalf("the server exited: %s", c.server.stderr.String())
		}
		if c.addr == "" {
			m := servingAddr.FindStringSubmatch(c.server.stderr.String())
			if m == nil {
				return false
			}
			c.addr = m[1] + m[2]
		}
		if _, err := os.Stat(filepath.Join(c.dir, "tokens.json")); err != nil {
			return false
		}
		if c.tokens.OperatorToken == "" {
			b, _ := os.ReadFile(filepath.Join(c.dir, "tokens.json"))
			_ = json.Unmarshal(b, &c.tokens)
		}
		var env wire.EnvelopeResponse
		return c.tokens.OperatorToken != "" && c.try("GET", "/operator/envelope", nil, &env) == nil
	})
}

// servingAddr finds the address in the server's "serving" log line, in
// the text format or in JSON.
var servingAddr = regexp.MustCompile(`msg=serving addr=(\S+)|"msg":"serving","addr":"([^"]+)"`)

// startWorker starts a worker process with its own identity.
func (c *cluster) startWorker(node string) *proc {
	c.t.Helper()
	return c.startWorkerVia(node, c.base())
}

// identityPath is the identity file of node's worker.
func (c *cluster) identityPath(node string) string { return filepath.Join(c.dir, node+".json") }

// startWorkerVia starts a worker process that talks to the control plane
// at server, with more flags when given.
func (c *cluster) startWorkerVia(node, server string, flags ...string) *proc {
	c.t.Helper()
	// The provisioning token is given in a file, never on the command line.
	tokenFile := filepath.Join(c.dir, node+".provisioning-token")
	if err := os.WriteFile(tokenFile, []byte(c.tokens.ProvisioningToken+"\n"), 0o600); err != nil {
		c.t.Fatal(err)
	}
	p := startProc(c.t, "worker "+node, c.workerBin, nil, append([]string{
		"-provisioning-token-file", tokenFile,
		"-server", server,
		"-identity", c.identityPath(node),
		"-node-id", node, "-name", node,
		"-gpu", "rtx-4090:24576",
		"-workdir", filepath.Join(c.dir, "work-"+node),
		"-wait-seconds", "2", "-drain-timeout", "5s"}, flags...)...)
	c.workers = append(c.workers, p)
	return p
}

// workerID waits for node to be registered and returns its worker id.
func (c *cluster) workerID(node string) string {
	c.t.Helper()
	var id string
	waitfor.Within(c.t, startTimeout, "worker "+node+" registered", func() bool {
		var l wire.WorkerListResponse
		if c.try("GET", "/operator/workers", nil, &l) != nil {
			return false
		}
		for _, w := range l.Workers {
			if w.NodeID == node {
				id = w.WorkerID
				return true
			}
		}
		return false
	})
	return id
}

// try calls an operator route.
func (c *cluster) try(method, path string, in, out any) error {
	var body io.Reader
	if in != nil {
		b, err := json.Marshal(in)
		if err != nil {
			return err
		}
		body = bytes.NewReader(b)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, method, c.base()+path, body)
	if err != nil {
		return err
	}
	req.Header.Set("Authorization", "Bearer "+c.tokens.OperatorToken)
	if in != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	resp, err := c.hc.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return err
	}
	if resp.StatusCode/100 != 2 {
		return &httpError{status: resp.StatusCode, body: string(b)}
	}
	if out == nil {
		return nil
	}
	if p, ok := out.(*[]byte); ok {
		*p = b
		return nil
	}
	return json.Unmarshal(b, out)
}

type httpError struct {
	status int
	body   string
}

func (e *httpError) Error() string { return fmt.Sprintf("HTTP %d: %s", e.status, e.body) }

// call is try, failing the test on error.
func (c *cluster) call(method, path string, in, out any) {
	c.t.Helper()
	if err := c.try(method, path, in, out); err != nil {
		c.t.Fatalf("%s %s: %v", method, path, err)
	}
}

func (c *cluster) dispatch(jobType string, payload any) wire.DispatchResponse {
	c.t.Helper()
	b, _ := json.Marshal(payload)
	if payload == nil {
		b = []byte(`{}`)
	}
	var d wire.DispatchResponse
	c.call("POST", "/operator/jobs", wire.DispatchRequest{JobType: jobType, Payload: b,
		Requirements: wire.Requirements{GPUSKU: "rtx-4090", GPUCount: 1}, MaxAttempts: 5}, &d)
	return d
}

func (c *cluster) job(id string) wire.JobDetailResponse {
	c.t.Helper()
	var d wire.JobDetailResponse
	c.call("GET", "/operator/jobs/"+id, nil, &d)
	return d
}

// waitDone waits for the job to reach one of the end states and fails
// unless it is want.
func (c *cluster) waitDone(id, want string) wire.JobDetailResponse {
	c.t.Helper()
	var d wire.JobDetailResponse
	waitfor.Within(c.t, jobTimeout, "job "+id+" to end", func() bool {
		if c.try("GET", "/operator/jobs/"+id, nil, &d) != nil {
			return false
		}
		return d.Job.State == "succeeded" || d.Job.State == "failed" || d.Job.State == "canceled"
	})
	if d.Job.State != want {
		c.t.Fatalf("job %s (%s) ended %s, want %s; last error %+v", id, d.Job.JobType, d.Job.State, want, d.Job.LastError)
	}
	return d
}

func (c *cluster) activate() {
	c.t.Helper()
	var env wire.EnvelopeResponse
	c.call("POST", "/operator/envelope/activate", map[string]any{"reason": "e2e"}, &env)
	if !env.Active {
		c.t.Fatalf("envelope not active after activate: %+v", env)
	}
}

// verifyReceipt fetches a receipt once it is sequenced and verifies it
// offline with only the tokens file's receipt_public_key.
func (c *cluster) verifyReceipt(id string) *receipts.Receipt {
	c.t.Helper()
	var rr wire.ReceiptResponse
	waitfor.Within(c.t, jobTimeout, "receipt "+id+" sequenced", func() bool {
		return c.try("GET", "/operator/receipts/"+id, nil, &rr) == nil && rr.Proof != nil && rr.Checkpoint != nil
	})
	r, err := receipts.Verify(c.tokens.ReceiptPublicKey, receipts.DefaultOrigin, rr.Receipt.Body, *rr.Proof, []byte(*rr.Checkpoint))
	if err != nil {
		c.t.Fatalf("receipt %s does not verify offline: %v", id, err)
	}
	if r.ID != id {
		c.t.Fatalf("receipt %s has id %s", id, r.ID)
	}
	return r
}

// allReceipts lists every sequenced receipt.
func (c *cluster) allReceipts() []receipts.WireReceipt {
	c.t.Helper()
	var all []receipts.WireReceipt
	path := "/operator/receipts?limit=1000"
	for {
		var page wire.ReceiptListResponse
		c.call("GET", path, nil, &page)
		all = append(all, page.Receipts...)
		if page.Next == nil {
			return all
		}
		path = "/operator/receipts?limit=1000&after=" + strconv.FormatInt(*page.Next, 10)
	}
}

// receiptsOf decodes the sequenced receipts of kind about job.
func (c *cluster) receiptsOf(kind receipts.Kind, jobID string) []*receipts.Receipt {
	c.t.Helper()
	return c.receiptsWhere(kind, func(r *receipts.Receipt) bool { return r.JobID == jobID })
}

// receiptsWhere decodes the sequenced receipts of kind that keep accepts.
func (c *cluster) receiptsWhere(kind receipts.Kind, keep func(*receipts.Receipt) bool) []*receipts.Receipt {
	c.t.Helper()
	var out []*receipts.Receipt
	for _, w := range c.allReceipts() {
		if w.Kind != kind {
			continue
		}
		r, err := receipts.Decode(w.Body)
		if err != nil {
			c.t.Fatalf("receipt %s: %v", w.ID, err)
		}
		if keep(r) {
			out = append(out, r)
		}
	}
	return out
}

// checkSucceeded checks a succeeded job's receipts: its job_completed
// receipt verifies offline, and exactly one job_completed and one
// job_charged exist for it.
func (c *cluster) checkSucceeded(d wire.JobDetailResponse) {
	c.t.Helper()
	if d.Job.ReceiptID == nil {
		c.t.Fatalf("succeeded job %s has no receipt_id", d.Job.ID)
	}
	r := c.verifyReceipt(*d.Job.ReceiptID)
	if r.Kind != receipts.KindJobCompleted || r.JobID != d.Job.ID {
		c.t.Fatalf("job %s's receipt is %s for %s", d.Job.ID, r.Kind, r.JobID)
	}
	if n := len(c.receiptsOf(receipts.KindJobCompleted, d.Job.ID)); n != 1 {
		c.t.Errorf("job %s has %d job_completed receipts, want exactly 1", d.Job.ID, n)
	}
	waitfor.Within(c.t, jobTimeout, "job_charged receipt", func() bool {
		return len(c.receiptsOf(receipts.KindJobCharged, d.Job.ID)) == 1
	})
}

// checkNoTokensLogged checks that no process logged a token.
func (c *cluster) checkNoTokensLogged() {
	c.t.Helper()
	for _, p := range append([]*proc{c.server}, c.workers...) {
		for _, secret := range []string{c.tokens.OperatorToken, c.tokens.ProvisioningToken, "nlc_", "nll_"} {
			if strings.Contains(p.stderr.String(), secret) {
				c.t.Errorf("%s logged a token", p.name)
			}
		}
	}
}

func progressEvents(d wire.JobDetailResponse) int {
	n := 0
	for _, e := range d.Events {
		if e.EventType != nil && *e.EventType == "progress" {
			n++
		}
	}
	return n
}

// TestE2EJobsAndReceipts checks a worker process running jobs: each
// succeeded job has one job_completed receipt that verifies offline; the
// runtime envelope holds lora_train until it is activated; SIGTERM drains
// the worker, releasing the job that outlives -drain-timeout.
func TestE2EJobsAndReceipts(t *testing.T) {
	t.Parallel()
	c := newCluster(t)
	w := c.startWorkerVia("node-a", c.base(), "-drain-timeout", "1s")
	wid := c.workerID("node-a")

	d := c.dispatch("status_check", nil)
	if !d.Leasable {
		t.Errorf("status_check not leasable: %s", d.Reason)
	}
	sc := c.waitDone(d.Job.ID, "succeeded")
	c.checkSucceeded(sc)
	if sc.Job.WorkerID == nil || *sc.Job.WorkerID != wid {
		t.Errorf("status_check ran on %v, want %s", sc.Job.WorkerID, wid)
	}

	d = c.dispatch("lora_train", map[string]any{"steps": 5, "step_ms": 50})
	if d.Leasable || d.Reason == "" {
		t.Errorf("lora_train leasable=%t reason=%q before activation", d.Leasable, d.Reason)
	}
	// A job dispatched after it runs: the worker leased since, and was
	// not given lora_train.
	c.checkSucceeded(c.waitDone(c.dispatch("status_check", nil).Job.ID, "succeeded"))
	if got := c.job(d.Job.ID); got.Job.State != "queued" {
		t.Fatalf("lora_train is %s before activation", got.Job.State)
	}
	c.activate()
	lt := c.waitDone(d.Job.ID, "succeeded")
	c.checkSucceeded(lt)
	if n := progressEvents(lt); n != 5 {
		t.Errorf("lora_train has %d progress events, want 5", n)
	}
	if len(lt.Artifacts) != 1 || lt.Artifacts[0].ArtifactType != "adapter" || !strings.HasPrefix(lt.Artifacts[0].URI, "file://") {
		t.Fatalf("lora_train artifacts: %+v", lt.Artifacts)
	}
	a := lt.Artifacts[0]
	b, err := os.ReadFile(strings.TrimPrefix(a.URI, "file://"))
	if err != nil {
		t.Fatal(err)
	}
	if int64(len(b)) != a.SizeBytes || a.ChecksumSHA256 == nil || len(*a.ChecksumSHA256) != 64 {
		t.Errorf("artifact size %d (file %d), checksum %v", a.SizeBytes, len(b), a.ChecksumSHA256)
	}
	if lt.Result == nil || !bytes.Contains(lt.Result.Metrics, []byte(`"loss"`)) {
		t.Errorf("lora_train result: %+v", lt.Result)
	}

	// Graceful drain: SIGTERM mid-job; the job does not finish within
	// -drain-timeout (1 s), so it is released, and the worker exits 0.
	long := c.dispatch("lora_train", map[string]any{"steps": 200, "step_ms": 100})
	// Running on the worker, not only accepted: its handler reported.
	waitfor.Within(c.t, jobTimeout, "the long lora_train running with progress", func() bool {
		var jd wire.JobDetailResponse
		return c.try("GET", "/operator/jobs/"+long.Job.ID, nil, &jd) == nil && jd.Job.State == "running" && progressEvents(jd) >= 1
	})
	if err := w.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	select {
	case <-w.done:
		if !w.cmd.ProcessState.Success() {
			t.Errorf("worker exited %v after SIGTERM", w.cmd.ProcessState)
		}
	case <-time.After(startTimeout):
		t.Fatal("the worker did not drain after SIGTERM")
	}
	if jd := c.job(long.Job.ID); jd.Job.State != "queued" {
		t.Errorf("after the drain the long job is %s, want queued (released)", jd.Job.State)
	}
	c.checkNoTokensLogged()
}

// TestE2EWorkerKilledMidJob checks that when a worker is killed with
// SIGKILL mid-job, after its lease's TTL the job goes back to the queue
// and a second worker process finishes it, with exactly one
// job_completed receipt.
func TestE2EWorkerKilledMidJob(t *testing.T) {
	t.Parallel()
	c := newCluster(t)
	c.activate()
	w1 := c.startWorker("node-1")
	wid1 := c.workerID("node-1")

	// 3 s a run: the kill comes at its second step, 1.5 s before its end.
	d := c.dispatch("lora_train", map[string]any{"steps": 6, "step_ms": 500})
	waitfor.Within(c.t, jobTimeout, "lora_train running with progress on node-1", func() bool {
		var jd wire.JobDetailResponse
		return c.try("GET", "/operator/jobs/"+d.Job.ID, nil, &jd) == nil && jd.Job.State == "running" && progressEvents(jd) >= 2
	})
	w1.kill()
	if jd := c.job(d.Job.ID); jd.Job.State == "succeeded" {
		t.Fatal("the job finished before the worker was killed; make it longer")
	}

	c.startWorker("node-2")
	wid2 := c.workerID("node-2")
	jd := c.waitDone(d.Job.ID, "succeeded")
	if jd.Job.WorkerID == nil || *jd.Job.WorkerID != wid2 {
		t.Errorf("the job was finished by %v, want the second worker %s (the first was %s)", jd.Job.WorkerID, wid2, wid1)
	}
	if jd.Job.Attempt < 2 {
		t.Errorf("attempt %d: the expired lease should have used an attempt", jd.Job.Attempt)
	}
	c.checkSucceeded(jd)
	if n := len(c.receiptsOf(receipts.KindJobCompleted, d.Job.ID)); n != 1 {
		t.Fatalf("%d job_completed receipts for the job, want exactly 1", n)
	}
	c.checkNoTokensLogged()
}

// TestE2EServerKilledAndRestarted checks that the server killed with
// SIGKILL mid-run and restarted on the same SQLite file and secrets
// loses nothing it acknowledged, its log only grows, and the worker
// carries on.
func TestE2EServerKilledAndRestarted(t *testing.T) {
	t.Parallel()
	c := newCluster(t)
	c.activate()
	w := c.startWorker("node-r")
	wid := c.workerID("node-r")

	done := c.waitDone(c.dispatch("status_check", nil).Job.ID, "succeeded")
	c.checkSucceeded(done)
	running := c.dispatch("lora_train", map[string]any{"steps": 15, "step_ms": 200})
	waitfor.Within(c.t, jobTimeout, "lora_train running", func() bool {
		var jd wire.JobDetailResponse
		return c.try("GET", "/operator/jobs/"+running.Job.ID, nil, &jd) == nil && jd.Job.State == "running" && progressEvents(jd) >= 1
	})
	queued := c.dispatch("embedding_dry_run", nil) // may be queued, leased or done at the kill

	// What the server acknowledged before the kill.
	var jobsBefore wire.JobListResponse
	c.call("GET", "/operator/jobs?limit=1000", nil, &jobsBefore)
	receiptsBefore := c.allReceipts()
	var oldCheckpoint []byte
	c.call("GET", "/operator/receipts/checkpoint", nil, &oldCheckpoint)
	oldCP, err := receipts.OpenCheckpoint(oldCheckpoint, c.tokens.ReceiptPublicKey, receipts.DefaultOrigin)
	if err != nil {
		t.Fatalf("checkpoint before the kill: %v", err)
	}

	c.server.kill() // it returns once the process is gone
	c.startServer()

	// Nothing acknowledged is lost.
	for _, j := range jobsBefore.Jobs {
		got := c.job(j.ID)
		if j.State == "succeeded" && got.Job.State != "succeeded" {
			t.Errorf("job %s was succeeded before the kill, is %s after", j.ID, got.Job.State)
		}
	}
	for _, j := range []string{done.Job.ID, running.Job.ID, queued.Job.ID} {
		c.job(j)
	}
	for _, r := range receiptsBefore {
		got := c.verifyReceipt(r.ID)
		if got.Kind != r.Kind {
			t.Errorf("receipt %s was %s, is %s", r.ID, r.Kind, got.Kind)
		}
	}
	var newCheckpoint []byte
	c.call("GET", "/operator/receipts/checkpoint", nil, &newCheckpoint)
	newCP, err := receipts.OpenCheckpoint(newCheckpoint, c.tokens.ReceiptPublicKey, receipts.DefaultOrigin)
	if err != nil {
		t.Fatalf("checkpoint after the restart: %v", err)
	}
	if newCP.Size < oldCP.Size {
		t.Fatalf("the log shrank from %d to %d", oldCP.Size, newCP.Size)
	}
	if newCP.Size > oldCP.Size {
		var cons wire.ConsistencyResponse
		c.call("GET", fmt.Sprintf("/operator/receipts/consistency?old=%d&new=%d", oldCP.Size, newCP.Size), nil, &cons)
		if err := receipts.CheckConsistency(oldCP.Tree(), newCP.Tree(), cons.Hashes); err != nil {
			t.Fatalf("the log after the restart is not an extension of the log before: %v", err)
		}
	}

	// The worker carries on: the jobs in flight end, and a job dispatched
	// after the restart runs on the same worker process.
	c.checkSucceeded(c.waitDone(running.Job.ID, "succeeded"))
	c.checkSucceeded(c.waitDone(queued.Job.ID, "succeeded"))
	after := c.waitDone(c.dispatch("status_check", nil).Job.ID, "succeeded")
	c.checkSucceeded(after)
	if after.Job.WorkerID == nil || *after.Job.WorkerID != wid {
		t.Errorf("the job after the restart ran on %v, want %s", after.Job.WorkerID, wid)
	}
	if w.exited() {
		t.Errorf("the worker exited: %v", w.cmd.ProcessState)
	}
	c.checkNoTokensLogged()
	if t.Failed() {
		return
	}
	// Sanity: the server's restart did not print fresh tokens.
	if sc := bufio.NewScanner(strings.NewReader(c.server.stdout.String())); sc.Scan() {
		t.Errorf("the restarted server printed %q: it should not bootstrap again", redact(sc.Text()))
	}
}
