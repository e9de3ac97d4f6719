package main

import (
	"bytes"
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
)

// TestEveryCommandHasHelp checks that each command's -h shows a
// description and an example, and exits 0.
func TestEveryCommandHasHelp(t *testing.T) {
	t.Parallel()
	for _, g := range sortedKeys(groups) {
		for _, v := range sortedKeys(groups[g]) {
			name := g + " " + v
			h, ok := helps[name]
			if !ok || h.desc == "" || !strings.Contains(h.example, "nodelanectl "+name) {
				t.Errorf("%s: no description, or no example of it: %+v", name, h)
				continue
			}
			out, errOut, code := runCtl(t, t.TempDir(), g, v, "-h")
			if code != exitOK || out != "" || !strings.Contains(errOut, h.desc) || !strings.Contains(errOut, "Examples:\n  nodelanectl "+name) ||
				!strings.Contains(errOut, "-server") {
				t.Errorf("%s -h: exit %d\n%s", name, code, errOut)
			}
			out, _, code = runCtl(t, t.TempDir(), "help", g, v)
			if code != exitOK || !strings.Contains(out, h.desc) {
				t.Errorf("help %s: exit %d\n%s", name, code, out)
			}
		}
	}
	for name := range helps {
		g, v, _ := strings.Cut(name, " ")
		if _, ok := groups[g][v]; !ok {
			t.Errorf("help for %q, which is no command", name)
		}
	}
}

// TestListFormats checks -q, -no-headers and -o wide of a list, and
// that a list asks for newest first unless -order asc.
func TestListFormats(t *testing.T) {
	t.Parallel()
	var (
		mu     sync.Mutex
		orders []string
	)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("Authorization") != "Bearer nlc_test" {
			w.WriteHeader(http.StatusUnauthorized)
			return
		}
		mu.Lock()
		orders = append(orders, r.URL.Query().Get("order"))
		mu.Unlock()
		w.Header().Set("Content-Type", "application/json")
		w.Write([]byte(`{"jobs": [
  {"id": "job_2", "job_type": "status_check", "state": "failed", "attempt": 1, "max_attempts": 3, "priority": 7,
   "created_at": "2026-12-01T00:00:00Z", "last_error": {"code": "exit_3", "message": "bad\u001b[2J"}},
  {"id": "job_1\u001b]0;x\u0007", "job_type": "status_check", "state": "queued", "attempt": 0, "max_attempts": 3, "created_at": "2026-12-01T00:00:00Z"}],
  "next": "job_1"}`))
	}))
	t.Cleanup(srv.Close)
	ctl := func(args ...string) (string, string) {
		t.Helper()
		out, errOut, code := runCtl(t, t.TempDir(), append([]string{"-server", srv.URL}, args...)...)
		if code != exitOK {
			t.Fatalf("%v: exit %d: %s", args, code, errOut)
		}
		return out, errOut
	}
	out, errOut := ctl("jobs", "list", "-q")
	if out != "job_2\n"+`job_1\x1b]0;x\x07`+"\n" || errOut != "more: -after job_1\n" {
		t.Errorf("-q: %q, stderr %q", out, errOut)
	}
	out, errOut = ctl("jobs", "list", "-no-headers")
	if strings.Contains(out, "STATE") || strings.Count(out, "\n") != 2 || !strings.HasPrefix(out, "job_2 ") || errOut != "more: -after job_1\n" {
		t.Errorf("-no-headers: %q, stderr %q", out, errOut)
	}
	out, _ = ctl("jobs", "list")
	if strings.Contains(out, "PRIORITY") || !strings.HasPrefix(out, "ID ") || !strings.Contains(out, "more: -after job_1") {
		t.Errorf("table:\n%s", out)
	}
	out, _ = ctl("jobs", "list", "-o", "wide")
	if !strings.Contains(out, "PRIORITY") || !strings.Contains(out, "exit_3") || !strings.Contains(out, "LAST_ERROR") {
		t.Errorf("-o wide:\n%s", out)
	}
	out, _ = ctl("jobs", "list", "-o", "yaml")
	if !strings.HasPrefix(out, "jobs:\n  - id: job_2\n") || !strings.Contains(out, `message: "bad\x1b[2J"`) || strings.Contains(out, "\x1b") {
		t.Errorf("-o yaml:\n%s", out)
	}
	ctl("jobs", "list", "-order", "asc")
	mu.Lock()
	defer mu.Unlock()
	if want := []string{"desc", "desc", "desc", "desc", "desc", "asc"}; strings.Join(orders, ",") != strings.Join(want, ",") {
		t.Errorf("order= sent: %v, want %v", orders, want)
	}
}

// TestWaitExitStatus checks that submit -wait exits with the job's end,
// and that -timeout ends the wait with exit status 8, against a server
// whose job ends as each case says.
func TestWaitExitStatus(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		final    string
		code     int
		out, err string
	}{
		{"succeeded", exitOK, "job job_1 succeeded after attempt 1 of 3", ""},
		{"failed", exitJobFailed, "job job_1 failed after attempt 1 of 3: oom: out of \\x1b memory", "nodelanectl: job job_1 ended failed: oom: out of \\x1b memory"},
		{"canceled", exitJobCanceled, "job job_1 canceled", "ended canceled"},
		{"running", exitWaitTimeout, "", "the job did not end in time: job job_1 is still running after 300ms"},
	} {
		t.Run(c.final, func(t *testing.T) {
			t.Parallel()
			var reads atomic.Int32
			job := func(state, extra string) string {
				return fmt.Sprintf(`{"id": "job_1", "job_type": "x", "state": %q, "attempt": 1, "max_attempts": 3, "created_at": "2026-12-01T00:00:00Z"%s}`, state, extra)
			}
			srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				w.Header().Set("Content-Type", "application/json")
				if r.Method == "POST" {
					fmt.Fprintf(w, `{"job": %s, "leasable": true, "reason": ""}`, job("queued", ""))
					return
				}
				state, extra := "running", ""
				if reads.Add(1) > 2 {
					state = c.final
				}
				if state == "failed" {
					extra = `, "last_error": {"code": "oom", "message": "out of \u001b memory"}`
				}
				fmt.Fprintf(w, `{"job": %s, "events": [], "events_next": null}`, job(state, extra))
			}))
			t.Cleanup(srv.Close)
			var so, se bytes.Buffer
			env := map[string]string{"HOME": t.TempDir(), "NODELANE_TOKEN": "nlc_test"}
			args := []string{"-server", srv.URL, "jobs", "submit", "-type", "x", "-wait", "-interval", "100ms"}
			if c.final == "running" {
				args = append(args, "-timeout", "300ms")
			}
			code := run(context.Background(), args, &so, &se, func(k string) string { return env[k] })
			if code != c.code || !strings.Contains(so.String(), c.out) || !strings.Contains(se.String(), c.err) {
				t.Errorf("exit %d (want %d)\nstdout %q\nstderr %q", code, c.code, so.String(), se.String())
			}
			if strings.Contains(so.String()+se.String(), "\x1b") {
				t.Errorf("a raw escape was printed")
			}
		})
	}
}
