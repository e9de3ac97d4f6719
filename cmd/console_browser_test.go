package cmd

import (
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"github.com/nodelane/nodelane/workerapi/client"
	"github.com/nodelane/nodelane/workerapi/wire"
)

// chromium finds the browser: Debian's chromium (.ci/run installs it).
// Without one the test skips, except under CI=true, where that fails.
func chromium(t *testing.T) string {
	t.Helper()
	for _, name := range []string{"chromium", "chromium-browser", "google-chrome"} {
		if p, err := exec.LookPath(name); err == nil {
			return p
		}
	}
	if os.Getenv("CI") == "true" {
		t.Fatal("no chromium on PATH: CI installs the Debian package chromium (.ci/run)")
	}
	t.Skip("no chromium on PATH (apt-get install chromium); under CI=true this fails")
	return ""
}

// browserNode is a node that the test drives step by step through the
// worker routes of the cluster's server, with the library's client.
type browserNode struct {
	cl *client.Client
}

// registerBrowserNode registers a node with an rtx-4090 under the
// cluster's provisioning token.
func registerBrowserNode(t *testing.T, c *cluster, name string) *browserNode {
	t.Helper()
	_, key, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	id, err := client.NewIdentity(key)
	if err != nil {
		t.Fatal(err)
	}
	cl, err := client.New(c.base(), &client.Config{Identity: id})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := cl.Register(t.Context(), c.tokens.ProvisioningToken, wire.RegisterRequest{
		NodeID: name, Name: name, Hostname: name + ".local", Role: "local_gpu_compute",
		Capabilities:   wire.Capabilities{GPUs: []wire.GPU{{SKU: "rtx-4090", VRAMMB: 24576}}, JobTypes: []string{"status_check", "lora_train"}},
		GovernorLimits: wire.GovernorLimits{MaxJobs: 2, MaxVRAMMB: 24576},
		Version:        "worker/1.0.0", HeartbeatIntervalSeconds: 30,
	}); err != nil {
		t.Fatalf("registering %s: %v", name, err)
	}
	return &browserNode{cl: cl}
}

// run leases the queued job id and runs it to success: a status event,
// two log lines (one with markup, which the page must show as text), an
// artifact, completion.
func (n *browserNode) run(t *testing.T, id string) {
	t.Helper()
	ctx := t.Context()
	must := func(what string, err error) {
		t.Helper()
		if err != nil {
			t.Fatalf("%s: %v", what, err)
		}
	}
	l, err := n.cl.Lease(ctx, wire.LeaseRequest{SupportedJobTypes: []string{"status_check", "lora_train"}, SupportedGPUSKUs: []string{"rtx-4090"}, MaxJobs: 1})
	must("lease", err)
	if l.Job == nil || l.Job.ID != id || l.LeaseToken == nil {
		t.Fatalf("lease = %+v, want job %s", l, id)
	}
	tok := *l.LeaseToken
	_, err = n.cl.Accept(ctx, id, wire.TokenRequest{LeaseToken: tok})
	must("accept", err)
	_, err = n.cl.Status(ctx, id, wire.StatusRequest{LeaseToken: tok, EventType: "progress", Message: "half way", Payload: json.RawMessage(`{"step":1}`)})
	must("status", err)
	_, err = n.cl.Logs(ctx, id, wire.LogsRequest{LeaseToken: tok, Entries: []wire.LogEntry{{Seq: 1, Message: "epoch 1 <b>loss</b>"}, {Seq: 2, Message: "epoch 2"}}})
	must("logs", err)
	sum := strings.Repeat("ab", 32)
	size := int64(4)
	_, err = n.cl.Artifact(ctx, id, wire.ArtifactRequest{
		LeaseToken: tok, ArtifactType: "adapter", Name: "adapter.safetensors", URI: "file:///models/adapter.safetensors",
		ChecksumSHA256: &sum, SizeBytes: &size,
	})
	must("artifact", err)
	// The job runs for a while, as a job does: its cost is for a run
	// time above 0 ms. The sleep is the run, not a wait for something.
	time.Sleep(5 * time.Millisecond)
	done, err := n.cl.Complete(ctx, id, wire.CompleteRequest{LeaseToken: tok, Metrics: json.RawMessage(`{"loss":0.12}`), WaitForProofs: true})
	must("complete", err)
	if done.Job.State != wire.JobStateSucceeded || done.Checkpoint == "" {
		t.Fatalf("complete = %+v", done)
	}
}

