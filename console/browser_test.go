package console_test

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/chromedp/cdproto/cdp"
	cdplog "github.com/chromedp/cdproto/log"
	"github.com/chromedp/cdproto/runtime"
	"github.com/chromedp/chromedp"
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

// TestBrowser drives headless Chromium through the console as an
// operator would: sign in, dispatch a job the envelope holds, activate
// the runtime, watch the job run and its logs arrive without reloading
// (the page's script), then its cost and verified receipts. It fails on
// any script error or Content-Security-Policy report in the page.
// Screenshots go to the test's temporary directory, or to the directory
// $CONSOLE_SCREENSHOTS names, to look at them.
func TestBrowser(t *testing.T) {
	exe := chromium(t)
	f := newFixture(t, nil)
	n := registerNode(t, f, "gpu-1")
	shots := t.TempDir()
	if d := os.Getenv("CONSOLE_SCREENSHOTS"); d != "" {
		shots = d
	}

	actx, cancelAlloc := chromedp.NewExecAllocator(context.WithoutCancel(t.Context()), append(chromedp.DefaultExecAllocatorOptions[:],
		chromedp.ExecPath(exe), chromedp.NoSandbox, chromedp.Headless, chromedp.DisableGPU,
		chromedp.WindowSize(1280, 1600))...)
	defer cancelAlloc()
	ctx, cancel := chromedp.NewContext(actx)
	defer cancel()

	var (
		mu       sync.Mutex
		problems []string
	)
	if err := chromedp.Listen(ctx, func(ev any) {
		mu.Lock()
		defer mu.Unlock()
		switch e := ev.(type) {
		case *cdplog.EventEntryAdded:
			if e.Entry.Level == cdplog.EntryLevelError || strings.Contains(e.Entry.Text, "Content Security Policy") {
				problems = append(problems, fmt.Sprintf("log %s: %s (%s)", e.Entry.Level, e.Entry.Text, e.Entry.URL))
			}
		case *runtime.EventExceptionThrown:
			problems = append(problems, fmt.Sprintf("exception: %s at %s:%d", e.ExceptionDetails.Text, e.ExceptionDetails.URL, e.ExceptionDetails.LineNumber))
		}
	}); err != nil {
		t.Fatalf("starting chromium: %v", err)
	}
	enableLog := chromedp.Func(func(ctx context.Context, tg *chromedp.Target) error {
		_, err := cdp.Call(ctx, tg, cdplog.Enable, cdp.Empty{})
		return err
	})
	step := func(what string, actions ...chromedp.Action[chromedp.Void]) {
		t.Helper()
		sctx, c := context.WithTimeout(ctx, 45*time.Second)
		defer c()
		if err := chromedp.Do(sctx, actions...); err != nil {
			t.Fatalf("%s: %v", what, err)
		}
	}
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
	if err := chromedp.Do(ctx, enableLog, chromedp.Navigate(f.url+"/")); err != nil {
		t.Fatalf("opening the console: %v", err)
	}
	if l := location(); !strings.HasSuffix(l, "/console/signin") {
		t.Fatalf("the console sent an unsigned browser to %s", l)
	}
	shot("1-signin")
	step("sign in",
		chromedp.SetValue(chromedp.CSS("#token"), f.env.OperatorToken),
		chromedp.Click(chromedp.CSS("form.card button")),
		chromedp.WaitVisible(chromedp.CSS("#liveness")),
	)
	if got := text("#liveness"); !strings.Contains(got, "1 workers: online 1") {
		t.Errorf("overview liveness: %q", got)
	}
	shot("2-overview")

	// Dispatch lora_train: the envelope holds it.
	step("dispatch",
		chromedp.Navigate(f.url+"/jobs"),
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
		chromedp.Navigate(f.url+"/envelope"),
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
	step("job page", chromedp.Navigate(jobURL), chromedp.WaitVisible(chromedp.CSS("#events")))
	runJob(t, n, id)
	step("logs follow live", chromedp.Func(func(ctx context.Context, tg *chromedp.Target) error {
		_, err := chromedp.Poll[bool](`document.querySelector('#job-state').textContent === 'succeeded' &&
			document.querySelector('#events tbody').textContent.includes('epoch 2') &&
			document.querySelector('#events-more').textContent.includes('The job has ended')`,
			chromedp.WithPollingTimeout(30*time.Second))(ctx, tg)
		return err
	}))
	if got := text("#events tbody"); !strings.Contains(got, "epoch 1 <b>loss</b>") || !strings.Contains(got, "half way") {
		t.Errorf("the followed logs: %q", got)
	}
	shot("5-followed")

	step("reload", chromedp.Reload(), chromedp.WaitVisible(chromedp.CSS("#cost")))
	if got := text("#cost"); !strings.Contains(got, "USD for") || !strings.Contains(got, "rtx-4090") {
		t.Errorf("cost: %q", got)
	}
	if got := text("#receipts"); !strings.Contains(got, "job_charged") || !strings.Contains(got, "✔ verified") || strings.Contains(got, "✘") {
		t.Errorf("receipts: %q", got)
	}
	shot("6-succeeded")

	mu.Lock()
	defer mu.Unlock()
	for _, p := range problems {
		t.Errorf("in the page: %s", p)
	}
}
