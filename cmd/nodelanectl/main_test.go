package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nodelane/nodelane/receipts"
	"github.com/nodelane/nodelane/workerapi/wire"
)

// chargedServer answers GET /operator/costs with a total of costMicros
// and unbilled GPU-ms unbilledGPUMS, and GET /operator/receipts with
// recs. No real server can be made to
// report a wrong total: this one checks that cost report catches one.
func chargedServer(t *testing.T, costMicros, unbilledGPUMS int64, recs []receipts.WireReceipt) *httptest.Server {
	t.Helper()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("Authorization") != "Bearer nlc_test" {
			w.WriteHeader(http.StatusUnauthorized)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		switch r.URL.Path {
		case "/operator/costs":
			tot := map[string]any{"jobs": 2, "actual_ms": 120_000, "gpu_hours": "0.033333", "cost_micro_usd": costMicros, "cost_usd": receipts.FormatMicros(costMicros)}
			unbilled := map[string]any{"groups": []any{map[string]any{"reason": "oom", "attempts": 1, "actual_ms": 30_000, "gpu_ms": 60_000, "gpu_hours": "0.016667"}},
				"total": map[string]any{"attempts": 1, "actual_ms": 30_000, "gpu_ms": unbilledGPUMS, "gpu_hours": receipts.Hours(unbilledGPUMS)}}
			json.NewEncoder(w).Encode(map[string]any{"from": "2026-12-01T00:00:00Z", "to": "2026-12-02T00:00:00Z", "group_by": r.URL.Query().Get("group_by"),
				"groups": []any{}, "total": tot, "unbilled": unbilled})
		case "/operator/receipts":
			kind := receipts.Kind(r.URL.Query().Get("kind"))
			if kind != receipts.KindJobCharged && kind != receipts.KindJobFailed && kind != receipts.KindJobCompleted {
				t.Errorf("receipts listed with kind=%q", kind)
			}
			var page []receipts.WireReceipt
			for _, w := range recs {
				if w.Kind == kind {
					page = append(page, w)
				}
			}
			json.NewEncoder(w).Encode(wire.ReceiptListResponse{Receipts: page})
		default:
			http.NotFound(w, r)
		}
	}))
	t.Cleanup(srv.Close)
	return srv
}

// charged returns sequenced receipts: two job_charged of a minute each
// on one GPU at 1.8 USD per GPU-hour (30,000 micro-USD each) in the
// window, one outside it, and a receipt of another kind, which a server
// that ignored kind= would list.
func charged(t *testing.T) []receipts.WireReceipt {
	t.Helper()
	day := time.Date(2026, 12, 1, 10, 0, 0, 0, time.UTC)
	var out []receipts.WireReceipt
	add := func(r receipts.Receipt) {
		r.ID = fmt.Sprintf("rcp_%d", len(out))
		r.PolicyVersion = 1
		b, err := r.Encode()
		if err != nil {
			t.Fatal(err)
		}
		i := int64(len(out))
		out = append(out, receipts.WireReceipt{ID: r.ID, Kind: r.Kind, Index: &i, Body: b})
	}
	for i, end := range []time.Time{day, day.Add(time.Hour), day.Add(24 * time.Hour)} {
		c, err := receipts.NewCharge(end.Add(-time.Minute), end, 1, 1_800_000)
		if err != nil {
			t.Fatal(err)
		}
		r := c.Receipt(fmt.Sprintf("job_%d", i), "wrk_1", "rtx-4090")
		r.ServerTime = end
		add(r)
	}
	add(receipts.Receipt{Kind: receipts.KindWorkerBanned, WorkerID: "wrk_1", ServerTime: day})
	// An attempt that failed after 30 s on two GPUs: 60,000 GPU-ms unbilled.
	add(receipts.Receipt{Kind: receipts.KindJobFailed, JobID: "job_9", WorkerID: "wrk_1", JobType: "lora_train", LeaseEpoch: 1, Attempt: 1,
		ErrorCode: "oom", Outcome: receipts.OutcomeFailed, StartedAt: day.Add(-30 * time.Second), EndedAt: day, ServerTime: day,
		ActualMS: 30_000, GPUCount: 2, Charged: receipts.ChargedNo})
	return out
}

func runCtl(t *testing.T, home string, args ...string) (stdout, stderr string, code int) {
	t.Helper()
	var so, se bytes.Buffer
	env := map[string]string{"HOME": home, "NODELANE_TOKEN": "nlc_test"}
	code = run(context.Background(), args, &so, &se, func(k string) string { return env[k] })
	if strings.Contains(so.String()+se.String(), "nlc_test") {
		t.Errorf("%v printed the token", args)
	}
	return so.String(), se.String(), code
}

