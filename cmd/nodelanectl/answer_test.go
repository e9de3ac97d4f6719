package main

import (
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
)

// TestJSONAsItCame checks that -o json prints the API's answer byte for
// byte, fields this build does not know included, while the table reads
// the same answer typed; and that a cost report from a server older than
// the unbilled report (no "unbilled") neither shows nor checks one. No
// real server answers an unknown field or omits unbilled: this one
// answers as a newer and an older server would.
func TestJSONAsItCame(t *testing.T) {
	t.Parallel()
	const jobs = `{"jobs": [{"id": "job_1", "job_type": "status_check", "state": "queued", "attempt": 1, "max_attempts": 3,
  "created_at": "2026-12-01T00:00:00Z", "field_of_a_newer_server": {"x": 1}}], "next": "job_1"}`
	const costs = `{"from":"2026-12-01T00:00:00Z","to":"2026-12-02T00:00:00Z","group_by":"sku","groups":[],` +
		`"total":{"jobs":0,"actual_ms":0,"gpu_hours":"0.000000","cost_micro_usd":0,"cost_usd":"0.000000"}}`
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("Authorization") != "Bearer nlc_test" {
			w.WriteHeader(http.StatusUnauthorized)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		switch r.URL.Path {
		case "/operator/jobs":
			w.Write([]byte(jobs))
		case "/operator/costs":
			w.Write([]byte(costs))
		case "/operator/receipts":
			if r.URL.Query().Get("kind") != "job_charged" {
				t.Errorf("receipts listed with kind=%q: the unbilled report of an older server is checked", r.URL.Query().Get("kind"))
			}
			w.Write([]byte(`{"receipts":[],"next":null}`))
		default:
			http.NotFound(w, r)
		}
	}))
	t.Cleanup(srv.Close)
	home := t.TempDir()

	out, errOut, code := runCtl(t, home, "-server", srv.URL, "-o", "json", "jobs", "list")
	if code != exitOK || out != jobs+"\n" {
		t.Errorf("jobs list -o json: exit %d, stdout\n%s\nwant\n%s\n(stderr %q)", code, out, jobs, errOut)
	}
	out, errOut, code = runCtl(t, home, "-server", srv.URL, "jobs", "list")
	if code != exitOK || !strings.Contains(out, "job_1  status_check  queued") || !strings.Contains(out, "more: -after job_1") {
		t.Errorf("jobs list: exit %d\n%s\n(stderr %q)", code, out, errOut)
	}

	out, errOut, code = runCtl(t, home, "-server", srv.URL, "cost", "report")
	if code != exitOK || strings.Contains(out, "unbilled") || strings.Contains(errOut, "uncharged") || !strings.Contains(errOut, "the 0 job_charged receipts") {
		t.Errorf("cost report of an older server: exit %d\n%s\n(stderr %q)", code, out, errOut)
	}
	out, _, code = runCtl(t, home, "-server", srv.URL, "-o", "json", "cost", "report")
	if code != exitOK || out != costs+"\n" {
		t.Errorf("cost report -o json: exit %d, stdout\n%s", code, out)
	}
}

// TestNoRedirect checks that nodelanectl follows no redirect: the
// answer is an error naming the 3xx, and the bearer token reaches no
// other server.
func TestNoRedirect(t *testing.T) {
	t.Parallel()
	other := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		t.Errorf("the redirect was followed: %s %s (Authorization %t)", r.Method, r.URL, r.Header.Get("Authorization") != "")
	}))
	t.Cleanup(other.Close)
	srv := httptest.NewServer(http.RedirectHandler(other.URL+"/operator/jobs", http.StatusFound))
	t.Cleanup(srv.Close)
	out, errOut, code := runCtl(t, t.TempDir(), "-server", srv.URL, "jobs", "list")
	if code == exitOK || !strings.Contains(errOut, "302") {
		t.Errorf("jobs list against a redirect: exit %d, stdout %q, stderr %q", code, out, errOut)
	}
}
