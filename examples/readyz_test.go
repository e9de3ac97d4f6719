package examples

import (
	"encoding/json"
	"net/http"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/nodelane/nodelane/workerapi"
)

// readyz polls the server's GET /readyz until done accepts its answer.
func readyz(t *testing.T, p *proc, base string, done func(code int, r workerapi.ReadyResponse) bool) (int, workerapi.ReadyResponse) {
	t.Helper()
	hc := &http.Client{Timeout: 10 * time.Second}
	deadline := time.Now().Add(startTimeout)
	var (
		code int
		out  workerapi.ReadyResponse
	)
	for {
		if p.exited() {
			t.Fatalf("the server exited: %s", p.stderr.String())
		}
		if resp, err := hc.Get(base + "/readyz"); err == nil {
			code, out = resp.StatusCode, workerapi.ReadyResponse{}
			err = json.NewDecoder(resp.Body).Decode(&out)
			resp.Body.Close()
			if err == nil && done(code, out) {
				return code, out
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("GET /readyz: last answer %d %+v", code, out)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// The example server serves GET /readyz: ready once its clock has been
// measured against the database's; with -clock-skew (fault testing) its
// clock is off by more than the 2 s allowed and it reports not ready,
// saying why, and logs the skew as an ERROR.
func TestServerReadiness(t *testing.T) {
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
	if !strings.Contains(skewed.stderr.String(), "level=ERROR msg=\"clock skew") {
		t.Errorf("the skew was not logged as an ERROR:\n%s", skewed.stderr.String())
	}
}
