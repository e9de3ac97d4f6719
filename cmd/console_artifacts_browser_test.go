package cmd

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/cdproto/browser"
	"github.com/chromedp/chromedp"

	"github.com/nodelane/nodelane/console"
	"github.com/nodelane/nodelane/internal/apitest"
	"github.com/nodelane/nodelane/lease"
	"github.com/nodelane/nodelane/workerapi"
	"github.com/nodelane/nodelane/workerapi/artifacttest"
	"github.com/nodelane/nodelane/workerapi/wire"
)

// browserArtifactJob runs a job on env that stores content as
// adapter.safetensors through the worker routes (the upload, each part a
// signed PUT, the finish) and reports a log with a very long URI and
// name as metadata only. It returns the job's id and the stored
// artifact's.
func browserArtifactJob(t *testing.T, env *apitest.Env, content []byte) (jobID, stored string) {
	t.Helper()
	n := env.NewNode(t, "gpu-1")
	n.Register(t, wire.RegisterRequest{
		Name: "gpu-1", Hostname: "gpu-1.local", Role: "local_gpu_compute",
		Capabilities:   wire.Capabilities{GPUs: []wire.GPU{{SKU: "rtx-4090", VRAMMB: 24576}}, JobTypes: []string{"status_check"}},
		GovernorLimits: wire.GovernorLimits{MaxJobs: 1, MaxVRAMMB: 24576}, Version: "worker/1.0.0", HeartbeatIntervalSeconds: 30,
	})
	jobID = env.Enqueue(t, lease.NewJob{Type: "status_check"}).ID
	l := apitest.Post[wire.LeaseResponse](t, n, "/workers/jobs/lease", wire.LeaseRequest{SupportedJobTypes: []string{"status_check"}, SupportedGPUSKUs: []string{"rtx-4090"}, MaxJobs: 1}, http.StatusOK)
	if l.Job == nil || l.Job.ID != jobID {
		t.Fatalf("lease = %+v, want job %s", l, jobID)
	}
	tok := *l.LeaseToken
	apitest.Post[wire.AcceptResponse](t, n, wire.JobPath(jobID, "accept"), wire.TokenRequest{LeaseToken: tok}, http.StatusOK)
	stored = n.Upload(t, jobID, tok, "adapter", "adapter.safetensors", content).ArtifactID
	h := sha256.Sum256(content)
	sum := hex.EncodeToString(h[:])
	logSize := int64(123_456_789)
	apitest.Post[wire.ArtifactResponse](t, n, wire.JobPath(jobID, wire.ActionArtifacts), wire.ArtifactRequest{
		LeaseToken: tok, ArtifactType: "log", Name: "train-" + strings.Repeat("x", 120) + ".log",
		URI:            "file:///var/lib/nodelane/runs/" + strings.Repeat("a-rather-long-directory-name/", 12) + "train.log",
		ChecksumSHA256: &sum, SizeBytes: &logSize,
	}, http.StatusCreated)
	return jobID, stored
}

