package main

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/cookiejar"
	"net/url"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/nodelane/nodelane/internal/syncbuf"
	"github.com/nodelane/nodelane/internal/waitfor"

	"github.com/nodelane/nodelane/cmd/internal/controlplane"
)

// TestDemoConsole runs the demo with -serve and opens the console it
// prints, as an operator would in a browser: it shows the demo's jobs,
// logs, artifacts and costs, and its receipts verified.
func TestDemoConsole(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithCancel(t.Context())
	dir := t.TempDir()
	out := &syncbuf.Buffer{}
	done := make(chan error, 1)
	go func() { done <- run(ctx, []string{"-dir", dir, "-timeout", "80s", "-serve"}, out) }()
	defer func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("run: %v\n%s", err, out.String())
		}
	}()
	re := regexp.MustCompile(`The web console stays open at (http://\S+/console/)`)
	var consoleURL string
	waitfor.Within(t, 90*time.Second, "the demo to print the console's URL", func() bool {
		if m := re.FindStringSubmatch(out.String()); m != nil {
			consoleURL = m[1]
			return true
		}
		select {
		case err := <-done:
			done <- err
			t.Fatalf("the demo ended: %v\n%s", err, out.String())
		default:
		}
		return false
	})
	b, err := os.ReadFile(filepath.Join(dir, "nodelane-tokens.json"))
	if err != nil {
		t.Fatal(err)
	}
	var tokens controlplane.Tokens
	if err := json.Unmarshal(b, &tokens); err != nil {
		t.Fatal(err)
	}
	jar, _ := cookiejar.New(nil)
	hc := &http.Client{Jar: jar, Timeout: 30 * time.Second}
	get := func(path string) string {
		t.Helper()
		resp, err := hc.Get(consoleURL + strings.TrimPrefix(path, "/"))
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		body, _ := io.ReadAll(resp.Body)
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("GET %s: %d\n%s", path, resp.StatusCode, body)
		}
		return string(body)
	}
	req, _ := http.NewRequest(http.MethodPost, consoleURL+"signin", strings.NewReader(url.Values{"token": {tokens.OperatorToken}}.Encode()))
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	resp, err := hc.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK || !strings.HasSuffix(resp.Request.URL.Path, "/console/") {
		t.Fatalf("sign-in: %d at %s", resp.StatusCode, resp.Request.URL)
	}
	jobs := get("/jobs?job_type=lora_train&state=succeeded")
	m := regexp.MustCompile(`href="/console/jobs/(job_[0-9a-f]+)"`).FindStringSubmatch(jobs)
	if m == nil {
		t.Fatalf("the jobs page lists no succeeded lora_train:\n%s", jobs)
	}
	page := get("/jobs/" + m[1])
	for _, want := range []string{
		`class="badge state-succeeded">succeeded`,
		`<tr class="ev-log">`, // its logs
		"adapter", "file://",  // its artifact
		"USD for", "on rtx-4090 at 1.800000 USD per GPU-hour", // its cost
		`<td>job_charged</td><td class="verified">✔ verified`,
		`<td>job_completed</td><td class="verified">✔ verified`,
	} {
		if !strings.Contains(page, want) {
			t.Errorf("the job page does not show %q", want)
		}
	}
	if strings.Contains(page, "unverified") {
		t.Errorf("a receipt of the job is not verified:\n%s", page)
	}
	if t.Failed() {
		t.Logf("job page:\n%s", page)
	}
}