// TestBrowser drives headless Chromium through the console of a running
// cmd/server, mounted at /console/ as the server mounts it, as an
// operator would: sign in, dispatch a job the envelope holds, activate
// the runtime, watch the job run (a node driven through the worker
// routes) and its logs arrive in the log viewer without reloading (the page's script), then
// its cost and verified receipts. It fails on any script error or
// Content-Security-Policy report in the page. Screenshots go to the
// test's temporary directory, or to the directory $CONSOLE_SCREENSHOTS
// names, to look at them.
func TestBrowser(t *testing.T) {
	t.Parallel()
	exe := chromium(t)
	// The node below sends no heartbeats between its steps: a lease of
	// minutes, not the cluster's usual 3 s, keeps a stall of the machine
	// (Chromium and the rest of the suite share it) from expiring the
	// job between accept and complete.
	c := newCluster(t, "-lease-ttl", "2m", "-accept-timeout", "2m")
	n := registerBrowserNode(t, c, "gpu-1")
	base := c.base() + "/console"
	shots := t.TempDir()
	if d := os.Getenv("CONSOLE_SCREENSHOTS"); d != "" {
		shots = d
	}

	bs := newBrowserSession(t, exe, 1280, 1600, 45*time.Second)
	ctx, step := bs.ctx, bs.step
	enableLog := bs.listen()
	text := func(sel string) string {
		t.Helper()
		s, err := chromedp.Run(ctx, chromedp.TextContent(chromedp.CSS(sel)))
		if err != nil {
			t.Fatalf("text of %s: %v", sel, err)
		}
		return s
	}
	shot := func(name string) {
		t.Helper()
		b, err := chromedp.Run(ctx, chromedp.FullScreenshot(100))
		if err != nil {
			t.Fatalf("screenshot %s: %v", name, err)
		}
		p := filepath.Join(shots, name+".png")
		if err := os.WriteFile(p, b, 0o600); err != nil {
			t.Fatal(err)
		}
		t.Logf("screenshot %s (%d bytes)", p, len(b))
	}
	location := func() string {
		t.Helper()
		l, err := chromedp.Run(ctx, chromedp.Location())
		if err != nil {
			t.Fatal(err)
		}
		return l
	}

	// Sign in.
	if err := chromedp.Do(ctx, enableLog, chromedp.Navigate(base+"/")); err != nil {
		t.Fatalf("opening the console: %v", err)
	}
	if l := location(); !strings.HasSuffix(l, "/console/signin") {
		t.Fatalf("the console sent an unsigned browser to %s", l)
	}
	shot("1-signin")
	step("sign in",
		chromedp.SetValue(chromedp.CSS("#token"), c.tokens.OperatorToken),
		chromedp.Click(chromedp.CSS("form.card button")),
		chromedp.WaitVisible(chromedp.CSS("#liveness")),
	)
	if got := text("#liveness"); !strings.Contains(got, "1 workers: online 1") {
		t.Errorf("overview liveness: %q", got)
	}
	shot("2-overview")

	// Dispatch lora_train: the envelope holds it.
	step("dispatch",
		chromedp.Navigate(base+"/jobs"),
		chromedp.SetValue(chromedp.CSS(`form.card input[name=job_type]`), "lora_train"),
		chromedp.SetValue(chromedp.CSS(`form.card input[name=gpu_sku]`), "rtx-4090"),
		chromedp.Click(chromedp.CSS(`form.card button`)),
		chromedp.WaitVisible(chromedp.CSS("#leasable")),
	)
	jobURL := location()
	id := jobURL[strings.LastIndex(jobURL, "/")+1:]
	if got := text("#leasable"); !strings.Contains(got, "Not leasable now") {
		t.Errorf("a blocked job's leasability: %q", got)
	}
	if got := text("p.flash"); !strings.Contains(got, "Dispatched lora_train as job "+id) {
		t.Errorf("dispatch flash: %q", got)
	}
	shot("3-dispatched")

	// Activate the runtime.
	step("activate",
		chromedp.Navigate(base+"/envelope"),
		chromedp.SetValue(chromedp.CSS(`form[action$="/envelope/activate"] input[name=reason]`), "browser test window"),
		chromedp.Click(chromedp.CSS(`form[action$="/envelope/activate"] button`)),
		chromedp.WaitVisible(chromedp.CSS("p.flash")),
	)
	if got := text("#active"); got != "active" {
		t.Errorf("after activation the envelope page says %q", got)
	}
	shot("4-activated")

	// Watch the job: the page is loaded while it is queued; the node runs
	// it; the script shows the new events and the end without a reload.
	step("job page", chromedp.Navigate(jobURL), chromedp.WaitVisible(chromedp.CSS("#log-viewer")))
	if got := text("#job-state"); got != "queued" {
		t.Fatalf("the job page was loaded with the job %q, want queued: the page would not follow it live", got)
	}
	n.run(t, id)
	step("logs follow live", chromedp.Func(func(ctx context.Context, tg *chromedp.Target) error {
		_, err := chromedp.Poll[bool](`document.querySelector('#job-state').textContent === 'succeeded' &&
			document.querySelector('#log-viewer').textContent.includes('epoch 2') &&
			document.querySelector('#log-status').textContent.includes('The job has ended')`,
			chromedp.WithPollingTimeout(30*time.Second))(ctx, tg)
		return err
	}))
	if got := text("#log-viewer"); !strings.Contains(got, "epoch 1 <b>loss</b>") || !strings.Contains(got, "half way") {
		t.Errorf("the followed logs: %q", got)
	}
	shot("5-followed")

	// The server's sequencer logs the job's receipts after the
	// completion's answer: wait for them through the API (the completion
	// receipt verified offline, the charge sequenced), so that the
	// reloaded page has them all with their proofs.
	c.checkSucceeded(c.job(id))
	step("reload", chromedp.Reload(), chromedp.WaitVisible(chromedp.CSS("#cost")))
	if got := text("#cost"); !strings.Contains(got, "USD for") || !strings.Contains(got, "rtx-4090") {
		t.Errorf("cost: %q", got)
	}
	if got := text("#receipts"); !strings.Contains(got, "job_charged") || !strings.Contains(got, "✔ verified") || strings.Contains(got, "✘") {
		t.Errorf("receipts: %q", got)
	}
	shot("6-succeeded")

	bs.mu.Lock()
	defer bs.mu.Unlock()
	for _, p := range bs.problems {
		t.Errorf("in the page: %s", p)
	}
}
