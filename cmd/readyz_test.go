package cmd

import (
	"encoding/json"
	"io"
	"net"
	"net/http"
	"net/url"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nodelane/nodelane/internal/testdb"
	"github.com/nodelane/nodelane/internal/waitfor"
	"github.com/nodelane/nodelane/workerapi"
)

// readyz polls the server's GET /readyz until done accepts its answer.
func readyz(t *testing.T, p *proc, base string, done func(code int, r workerapi.ReadyResponse) bool) (int, workerapi.ReadyResponse) {
	t.Helper()
	hc := &http.Client{Timeout: 10 * time.Second}
	var (
		code int
		out  workerapi.ReadyResponse
	)
	waitfor.Within(t, startTimeout, "the awaited answer of GET /readyz", func() bool {
		if p.exited() {
			t.Fatalf("the server exited: %s", p.stderr.String())
		}
		resp, err := hc.Get(base + "/readyz")
		if err != nil {
			return false
		}
		code, out = resp.StatusCode, workerapi.ReadyResponse{}
		err = json.NewDecoder(resp.Body).Decode(&out)
		resp.Body.Close()
		return err == nil && done(code, out)
	})
	return code, out
}

// TestServerReadiness checks that the example server serves GET /readyz:
// ready once its clock has been measured against the database's; with
// -clock-skew (fault testing) its clock is off by more than the 2 s
// allowed and it reports not ready, saying why, and logs the skew as an
// ERROR.
func TestServerReadiness(t *testing.T) {
	t.Parallel()
	c := newCluster(t)
	readyz(t, c.server, c.base(), func(code int, r workerapi.ReadyResponse) bool {
		return code == http.StatusOK && r.Ready
	})

	serverBin, _ := binaries(t)
	dir, addr := t.TempDir(), freeAddr(t)
	skewed := startProc(t, "skewed server", serverBin, nil,
		"-addr", addr,
		"-db", "sqlite:"+filepath.Join(dir, "nodelane.db"),
		"-secrets-file", filepath.Join(dir, "secrets.json"),
		"-clock-skew", "11m")
	code, r := readyz(t, skewed, "http://"+addr, func(code int, r workerapi.ReadyResponse) bool {
		return strings.Contains(r.Reason, "off the database's")
	})
	if code != http.StatusServiceUnavailable || r.Ready {
		t.Fatalf("readiness of a server 11 minutes fast: %d %+v", code, r)
	}
	// The skew measured: 11 minutes, give or take the milliseconds of
	// SQLite's clock and of the reading's round trip.
	m := regexp.MustCompile(`the clock is (\S+) off`).FindStringSubmatch(r.Reason)
	if m == nil {
		t.Fatalf("the reason names no skew: %q", r.Reason)
	}
	if d, err := time.ParseDuration(m[1]); err != nil || d < 11*time.Minute-time.Second || d > 11*time.Minute+time.Second {
		t.Errorf("the reason says the clock is %s off, want 11m (±1s): %q", m[1], r.Reason)
	}
	// Logged as an ERROR too: maybe a moment after /readyz said so.
	waitfor.Until(t, "the skew logged as an ERROR", func() bool {
		return strings.Contains(skewed.stderr.String(), "level=ERROR msg=\"clock skew")
	})
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

// TestServerReadyzFollowsTheDatabase checks that GET /readyz goes 503
// while the server's PostgreSQL does not answer, saying so, and 200 again
// once it answers, while /healthz stays 200: the process serves
// throughout.
func TestServerReadyzFollowsTheDatabase(t *testing.T) {
	t.Parallel()
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