// TestCostReportCheck checks that cost report's check passes a total its
// receipts match and fails one they do not (each failure after the
// check's own re-reads, about 2 s), unless -no-check.
func TestCostReportCheck(t *testing.T) {
	t.Parallel()
	recs := charged(t)

	t.Run("right total", func(t *testing.T) {
		t.Parallel()
		srv := chargedServer(t, 60_000, 60_000, recs)
		out, errOut, code := runCtl(t, t.TempDir(), "-server", srv.URL, "cost", "report", "-by", "worker")
		if code != exitOK || !strings.Contains(out, "TOTAL") || !strings.Contains(out, "0.060000") {
			t.Errorf("a right total: exit %d\n%s\n%s", code, out, errOut)
		}
		if !strings.Contains(errOut, "the 2 job_charged receipts of the window sum to 0.060000 USD (60000 micro-USD), as the report") {
			t.Errorf("the check's line: %q", errOut)
		}
		if !strings.Contains(errOut, "the 1 receipts of uncharged attempts of the window sum to 60000 GPU-ms, as the report") || !strings.Contains(out, "oom") {
			t.Errorf("the unbilled check: %q\n%s", errOut, out)
		}
	})

	t.Run("wrong unbilled total", func(t *testing.T) {
		t.Parallel()
		srv := chargedServer(t, 60_000, 59_999, recs)
		if _, errOut, code := runCtl(t, t.TempDir(), "-server", srv.URL, "cost", "report"); code != exitFail || !strings.Contains(errOut, "sum to 1 of 60000 GPU-ms") {
			t.Errorf("a wrong unbilled total: exit %d, stderr %q", code, errOut)
		}
	})

	t.Run("wrong total", func(t *testing.T) {
		t.Parallel()
		srv := chargedServer(t, 60_001, 60_000, recs)
		_, errOut, code := runCtl(t, t.TempDir(), "-server", srv.URL, "cost", "report", "-o", "json")
		if code != exitFail || !strings.Contains(errOut, "60001 micro-USD") || !strings.Contains(errOut, "sum to 0.060000 USD (60000 micro-USD)") {
			t.Errorf("a wrong total: exit %d, stderr %q", code, errOut)
		}
	})

	t.Run("-no-check", func(t *testing.T) {
		t.Parallel()
		srv := chargedServer(t, 60_001, 60_000, recs)
		if _, _, code := runCtl(t, t.TempDir(), "-server", srv.URL, "cost", "report", "-no-check"); code != exitOK {
			t.Errorf("-no-check: exit %d", code)
		}
	})
}

func TestParseFlagsAnywhere(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name string
		args []string
		want []string
		out  string
	}{
		{"flags first", []string{"-o", "json", "a", "b"}, []string{"a", "b"}, "json"},
		{"flags between", []string{"a", "-o", "json", "b"}, []string{"a", "b"}, "json"},
		{"flags last", []string{"a", "b", "-o=json"}, []string{"a", "b"}, "json"},
		{"dashdash", []string{"a", "--", "-o", "json"}, []string{"a", "-o", "json"}, "table"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			a := &app{stderr: new(bytes.Buffer), common: common{output: "table"}}
			fs := a.flags("x y", "A B")
			if err := a.parse(fs, tc.args, 0, 3); err != nil {
				t.Fatal(err)
			}
			if fmt.Sprint(a.args) != fmt.Sprint(tc.want) || a.common.output != tc.out {
				t.Errorf("args %q output %q, want %q %q", a.args, a.common.output, tc.want, tc.out)
			}
		})
	}
}

func TestConfigFileNeverQuoted(t *testing.T) {
	t.Parallel()
	home := t.TempDir()
	path := filepath.Join(home, ".config", "nodelane", "nodelanectl.toml")
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		t.Fatal(err)
	}
	for _, content := range []string{"token = nlc_test\n", "token = [\"nlc_test\"]\n", "server = 1\ntoken = \"nlc_test\"\n"} {
		if err := os.WriteFile(path, []byte(content), 0o600); err != nil {
			t.Fatal(err)
		}
		var so, se bytes.Buffer
		code := run(context.Background(), []string{"jobs", "list"}, &so, &se, func(k string) string {
			if k == "HOME" {
				return home
			}
			return ""
		})
		if code != exitFail || strings.Contains(se.String(), "nlc_test") || !strings.Contains(se.String(), path) {
			t.Errorf("config %q: exit %d, stderr %q", content, code, se.String())
		}
	}
}
