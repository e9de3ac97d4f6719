package cmd

import (
	"bufio"
	"encoding/json"
	"io"
	"net/http"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nodelane/nodelane/internal/waitfor"
)

// get fetches base+path and returns the status and body.
func get(t *testing.T, url string) (int, string) {
	t.Helper()
	resp, err := (&http.Client{Timeout: 10 * time.Second}).Get(url)
	if err != nil {
		t.Fatalf("GET %s: %v", url, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatalf("GET %s: %v", url, err)
	}
	return resp.StatusCode, string(b)
}

// TestServerMetricsHealthAndJSONLogs checks that the example server
// serves /healthz and /metrics (to the operator token) beside the API; its /metrics lists every
// family of workerapi/prommetrics; with -log-format json every line it
// logs is a JSON object, and a dispatched job is logged at INFO with its
// job_id.
func TestServerMetricsHealthAndJSONLogs(t *testing.T) {
	t.Parallel()
	c := newCluster(t, "-log-format", "json", "-log-level", "debug")
	if code, body := get(t, c.base()+"/healthz"); code != http.StatusOK || body != "ok\n" {
		t.Fatalf("GET /healthz: %d %q", code, body)
	}
	d := c.dispatch("status_check", map[string]any{})
	// A request is counted once answered: maybe a moment after its
	// answer arrived.
	const dispatched = `nodelane_http_request_duration_seconds_count{code="",method="POST",route="/operator/jobs",status="201"} 1`
	var body string
	waitfor.Until(t, "/metrics to count the dispatch", func() bool {
		var b []byte
		c.call("GET", "/metrics", nil, &b)
		body = string(b)
		return strings.Contains(body, dispatched+"\n")
	})
	for _, fam := range []string{
		"nodelane_http_request_duration_seconds histogram",
		"nodelane_leases_total counter",
		"nodelane_receipts_sequenced_total counter",
		"nodelane_receipt_sequencer_lag_seconds histogram",
		"nodelane_nonce_rejections_total counter",
		"nodelane_queue_jobs gauge",
		"nodelane_workers gauge",
		"nodelane_stats_up gauge",
		"go_goroutines gauge",
	} {
		if !strings.Contains(body, "# TYPE "+fam+"\n") {
			t.Errorf("/metrics has no family %q", fam)
		}
	}
	for _, series := range []string{
		`nodelane_queue_jobs{state="queued",type="status_check"} 1`,
		`nodelane_stats_up 1`,
	} {
		if !strings.Contains(body, series+"\n") {
			t.Errorf("/metrics has no line %s", series)
		}
	}

	c.server.kill()
	logged := false
	sc := bufio.NewScanner(strings.NewReader(c.server.stderr.String()))
	for sc.Scan() {
		var rec map[string]any
		if err := json.Unmarshal(sc.Bytes(), &rec); err != nil {
			t.Fatalf("a log line is not JSON: %v: %s", err, sc.Text())
		}
		if rec["msg"] == "job dispatched" && rec["job_id"] == d.Job.ID && rec["level"] == "INFO" {
			logged = true
		}
	}
	if !logged {
		t.Errorf("no INFO \"job dispatched\" with job_id %s:\n%s", d.Job.ID, c.server.stderr.String())
	}
}

// TestServerLogFlags checks that a bad -log-level or -log-format stops
// the server with a clear error.
func TestServerLogFlags(t *testing.T) {
	t.Parallel()
	serverBin, _ := binaries(t)
	for _, args := range [][]string{{"-log-level", "loud"}, {"-log-format", "xml"}} {
		p := startProc(t, "server "+strings.Join(args, " "), serverBin, nil, append([]string{"-addr", freeAddr(t),
			"-db", "sqlite:" + filepath.Join(t.TempDir(), "n.db"), "-secrets-file", filepath.Join(t.TempDir(), "s.json")}, args...)...)
		select {
		case <-p.done:
		case <-time.After(startTimeout):
			t.Fatalf("%v: the server did not stop", args)
		}
		if !strings.Contains(p.stderr.String(), args[0]+" \""+args[1]+"\"") {
			t.Errorf("%v: stderr does not name the flag: %s", args, p.stderr.String())
		}
	}
}