// TestBrowserArtifacts drives headless Chromium through a job page with a
// stored artifact and a metadata-only one whose URI and name are very
// long, at a laptop's width and a narrow window: the page never scrolls
// sideways (the artifact table fits, its long cells wrap), only the
// stored artifact has a Download link, and clicking it saves the
// artifact's exact bytes. The console runs in process over a control
// plane that stores bytes in memory. $CONSOLE_SCREENSHOTS, when set,
// names a directory for screenshots of the page at each width.
func TestBrowserArtifacts(t *testing.T) {
	t.Parallel()
	exe := chromium(t)
	env := apitest.New(t, "sqlite", apitest.Started(), apitest.WithConfig(func(c *workerapi.Config) {
		c.Artifacts.Store = artifacttest.NewMemory()
		c.Artifacts.PartSize = workerapi.MinPartSize
		c.Artifacts.MaxBytes = 1 << 30
	}))
	con, err := console.New(console.Config{API: env.Server.OperatorHandler(), VerifierKey: env.Server.ReceiptVerifierKey(), Origin: env.Config.Origin})
	if err != nil {
		t.Fatal(err)
	}
	mux := http.NewServeMux()
	mux.Handle("/console/", http.StripPrefix("/console", con))
	srv := httptest.NewServer(mux)
	t.Cleanup(srv.Close)
	base := srv.URL + "/console"
	content := bytes.Repeat([]byte("weights\x00\x01\x02 0123456789abcdef"), 100_000) // 2.6 MiB: three parts
	jobID, stored := browserArtifactJob(t, env, content)

	bs := newBrowserSession(t, exe, 1280, 900, 45*time.Second)
	ctx, step, eval := bs.ctx, bs.step, bs.eval

	// The first run starts the browser, under ctx: a step's shorter
	// context would end it.
	if err := chromedp.Do(ctx, chromedp.Navigate(base+"/signin")); err != nil {
		t.Fatalf("opening the console: %v", err)
	}
	step("sign in",
		chromedp.SetValue(chromedp.CSS("#token"), env.OperatorToken),
		chromedp.Click(chromedp.CSS("form.card button")),
		chromedp.WaitVisible(chromedp.CSS("#liveness")),
	)
	// The page's width against the window's; the artifact table's right
	// edge against the page's.
	const layout = `(() => { const d = document.documentElement, t = document.querySelector('#artifacts').getBoundingClientRect();
		return d.scrollWidth + ' ' + d.clientWidth + ' ' + Math.ceil(t.right) + ' ' + document.querySelectorAll('#artifacts a[download]').length; })()`
	for _, width := range []int64{1280, 700} {
		step(fmt.Sprintf("job page at %d px", width), chromedp.EmulateViewport(width, 900), chromedp.Navigate(base+"/jobs/"+jobID), chromedp.WaitVisible(chromedp.CSS("#artifacts")))
		var scroll, client, right, links int
		if _, err := fmt.Sscan(eval(layout), &scroll, &client, &right, &links); err != nil {
			t.Fatal(err)
		}
		if scroll > client || right > client {
			t.Errorf("at %d px the page is %d px wide in a window of %d, the artifact table ends at %d: it runs off the page", width, scroll, client, right)
		}
		if links != 1 {
			t.Errorf("at %d px: %d Download links, want 1 (the stored artifact's)", width, links)
		}
		if d := os.Getenv("CONSOLE_SCREENSHOTS"); d != "" {
			b, err := chromedp.Run(ctx, chromedp.FullScreenshot(100))
			if err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(filepath.Join(d, fmt.Sprintf("artifacts-%d.png", width)), b, 0o600); err != nil {
				t.Fatal(err)
			}
		}
	}
	if href := eval(`document.querySelector('#artifacts a[download]').getAttribute('href')`); href != "/console/artifacts/"+stored+"/download" {
		t.Errorf("the Download link goes to %q", href)
	}
	if got := eval(`document.querySelector('#artifacts').textContent`); !strings.Contains(got, "2.6 MiB") || !strings.Contains(got, "117.7 MiB") {
		t.Errorf("the artifact table shows no human sizes: %q", got)
	}

	dir := t.TempDir()
	progress := chromedp.Events(ctx, browser.DownloadProgress)
	step("download",
		chromedp.Func(func(ctx context.Context, _ *chromedp.Target) error {
			on := true
			_, err := chromedp.Call(ctx, browser.SetDownloadBehavior, browser.SetDownloadBehaviorParams{
				Behavior: browser.SetDownloadBehaviorBehaviorAllowAndName, DownloadPath: dir, EventsEnabled: &on,
			})
			return err
		}),
		chromedp.Click(chromedp.CSS("#artifacts a[download]")),
	)
	for ev, err := range progress {
		if err != nil {
			t.Fatalf("waiting for the download: %v", err)
		}
		if ev.State == browser.DownloadProgressStateCanceled {
			t.Fatalf("the download was canceled: %+v", ev)
		}
		if ev.State != browser.DownloadProgressStateCompleted {
			continue
		}
		got, err := os.ReadFile(filepath.Join(dir, ev.GUID))
		if err != nil || !bytes.Equal(got, content) {
			t.Fatalf("the downloaded file: %d bytes (%v), want the artifact's %d", len(got), err, len(content))
		}
		break
	}
}
