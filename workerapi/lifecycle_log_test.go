package workerapi_test

import (
	"context"
	"encoding/json"
	"log/slog"
	"net/http"
	"testing"
	"time"

	"github.com/nodelane/nodelane/internal/apitest"
	"github.com/nodelane/nodelane/internal/logtest"
	"github.com/nodelane/nodelane/workerapi"
	"github.com/nodelane/nodelane/workerapi/wire"
)

// attrs returns a record's attributes as strings.
func attrs(r slog.Record) map[string]string {
	m := map[string]string{}
	r.Attrs(func(a slog.Attr) bool {
		m[a.Key] = a.Value.String()
		return true
	})
	return m
}

// Each change of a job is logged once, at INFO, when it commits, with
// event, job_id, job_type, worker_id (when it has a lease), attempt and
// state; failures and expiries with their reason. Request logs carry the
// worker_id of a signed request and the job_id of its path.
func TestJobLifecycleLogs(t *testing.T) {
	t.Parallel()
	rec := logtest.New()
	env := apitest.New(t, "sqlite", apitest.WithConfig(func(c *workerapi.Config) {
		c.Logger = slog.New(rec)
		c.Lease.HeartbeatInterval = 10 * time.Minute
	}))
	n := env.NewNode(t, "node-1")
	n.Now = env.Clock.Now
	n.Register(t, wire.RegisterRequest{Capabilities: wire.Capabilities{JobTypes: []string{"status_check"}}})
	dispatch := func(prio int) string {
		t.Helper()
		code, b := env.Operator(t, http.MethodPost, "/operator/jobs", map[string]any{"job_type": "status_check", "payload": map[string]any{}, "priority": prio})
		var out wire.DispatchResponse
		if code != http.StatusCreated || json.Unmarshal(b, &out) != nil {
			t.Fatalf("dispatch: %d %s", code, b)
		}
		return out.Job.ID
	}
	signed := func(want int, path string, body any) map[string]any {
		t.Helper()
		resp, b := n.Do(t, http.MethodPost, path, body)
		var m map[string]any
		if resp.StatusCode != want || json.Unmarshal(b, &m) != nil {
			t.Fatalf("POST %s: %d %s", path, resp.StatusCode, b)
		}
		return m
	}
	lease := func(want string) string {
		t.Helper()
		m := signed(http.StatusOK, "/workers/jobs/lease", map[string]any{"supported_job_types": []string{"status_check"}, "max_jobs": 1})
		if id := m["job"].(map[string]any)["id"]; id != want {
			t.Fatalf("leased %v, want %s", id, want)
		}
		return m["lease_token"].(string)
	}
	a, b, c, d := dispatch(4), dispatch(3), dispatch(2), dispatch(1)
	if code, body := env.Operator(t, http.MethodPost, "/operator/jobs/"+d+"/cancel", nil); code != http.StatusOK {
		t.Fatalf("cancel: %d %s", code, body)
	}
	tok := lease(a)
	signed(http.StatusOK, "/workers/jobs/"+a+"/accept", map[string]any{"lease_token": tok})
	signed(http.StatusOK, "/workers/jobs/"+a+"/complete", map[string]any{"lease_token": tok})
	tok = lease(b)
	signed(http.StatusOK, "/workers/jobs/"+b+"/accept", map[string]any{"lease_token": tok})
	signed(http.StatusOK, "/workers/jobs/"+b+"/fail", map[string]any{"lease_token": tok, "error_code": "oom", "message": "out of memory", "retryable": true})
	lost := lease(c)
	env.Clock.Advance(workerapi.DefaultAcceptTimeout + time.Second)
	if err := env.Server.MaintainOnce(context.Background()); err != nil {
		t.Fatal(err)
	}

	w := n.WorkerID
	want := []map[string]string{
		{"msg": "job dispatched", "job_id": a, "attempt": "1", "state": "queued"},
		{"msg": "job dispatched", "job_id": d, "attempt": "1", "state": "queued"},
		{"msg": "job canceled", "job_id": d, "attempt": "1", "state": "canceled", "from": "queued"},
		{"msg": "job leased", "job_id": a, "worker_id": w, "attempt": "1", "state": "leased", "from": "queued"},
		{"msg": "job accepted", "job_id": a, "worker_id": w, "attempt": "1", "state": "running", "from": "leased"},
		{"msg": "job completed", "job_id": a, "worker_id": w, "attempt": "1", "state": "succeeded", "from": "running"},
		{"msg": "job failed", "job_id": b, "worker_id": w, "attempt": "1", "state": "queued", "from": "running", "reason": "oom"},
		{"msg": "job leased", "job_id": c, "worker_id": w, "attempt": "1", "state": "leased"},
		{"msg": "job expired", "job_id": c, "worker_id": w, "attempt": "1", "state": "queued", "reason": "accept_timeout"},
	}
	recs := rec.Records()
	for _, wa := range want {
		found := false
		for _, r := range recs {
			if r.Message != wa["msg"] || r.Level != slog.LevelInfo {
				continue
			}
			got := attrs(r)
			if got["job_id"] != wa["job_id"] {
				continue
			}
			found = true
			if got["job_type"] != "status_check" || got["event"] != wa["msg"][len("job "):] {
				t.Errorf("%s %s: %v", wa["msg"], wa["job_id"], got)
			}
			for k, v := range wa {
				if k != "msg" && got[k] != v {
					t.Errorf("%s %s: %s=%q, want %q (%v)", wa["msg"], wa["job_id"], k, got[k], v, got)
				}
			}
		}
		if !found {
			t.Errorf("no INFO %q for job %s", wa["msg"], wa["job_id"])
		}
	}
	// Each change is logged once.
	seen := map[string]int{}
	for _, r := range recs {
		if a := attrs(r); a["event"] != "" {
			seen[r.Message+" "+a["job_id"]]++
		}
	}
	for k, n := range seen {
		if n != 1 {
			t.Errorf("%s logged %d times", k, n)
		}
	}
	// The refused accept of the expired lease: its request log names the
	// worker and the job.
	signed(http.StatusConflict, "/workers/jobs/"+c+"/accept", map[string]any{"lease_token": lost})
	r := rec.WaitFor(t, "the refused accept's request log", func(r slog.Record) bool {
		return r.Message == "request refused" && attrs(r)["route"] == "/workers/jobs/{id}/accept"
	})
	if got := attrs(r); got["worker_id"] != w || got["job_id"] != c {
		t.Errorf("request log: worker_id %q job_id %q, want %s and %s", got["worker_id"], got["job_id"], w, c)
	}
}
