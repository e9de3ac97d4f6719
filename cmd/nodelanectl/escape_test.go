package main

import (
	"bytes"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/nodelane/nodelane/internal/apitest"
	"github.com/nodelane/nodelane/internal/testdb"
	"github.com/nodelane/nodelane/lease"
	"github.com/nodelane/nodelane/workerapi/wire"
)

// What a hostile node sends to take over an operator's terminal: clear
// the screen, write the clipboard (OSC 52), a C1 CSI, and a right-to-left
// override that reorders what follows.
const (
	clearScreen = "\x1b[2J"
	clipboard   = "\x1b]52;c;cm0gLXJmIH4=\x07"
	c1CSI       = "\u009b2J"
	rtlOverride = "\u202e"
)

// raw reports the first character of out that a terminal would act on.
func raw(out string) (rune, bool) {
	for _, r := range out {
		if r != '\n' && unsafeRune(r) {
			return r, true
		}
	}
	return 0, false
}

func TestEscapeText(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		in, want string
		keepTab  bool
	}{
		{"gpu-1.local", "gpu-1.local", false},
		{"naïve ✓ \uFFFD", "naïve ✓ \uFFFD", false},
		{"a" + clearScreen + "b", `a\x1b[2Jb`, false},
		{clipboard, `\x1b]52;c;cm0gLXJmIH4=\x07`, false},
		{c1CSI, `\u009b2J`, false},
		{"abc" + rtlOverride + "gpj.exe", `abc\u202egpj.exe`, false},
		{"a\x00b\x7f", `a\x00b\x7f`, false},
		{"a\tb\nc\r", `a\x09b\x0ac\x0d`, false},
		{"a\tb\nc", "a\tb\\x0ac", true},
		{"bad \xff\x9b byte", `bad \xff\x9b byte`, false},
	} {
		if got := escapeText(tc.in, tc.keepTab); got != tc.want {
			t.Errorf("escapeText(%q, %v) = %q, want %q", tc.in, tc.keepTab, got, tc.want)
		}
	}
}

// A node's name, hostname and node_id as a control plane keeps them from
// before it refused control characters (or as a hostile proxy answers):
// workers list and show print them escaped.
func TestWorkersEscaped(t *testing.T) {
	t.Parallel()
	w := wire.WorkerView{
		WorkerID: "wrk_1", NodeID: "node" + clearScreen, Name: "gpu" + clipboard, Hostname: "h" + c1CSI + rtlOverride,
		Status: "idle", Tags: []string{"lab" + clearScreen},
		Capabilities: wire.Capabilities{GPUs: []wire.GPU{{SKU: "rtx" + clipboard}}},
	}
	srv := httptest.NewServer(http.HandlerFunc(func(rw http.ResponseWriter, r *http.Request) {
		rw.Header().Set("Content-Type", "application/json")
		switch r.URL.Path {
		case "/operator/workers":
			json.NewEncoder(rw).Encode(wire.WorkerListResponse{Workers: []wire.WorkerView{w}})
		case "/operator/workers/wrk_1":
			json.NewEncoder(rw).Encode(wire.WorkerDetailResponse{Worker: w})
		default:
			rw.WriteHeader(http.StatusNotFound)
			json.NewEncoder(rw).Encode(wire.ErrorBody{Error: wire.ErrorDetail{Code: "not_found", Message: "no worker " + clearScreen}})
		}
	}))
	t.Cleanup(srv.Close)
	for _, args := range [][]string{{"workers", "list"}, {"workers", "show", "wrk_1"}, {"workers", "show", "wrk_2"}} {
		out, errOut, _ := runCtl(t, t.TempDir(), append([]string{"-server", srv.URL}, args...)...)
		if r, ok := raw(out + errOut); ok {
			t.Errorf("%v printed %U raw:\n%q", args, r, out+errOut)
		}
		if !strings.Contains(out+errOut, `\x1b[2J`) {
			t.Errorf("%v does not show the escape as text:\n%s", args, out+errOut)
		}
	}
}

// A job's log lines and messages, as a real control plane keeps them
// (free text holds escapes), reach the terminal escaped; -o json stays
// the API's JSON.
func TestJobLogsEscaped(t *testing.T) {
	t.Parallel()
	for _, d := range testdb.Dialects() {
		t.Run(d.Name, func(t *testing.T) {
			t.Parallel()
			env := apitest.New(t, d.Name)
			n := env.NewNode(t, "gpu-1")
			n.Register(t, wire.RegisterRequest{
				Name: "gpu-1", Hostname: "gpu-1.local", Role: "local_gpu_compute",
				Capabilities:   wire.Capabilities{GPUs: []wire.GPU{{SKU: "rtx-4090", VRAMMB: 24576}}, JobTypes: []string{"status_check"}},
				GovernorLimits: wire.GovernorLimits{MaxJobs: 1, MaxVRAMMB: 24576}, Version: "worker/1.0.0", HeartbeatIntervalSeconds: 30,
			})
			jobID := env.Enqueue(t, lease.NewJob{Type: "status_check"}).ID
			l := apitest.Post[wire.LeaseResponse](t, n, wire.PathLease, wire.LeaseRequest{SupportedJobTypes: []string{"status_check"}, Accept: true}, http.StatusOK)
			if l.Job == nil || l.Job.ID != jobID {
				t.Fatalf("lease = %+v, want job %s", l, jobID)
			}
			line := "epoch 1" + clearScreen + clipboard + c1CSI + rtlOverride + "\n2026-12-05T00:00:00.000Z  log        forged"
			apitest.Post[wire.LogsResponse](t, n, wire.JobPath(jobID, wire.ActionLogs), wire.LogsRequest{LeaseToken: *l.LeaseToken, Entries: []wire.LogEntry{{Seq: 1, Message: line}}}, http.StatusOK)
			apitest.Post[wire.StatusResponse](t, n, wire.JobPath(jobID, wire.ActionStatus), wire.StatusRequest{LeaseToken: *l.LeaseToken, EventType: "progress", Message: clipboard}, http.StatusOK)

			ctl := func(args ...string) string {
				var so, se bytes.Buffer
				code := run(t.Context(), append([]string{"-server", env.URL}, args...), &so, &se, envMap{"HOME": t.TempDir(), "NODELANE_TOKEN": env.OperatorToken}.get)
				if code != exitOK {
					t.Fatalf("%v: exit %d: %s", args, code, se.String())
				}
				return so.String()
			}
			out := ctl("jobs", "logs", jobID)
			if r, ok := raw(out); ok {
				t.Errorf("jobs logs printed %U raw:\n%q", r, out)
			}
			if !strings.Contains(out, `epoch 1\x1b[2J\x1b]52;c;cm0gLXJmIH4=\x07\u009b2J\u202e\x0a2026`) {
				t.Errorf("jobs logs does not show the line escaped, on one line:\n%s", out)
			}
			if lines := strings.Count(out, "\n"); lines != 2 {
				t.Errorf("jobs logs printed %d lines for 2 events:\n%s", lines, out)
			}
			js := ctl("-o", "json", "jobs", "logs", jobID)
			if !strings.Contains(js, `\u001b[2J`) {
				t.Errorf("-o json does not carry the line as JSON:\n%s", js)
			}
		})
	}
}
