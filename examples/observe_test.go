package examples

import (
	"bufio"
	"encoding/json"
	"io"
	"net"
	"net/http"
	"net/url"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nodelane/nodelane/internal/testdb"
	"github.com/nodelane/nodelane/workerapi"
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

// The example server serves /healthz and /metrics beside the API; its
// /metrics lists every family of workerapi/prommetrics; with -log-format
// json every line it logs is a JSON object, and a dispatched job is
// logged at INFO with its job_id.
func TestServerMetricsHealthAndJSONLogs(t *testing.T) {
	c := newCluster(t, "-log-format", "json", "-log-level", "debug")
	if code, body := get(t, c.base()+"/healthz"); code != http.StatusOK || body != "ok\n" {
		t.Fatalf("GET /healthz: %d %q", code, body)
	}
	d := c.dispatch("status_check", map[string]any{})
	code, body := get(t, c.base()+"/metrics")
	if code != http.StatusOK {
		t.Fatalf("GET /metrics: %d %s", code, body)
	}
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
		`nodelane_http_request_duration_seconds_count{code="",method="POST",route="/operator/jobs",status="201"} 1`,
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

// A bad -log-level or -log-format stops the server with a clear error.
func TestServerLogFlags(t *testing.T) {
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

// tcpProxy forwards connections to a database, and can cut them all and
// refuse new ones, as a network partition or a database down would.
type tcpProxy struct {
	ln       net.Listener
	upstream string

	mu    sync.Mutex
	down  bool
	conns map[net.Conn]bool
}

func newTCPProxy(t *testing.T, upstream string) *tcpProxy {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &tcpProxy{ln: ln, upstream: upstream, conns: map[net.Conn]bool{}}
	t.Cleanup(func() { ln.Close(); p.setDown(true) })
	go p.serve()
	return p
}

func (p *tcpProxy) serve() {
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return
		}
		p.mu.Lock()
		down := p.down
		p.mu.Unlock()
		if down {
			c.Close()
			continue
		}
		u, err := net.DialTimeout("tcp", p.upstream, 5*time.Second)
		if err != nil {
			c.Close()
			continue
		}
		p.mu.Lock()
		p.conns[c], p.conns[u] = true, true
		p.mu.Unlock()
		go func() { io.Copy(u, c); u.Close(); c.Close() }()
		go func() { io.Copy(c, u); u.Close(); c.Close() }()
	}
}

// setDown cuts every connection and refuses new ones (true), or lets
// them through again (false).
func (p *tcpProxy) setDown(down bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.down = down
	if down {
		for c := range p.conns {
			c.Close()
		}
		clear(p.conns)
	}
}

// GET /readyz goes 503 while the server's PostgreSQL does not answer,
// saying so, and 200 again once it answers, while /healthz stays 200:
// the process serves throughout.
func TestServerReadyzFollowsTheDatabase(t *testing.T) {
	db := testdb.Postgres(t)
	u, err := url.Parse(db.DSN)
	if err != nil || u.Scheme == "" {
		t.Fatalf("the PostgreSQL DSN must be a URL for this test to route it through a proxy: %v", err)
	}
	proxy := newTCPProxy(t, u.Host)
	u.Host = proxy.ln.Addr().String()

	serverBin, _ := binaries(t)
	dir, addr := t.TempDir(), freeAddr(t)
	p := startProc(t, "server on postgres", serverBin, nil,
		"-addr", addr, "-db", u.String(), "-secrets-file", filepath.Join(dir, "secrets.json"))
	base := "http://" + addr
	readyz(t, p, base, func(code int, r workerapi.ReadyResponse) bool { return code == http.StatusOK && r.Ready })

	proxy.setDown(true)
	_, r := readyz(t, p, base, func(code int, r workerapi.ReadyResponse) bool { return code == http.StatusServiceUnavailable })
	if r.Ready || !strings.Contains(r.Reason, "database did not answer") {
		t.Fatalf("readiness with the database down: %+v", r)
	}
	if code, _ := get(t, base+"/healthz"); code != http.StatusOK {
		t.Fatalf("GET /healthz with the database down: %d, want 200", code)
	}

	proxy.setDown(false)
	readyz(t, p, base, func(code int, r workerapi.ReadyResponse) bool { return code == http.StatusOK && r.Ready })
}
