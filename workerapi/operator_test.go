package workerapi_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/url"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/nodelane/nodelane/credential"
	"github.com/nodelane/nodelane/internal/apitest"
	"github.com/nodelane/nodelane/internal/testdb"
	"github.com/nodelane/nodelane/internal/waitfor"
	"github.com/nodelane/nodelane/lease"
	"github.com/nodelane/nodelane/receipts"
	"github.com/nodelane/nodelane/workerapi"
	"github.com/nodelane/nodelane/workerapi/wire"
)

// The field names of the operator answers, exactly.
var (
	jobKeys = []string{"id", "job_type", "payload", "requirements", "state", "attempt", "max_attempts", "priority",
		"created_at", "scheduled_at", "leased_at", "accepted_at", "finished_at", "receipt_id", "cancel_requested",
		"last_error", "worker_id", "policy_version", "actual_ms", "actual_hours", "actual_cost_usd", "actual_cost_micro_usd"}
	artifactKeys = []string{"artifact_id", "artifact_type", "name", "uri", "checksum_sha256", "size_bytes", "metadata",
		"receipt_id", "created_at", "worker_id", "lease_epoch", "job_id", "job_type", "job_state", "status", "stored", "content_url"}
	eventKeys  = []string{"id", "kind", "event_type", "message", "payload", "seq", "lease_epoch", "created_at"}
	workerKeys = []string{"worker_id", "node_id", "name", "hostname", "endpoint_url", "role", "tags", "version",
		"heartbeat_interval_seconds", "capabilities", "governor_limits", "policy_version", "status",
		"liveness", "registered_at", "last_seen_at", "banned", "ban_reason", "banned_at",
		"approval", "approved_at", "approved_by", "approved_job_types", "approved_tags", "pending_job_types", "pending_tags", "max_leases",
		"drain", "drain_requested_at", "drain_requested_by"}
	envelopeKeys = []string{"active", "policy_version", "by", "reason", "until", "changed_at", "safe_types", "blocked_types", "runtime_safe_types"}
	receiptKeys  = []string{"id", "kind", "index", "body"}
)

// obj is a decoded JSON object.
type obj = map[string]any

// onDialects runs f on SQLite and on PostgreSQL.
func onDialects(t *testing.T, f func(t *testing.T, d string)) {
	for _, d := range testdb.Dialects() {
		t.Run(d.Name, func(t *testing.T) {
			t.Parallel()
			f(t, d.Name)
		})
	}
}

// newOpEnv is an Env whose node signatures follow its clock.
func newOpEnv(t *testing.T, dialect string, opts ...apitest.Option) *apitest.Env {
	t.Helper()
	opts = append([]apitest.Option{apitest.WithConfig(func(c *workerapi.Config) { c.ProofWait = 5 * time.Second })}, opts...)
	return apitest.New(t, dialect, opts...)
}

// opCall sends an operator request with token and decodes the answer.
func opCall(t *testing.T, env *apitest.Env, token, method, path string, body any) (int, obj) {
	t.Helper()
	st, b := env.Bearer(t, token, method, path, body)
	var m obj
	if err := json.Unmarshal(b, &m); err != nil {
		t.Fatalf("%s %s: %d, not a JSON object: %v: %s", method, path, st, err, b)
	}
	return st, m
}

// op sends an operator request with the operator token.
func op(t *testing.T, env *apitest.Env, method, path string, body any) (int, obj) {
	t.Helper()
	return opCall(t, env, env.OperatorToken, method, path, body)
}

// mustOp is op that fails the test unless the status is want.
func mustOp(t *testing.T, env *apitest.Env, want int, method, path string, body any) obj {
	t.Helper()
	st, m := op(t, env, method, path, body)
	if st != want {
		t.Fatalf("%s %s: %d, want %d: %v", method, path, st, want, m)
	}
	return m
}

// wantOpError checks an error answer: its status, its code, and the shape
// of PROTOCOL.md's error body.
func wantOpError(t *testing.T, what string, st int, m obj, status int, code string) {
	t.Helper()
	if st != status {
		t.Errorf("%s: status %d, want %d (%v)", what, st, status, m)
		return
	}
	e, _ := m["error"].(obj)
	if e == nil || e["code"] != code {
		t.Errorf("%s: body %v, want code %s", what, m, code)
		return
	}
	exactKeys(t, what+" error", e, "code", "message", "server_time")
}

// exactKeys checks that m has exactly the keys.
func exactKeys(t *testing.T, what string, m obj, keys ...string) {
	t.Helper()
	var got []string
	for k := range m {
		got = append(got, k)
	}
	want := slices.Clone(keys)
	slices.Sort(got)
	slices.Sort(want)
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("%s: keys (-want +got):\n%s", what, diff)
	}
}

// stateUnchanged fails the test if the state changed since before.
func stateUnchanged(t *testing.T, env *apitest.Env, what string, before map[string][]string) {
	t.Helper()
	if diff := cmp.Diff(before, env.Dump(t)); diff != "" {
		t.Errorf("%s changed the state (-before +after):\n%s", what, diff)
	}
}

// decodeReceipt decodes a wire receipt of an answer.
func decodeReceipt(t *testing.T, v any) *receipts.Receipt {
	t.Helper()
	b, _ := json.Marshal(v)
	var w receipts.WireReceipt
	if err := json.Unmarshal(b, &w); err != nil {
		t.Fatalf("wire receipt %s: %v", b, err)
	}
	r, err := receipts.Decode(w.Body)
	if err != nil {
		t.Fatalf("receipt %s: %v", w.ID, err)
	}
	return r
}

// logReceipt reads a receipt from the log by id.
func logReceipt(t *testing.T, env *apitest.Env, id string) *receipts.Receipt {
	t.Helper()
	m := mustOp(t, env, http.StatusOK, "GET", "/operator/receipts/"+id, nil)
	return decodeReceipt(t, m["receipt"])
}

// opGPUNode registers a node with one rtx-4090 of 24 GiB that runs
// status_check and lora_train, at most maxJobs at once.
func opGPUNode(t *testing.T, env *apitest.Env, nodeID string, maxJobs int) *apitest.Node {
	t.Helper()
	n := env.NewNode(t, nodeID)
	n.Now = env.Clock.Now
	n.Register(t, wire.RegisterRequest{
		Name: nodeID, Hostname: nodeID + ".local", Role: "local_gpu_compute", Version: "worker/1.0.0",
		Capabilities: wire.Capabilities{
			GPUs:     []wire.GPU{{SKU: "rtx-4090", VRAMMB: 24576}},
			JobTypes: []string{"status_check", "lora_train"},
		},
		GovernorLimits: wire.GovernorLimits{MaxJobs: maxJobs, MaxVRAMMB: 24576},
		Tags:           []string{"lab"},
	})
	return n
}

// signedCall sends a signed worker request and decodes the answer, failing
// the test unless the status is want.
func signedCall(t *testing.T, n *apitest.Node, want int, path string, body any) obj {
	t.Helper()
	resp, b := n.Do(t, http.MethodPost, path, body)
	var m obj
	if err := json.Unmarshal(b, &m); err != nil {
		t.Fatalf("POST %s: %d, not JSON: %s", path, resp.StatusCode, b)
	}
	if resp.StatusCode != want {
		t.Fatalf("POST %s: %d, want %d: %s", path, resp.StatusCode, want, b)
	}
	return m
}

// leaseOne leases one job for n and returns its id and lease token.
func leaseOne(t *testing.T, n *apitest.Node, types ...string) (jobID, token string) {
	t.Helper()
	m := signedCall(t, n, http.StatusOK, "/workers/jobs/lease", obj{"supported_job_types": types, "max_jobs": 1})
	if m["lease_token"] == nil {
		t.Fatalf("lease: no job: %v", m)
	}
	return m["job"].(obj)["id"].(string), m["lease_token"].(string)
}

// runOne leases and accepts one job for n.
func runOne(t *testing.T, n *apitest.Node, types ...string) (jobID, token string) {
	t.Helper()
	id, tok := leaseOne(t, n, types...)
	signedCall(t, n, http.StatusOK, "/workers/jobs/"+id+"/accept", obj{"lease_token": tok})
	return id, tok
}

func reportArtifact(t *testing.T, n *apitest.Node, jobID, token, typ, name string) string {
	t.Helper()
	m := signedCall(t, n, http.StatusCreated, "/workers/jobs/"+jobID+"/artifacts", obj{
		"lease_token": token, "artifact_type": typ, "name": name, "uri": "s3://bucket/" + jobID + "/" + name,
		"checksum_sha256": strings.Repeat("ab", 32), "size_bytes": 123, "metadata": obj{"rank": 8},
	})
	return m["artifact_id"].(string)
}

func completeJob(t *testing.T, n *apitest.Node, jobID, token string) {
	t.Helper()
	signedCall(t, n, http.StatusOK, "/workers/jobs/"+jobID+"/complete", obj{
		"lease_token": token, "output_uri": "s3://bucket/" + jobID, "metrics": obj{"loss": 0.12}, "final_message": "done",
	})
}

func activateEnvelope(t *testing.T, env *apitest.Env) obj {
	t.Helper()
	return mustOp(t, env, http.StatusOK, "POST", "/operator/envelope/activate", obj{"reason": "nightly LoRA run"})
}

func dispatchJob(t *testing.T, env *apitest.Env, body obj) obj {
	t.Helper()
	return mustOp(t, env, http.StatusCreated, "POST", "/operator/jobs", body)
}

// Dispatch and leasability.

func TestOperatorDispatchLeasability(t *testing.T) {
	t.Parallel()
	onDialects(t, func(t *testing.T, dialect string) {
		env := newOpEnv(t, dialect)
		ctx := context.Background()
		blocked := "lora_train is blocked: the runtime is not activated"

		m := dispatchJob(t, env, obj{
			"job_type": "lora_train", "payload": obj{"steps": 10},
			"requirements": obj{"gpu_sku": "rtx-4090", "gpu_count": 1, "min_vram_mb": 16000},
			"priority":     5, "max_attempts": 2,
		})
		exactKeys(t, "dispatch", m, "job", "leasable", "reason")
		job := m["job"].(obj)
		exactKeys(t, "dispatch job", job, jobKeys...)
		exactKeys(t, "requirements", job["requirements"].(obj), "gpu_sku", "gpu_count", "min_vram_mb", "max_runtime_seconds", "tags")
		if m["leasable"] != false || m["reason"] != blocked {
			t.Errorf("lora_train, envelope inactive: leasable %v, reason %q; want false, %q", m["leasable"], m["reason"], blocked)
		}
		if job["state"] != "queued" || job["job_type"] != "lora_train" || job["priority"] != 5.0 || job["max_attempts"] != 2.0 ||
			job["attempt"] != 1.0 || job["receipt_id"] != nil || job["worker_id"] != nil {
			t.Errorf("job = %v", job)
		}
		if p, _ := json.Marshal(job["payload"]); string(p) != `{"steps":10}` {
			t.Errorf("payload = %s", p)
		}
		loraID := job["id"].(string)

		// Dispatch in Go answers the same.
		j, ok, reason, err := env.Server.Dispatch(ctx, lease.NewJob{Type: "lora_train"})
		if err != nil || ok || reason != blocked || j.State != lease.StateQueued {
			t.Errorf("Dispatch = %v, %v, %q, %v", j, ok, reason, err)
		}

		activateEnvelope(t, env)
		d := mustOp(t, env, http.StatusOK, "GET", "/operator/jobs/"+loraID, nil)
		if d["leasable"] != false || d["reason"] != "no worker is registered" {
			t.Errorf("active, no worker: %v %q", d["leasable"], d["reason"])
		}
		n := opGPUNode(t, env, "studio-gpu-1", 1)
		d = mustOp(t, env, http.StatusOK, "GET", "/operator/jobs/"+loraID, nil)
		if d["leasable"] != true || d["reason"] != "" {
			t.Errorf("active, capable worker: leasable %v, reason %q; want true", d["leasable"], d["reason"])
		}

		// What no registered worker has.
		for _, tc := range []struct {
			name string
			body obj
			want string
		}{
			{"unknown SKU", obj{"job_type": "lora_train", "requirements": obj{"gpu_sku": "h100"}},
				`no registered worker that supports lora_train has a GPU of SKU "h100"`},
			{"too many GPUs", obj{"job_type": "lora_train", "requirements": obj{"gpu_sku": "rtx-4090", "gpu_count": 2}},
				`no registered worker that supports lora_train has 2 GPUs of SKU "rtx-4090" (the most is 1)`},
			{"too little VRAM", obj{"job_type": "lora_train", "requirements": obj{"gpu_count": 1, "min_vram_mb": 40000}},
				"no registered worker that supports lora_train has 1 GPUs with 40000 MiB of VRAM each, within its governor max_vram_mb (the most is 24576 MiB)"},
			{"unsupported type", obj{"job_type": "embedding_dry_run"},
				`no registered worker supports job type "embedding_dry_run"`},
		} {
			m := dispatchJob(t, env, tc.body)
			if m["leasable"] != false || m["reason"] != tc.want {
				t.Errorf("%s: leasable %v, reason %q; want false, %q", tc.name, m["leasable"], m["reason"], tc.want)
			}
		}
		if m := dispatchJob(t, env, obj{"job_type": "lora_train", "requirements": obj{"gpu_sku": "rtx-4090", "min_vram_mb": 24576}}); m["leasable"] != true {
			t.Errorf("a job that just fits: %v", m)
		}

		// Scheduled later.
		_, ok, reason, err = env.Server.Dispatch(ctx, lease.NewJob{Type: "status_check", ScheduledAt: env.Clock.Now().Add(time.Hour)})
		if err != nil || ok || !strings.HasPrefix(reason, "scheduled for ") {
			t.Errorf("scheduled job: %v %q %v", ok, reason, err)
		}

		// Every capable worker at its governor's max_jobs.
		mustOp(t, env, http.StatusOK, "POST", "/operator/envelope/deactivate", obj{"reason": "done"})
		first := dispatchJob(t, env, obj{"job_type": "status_check", "priority": 100})
		if first["leasable"] != true {
			t.Fatalf("status_check: %v", first)
		}
		leased, _ := leaseOne(t, n, "status_check")
		if leased != first["job"].(obj)["id"] {
			t.Fatalf("leased %s, want %s", leased, first["job"].(obj)["id"])
		}
		m = dispatchJob(t, env, obj{"job_type": "status_check"})
		if m["leasable"] != false || !strings.Contains(m["reason"].(string), "governor max_jobs") {
			t.Errorf("worker full: leasable %v, reason %q", m["leasable"], m["reason"])
		}
		waiting := m["job"].(obj)["id"].(string)

		// Banned workers lease nothing.
		mustOp(t, env, http.StatusOK, "POST", "/operator/workers/"+n.WorkerID+"/ban", obj{"reason": "test"})
		d = mustOp(t, env, http.StatusOK, "GET", "/operator/jobs/"+waiting, nil)
		if d["leasable"] != false || d["reason"] != "every worker that can run it is banned (1)" {
			t.Errorf("worker banned: leasable %v, reason %q", d["leasable"], d["reason"])
		}

		// Jobs not queued have no reason.
		d = mustOp(t, env, http.StatusOK, "GET", "/operator/jobs/"+leased, nil)
		if d["leasable"] != false || d["reason"] != "" {
			t.Errorf("leased job: leasable %v, reason %q", d["leasable"], d["reason"])
		}
	})
}

// Jobs.

// opHookLog records the hook events it hears.
type opHookLog struct {
	mu   sync.Mutex
	jobs []workerapi.JobEvent
	rcps []receipts.Stored
}

func (h *opHookLog) JobChanged(_ context.Context, e workerapi.JobEvent) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.jobs = append(h.jobs, e)
}

func (h *opHookLog) ReceiptMinted(_ context.Context, r receipts.Stored) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.rcps = append(h.rcps, r)
}

// waitFor waits for cond, checked under h's lock, to hold.
func (h *opHookLog) waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	waitfor.Until(t, "hooks: "+what, func() bool {
		h.mu.Lock()
		defer h.mu.Unlock()
		return cond()
	})
}

func TestOperatorJobs(t *testing.T) {
	t.Parallel()
	onDialects(t, func(t *testing.T, dialect string) {
		hooks := &opHookLog{}
		env := newOpEnv(t, dialect, apitest.Started(), apitest.WithConfig(func(c *workerapi.Config) { c.Hooks = hooks }))
		n := opGPUNode(t, env, "studio-gpu-1", 2)
		activateEnvelope(t, env)

		a := dispatchJob(t, env, obj{"job_type": "status_check", "priority": 2})["job"].(obj)["id"].(string)
		b := dispatchJob(t, env, obj{"job_type": "lora_train", "priority": 1})["job"].(obj)["id"].(string)
		hooks.waitFor(t, "JobChanged of dispatch", func() bool {
			return len(hooks.jobs) == 2 && hooks.jobs[0].From == "" && hooks.jobs[0].Job.ID == a
		})

		// Lists, filters and pages.
		m := mustOp(t, env, http.StatusOK, "GET", "/operator/jobs", nil)
		exactKeys(t, "job list", m, "jobs", "next")
		if jobs := m["jobs"].([]any); len(jobs) != 2 || m["next"] != nil {
			t.Errorf("list: %d jobs, next %v", len(jobs), m["next"])
		}
		m = mustOp(t, env, http.StatusOK, "GET", "/operator/jobs?limit=1", nil)
		if jobs := m["jobs"].([]any); len(jobs) != 1 || m["next"] != jobs[0].(obj)["id"] {
			t.Fatalf("first page: %v", m)
		}
		// Ids order jobs by the millisecond of their dispatch, and those of
		// one millisecond at random: the second page holds the other job.
		first := m["next"].(string)
		other := map[string]string{a: b, b: a}[first]
		m = mustOp(t, env, http.StatusOK, "GET", "/operator/jobs?limit=1&after="+url.QueryEscape(first), nil)
		if jobs := m["jobs"].([]any); other == "" || len(jobs) != 1 || jobs[0].(obj)["id"] != other {
			t.Errorf("second page after %s: %v", first, m)
		}
		m = mustOp(t, env, http.StatusOK, "GET", "/operator/jobs?job_type=lora_train&state=queued", nil)
		if jobs := m["jobs"].([]any); len(jobs) != 1 || jobs[0].(obj)["id"] != b {
			t.Errorf("lora_train filter: %v", m)
		}
		m = mustOp(t, env, http.StatusOK, "GET", "/operator/jobs?state=succeeded", nil)
		if jobs := m["jobs"].([]any); len(jobs) != 0 {
			t.Errorf("succeeded filter: %v", m)
		}

		// A job run to its end, with events and an artifact.
		id, tok := runOne(t, n, "status_check")
		if id != a {
			t.Fatalf("leased %s, want %s", id, a)
		}
		signedCall(t, n, http.StatusOK, "/workers/jobs/"+a+"/status", obj{"lease_token": tok, "event_type": "progress", "message": "50%", "payload": obj{"step": 5}})
		signedCall(t, n, http.StatusOK, "/workers/jobs/"+a+"/logs", obj{"lease_token": tok, "message": "epoch 1", "seq": 1})
		reportArtifact(t, n, a, tok, "report", "report.json")
		completeJob(t, n, a, tok)

		d := mustOp(t, env, http.StatusOK, "GET", "/operator/jobs/"+a, nil)
		exactKeys(t, "job detail", d, "job", "leasable", "reason", "result", "events", "events_next", "artifacts", "artifacts_next")
		exactKeys(t, "job detail job", d["job"].(obj), jobKeys...)
		if d["job"].(obj)["state"] != "succeeded" || d["job"].(obj)["receipt_id"] == nil || d["reason"] != "" || d["leasable"] != false {
			t.Errorf("detail: %v", d)
		}
		res := d["result"].(obj)
		exactKeys(t, "result", res, "output_uri", "metrics", "final_message")
		if res["output_uri"] != "s3://bucket/"+a || res["final_message"] != "done" {
			t.Errorf("result = %v", res)
		}
		evs := d["events"].([]any)
		if len(evs) != 2 || d["events_next"] != nil {
			t.Fatalf("events = %v", evs)
		}
		st, lg := evs[0].(obj), evs[1].(obj)
		exactKeys(t, "status event", st, eventKeys...)
		exactKeys(t, "log event", lg, eventKeys...)
		if st["kind"] != "status" || st["event_type"] != "progress" || st["message"] != "50%" || st["seq"] != nil || st["lease_epoch"] != 1.0 {
			t.Errorf("status event = %v", st)
		}
		if lg["kind"] != "log" || lg["event_type"] != nil || lg["message"] != "epoch 1" || lg["seq"] != 1.0 {
			t.Errorf("log event = %v", lg)
		}
		if m := mustOp(t, env, http.StatusOK, "GET", fmt.Sprintf("/operator/jobs/%s?events_after=%v", a, st["id"]), nil); len(m["events"].([]any)) != 1 {
			t.Errorf("events_after: %v", m["events"])
		}
		arts := d["artifacts"].([]any)
		if len(arts) != 1 {
			t.Fatalf("artifacts = %v", arts)
		}
		exactKeys(t, "artifact", arts[0].(obj), artifactKeys...)
		if arts[0].(obj)["status"] != "succeeded" || arts[0].(obj)["receipt_id"] == nil {
			t.Errorf("artifact = %v", arts[0])
		}

		// Cancel: a succeeded job cannot be.
		before := env.Dump(t)
		sc, m := op(t, env, "POST", "/operator/jobs/"+a+"/cancel", "")
		wantOpError(t, "cancel succeeded", sc, m, http.StatusConflict, wire.CodeInvalidTransition)
		stateUnchanged(t, env, "cancel of a succeeded job", before)

		// A queued job is canceled at once.
		m = mustOp(t, env, http.StatusOK, "POST", "/operator/jobs/"+b+"/cancel", "")
		exactKeys(t, "cancel", m, "job")
		if j := m["job"].(obj); j["state"] != "canceled" || j["finished_at"] == nil {
			t.Errorf("canceled queued job: %v", j)
		}
		hooks.waitFor(t, "JobChanged of cancel", func() bool {
			e := hooks.jobs[len(hooks.jobs)-1]
			return e.Job.ID == b && e.From == lease.StateQueued && e.Job.State == lease.StateCanceled
		})
		before = env.Dump(t)
		if m := mustOp(t, env, http.StatusOK, "POST", "/operator/jobs/"+b+"/cancel", ""); m["job"].(obj)["state"] != "canceled" {
			t.Errorf("cancel again: %v", m)
		}
		stateUnchanged(t, env, "canceling a canceled job", before)

		// A leased job: cancel is requested.
		c := dispatchJob(t, env, obj{"job_type": "status_check"})["job"].(obj)["id"].(string)
		leaseOne(t, n, "status_check")
		m = mustOp(t, env, http.StatusOK, "POST", "/operator/jobs/"+c+"/cancel", "{}")
		if j := m["job"].(obj); j["state"] != "leased" || j["cancel_requested"] != true {
			t.Errorf("canceled leased job: %v", j)
		}

		// Unknown ids.
		before = env.Dump(t)
		for _, p := range []string{"GET /operator/jobs/job_nope", "POST /operator/jobs/job_nope/cancel"} {
			method, path, _ := strings.Cut(p, " ")
			sc, m := op(t, env, method, path, "")
			wantOpError(t, p, sc, m, http.StatusNotFound, wire.CodeNotFound)
		}
		stateUnchanged(t, env, "unknown job ids", before)
	})
}

// Artifacts.

func TestOperatorArtifacts(t *testing.T) {
	t.Parallel()
	onDialects(t, func(t *testing.T, dialect string) {
		env := newOpEnv(t, dialect)
		n := opGPUNode(t, env, "studio-gpu-1", 4)
		activateEnvelope(t, env)

		// A trained adapter, and the metrics of the same run.
		trained := dispatchJob(t, env, obj{"job_type": "lora_train"})["job"].(obj)["id"].(string)
		id, tok := runOne(t, n, "lora_train")
		adapter := reportArtifact(t, n, id, tok, "adapter", "adapter.safetensors")
		metrics := reportArtifact(t, n, id, tok, "metrics", "metrics.json")
		completeJob(t, n, id, tok)

		// A run that fails.
		failed := dispatchJob(t, env, obj{"job_type": "lora_train", "max_attempts": 1})["job"].(obj)["id"].(string)
		id, tok = runOne(t, n, "lora_train")
		if id != failed {
			t.Fatalf("leased %s, want %s", id, failed)
		}
		failedArt := reportArtifact(t, n, id, tok, "adapter", "partial.safetensors")
		signedCall(t, n, http.StatusOK, "/workers/jobs/"+id+"/fail", obj{"lease_token": tok, "error_code": "oom", "message": "out of memory", "retryable": false})

		// A run in progress.
		pending := dispatchJob(t, env, obj{"job_type": "lora_train"})["job"].(obj)["id"].(string)
		id, tok = runOne(t, n, "lora_train")
		if id != pending {
			t.Fatalf("leased %s, want %s", id, pending)
		}
		pendingArt := reportArtifact(t, n, id, tok, "adapter", "checkpoint.safetensors")

		m := mustOp(t, env, http.StatusOK, "GET", "/operator/artifacts?job_id="+pending, nil)
		if as := m["artifacts"].([]any); len(as) != 1 || as[0].(obj)["status"] != "pending" || as[0].(obj)["job_state"] != "running" {
			t.Errorf("artifact of a running job: %v", as)
		}
		// Canceled: the expiry below ends it.
		mustOp(t, env, http.StatusOK, "POST", "/operator/jobs/"+pending+"/cancel", "")

		// An attempt abandoned (its lease expired) before another succeeded.
		retried := dispatchJob(t, env, obj{"job_type": "lora_train", "priority": 9})["job"].(obj)["id"].(string)
		id, tok = runOne(t, n, "lora_train")
		if id != retried {
			t.Fatalf("leased %s, want %s", id, retried)
		}
		abandoned := reportArtifact(t, n, id, tok, "adapter", "attempt1.safetensors")
		env.Clock.Advance(time.Hour) // past the lease's TTL
		if err := env.Server.MaintainOnce(context.Background()); err != nil {
			t.Fatal(err)
		}
		d := mustOp(t, env, http.StatusOK, "GET", "/operator/jobs/"+retried, nil)
		if d["job"].(obj)["attempt"] != 2.0 || !strings.HasPrefix(d["reason"].(string), "scheduled for ") {
			t.Errorf("expired job: attempt %v, reason %q", d["job"].(obj)["attempt"], d["reason"])
		}
		env.Clock.Advance(time.Hour) // past the retry's backoff
		id, tok = runOne(t, n, "lora_train")
		if id != retried {
			t.Fatalf("leased %s again, want %s", id, retried)
		}
		final := reportArtifact(t, n, id, tok, "adapter", "attempt2.safetensors")
		completeJob(t, n, id, tok)

		m = mustOp(t, env, http.StatusOK, "GET", "/operator/artifacts", nil)
		exactKeys(t, "artifact list", m, "artifacts", "next")
		got := map[string]string{}
		for _, a := range m["artifacts"].([]any) {
			a := a.(obj)
			exactKeys(t, "artifact", a, artifactKeys...)
			got[a["artifact_id"].(string)] = fmt.Sprintf("%s %s %s", a["job_id"], a["job_state"], a["status"])
		}
		want := map[string]string{
			adapter:    trained + " succeeded trained",
			metrics:    trained + " succeeded succeeded",
			failedArt:  failed + " failed failed",
			pendingArt: pending + " canceled canceled",
			abandoned:  retried + " succeeded superseded",
			final:      retried + " succeeded trained",
		}
		if diff := cmp.Diff(want, got); diff != "" {
			t.Errorf("artifact statuses (-want +got):\n%s", diff)
		}

		// Filters.
		m = mustOp(t, env, http.StatusOK, "GET", "/operator/artifacts?job_id="+trained, nil)
		if as := m["artifacts"].([]any); len(as) != 2 {
			t.Errorf("job_id filter: %v", as)
		}
		m = mustOp(t, env, http.StatusOK, "GET", "/operator/artifacts?job_id="+trained+"&artifact_type=adapter", nil)
		as := m["artifacts"].([]any)
		if len(as) != 1 {
			t.Fatalf("job_id and type filter: %v", as)
		}
		a := as[0].(obj)
		if a["artifact_id"] != adapter || a["artifact_type"] != "adapter" || a["name"] != "adapter.safetensors" ||
			a["uri"] != "s3://bucket/"+trained+"/adapter.safetensors" || a["checksum_sha256"] != strings.Repeat("ab", 32) ||
			a["size_bytes"] != 123.0 || a["job_type"] != "lora_train" || a["worker_id"] != n.WorkerID || a["lease_epoch"] != 1.0 {
			t.Errorf("artifact = %v", a)
		}
		if md, _ := json.Marshal(a["metadata"]); string(md) != `{"rank":8}` {
			t.Errorf("metadata = %s", md)
		}
		if r := logReceipt(t, env, a["receipt_id"].(string)); r.Kind != receipts.KindArtifactReported || r.ArtifactID != adapter {
			t.Errorf("artifact receipt = %v", r)
		}
		m = mustOp(t, env, http.StatusOK, "GET", "/operator/artifacts?limit=2", nil)
		if as := m["artifacts"].([]any); len(as) != 2 || m["next"] == nil {
			t.Errorf("limit=2: %v", m)
		}
		sc, e := op(t, env, "GET", "/operator/artifacts?job_id=job_nope", nil)
		wantOpError(t, "unknown job_id", sc, e, http.StatusNotFound, wire.CodeNotFound)
	})
}

// Workers.

func TestOperatorWorkers(t *testing.T) {
	t.Parallel()
	onDialects(t, func(t *testing.T, dialect string) {
		env := newOpEnv(t, dialect)
		n := opGPUNode(t, env, "studio-gpu-1", 2)
		signedCall(t, n, http.StatusOK, "/workers/heartbeat", obj{"status": "busy", "metrics": obj{"gpu_util": 0.93, "vram_used_mb": 20100}})
		dispatchJob(t, env, obj{"job_type": "status_check"})
		jobID, _ := leaseOne(t, n, "status_check")

		m := mustOp(t, env, http.StatusOK, "GET", "/operator/workers", nil)
		exactKeys(t, "worker list", m, "workers", "next")
		ws := m["workers"].([]any)
		if len(ws) != 1 {
			t.Fatalf("workers = %v", ws)
		}
		w := ws[0].(obj)
		exactKeys(t, "worker", w, workerKeys...)
		if w["worker_id"] != n.WorkerID || w["node_id"] != "studio-gpu-1" || w["banned"] != false || w["status"] != "busy" || w["endpoint_url"] != nil {
			t.Errorf("worker = %v", w)
		}
		exactKeys(t, "capabilities", w["capabilities"].(obj), "gpus", "job_types")
		exactKeys(t, "governor_limits", w["governor_limits"].(obj), "max_jobs", "max_vram_mb")

		d := mustOp(t, env, http.StatusOK, "GET", "/operator/workers/"+n.WorkerID, nil)
		exactKeys(t, "worker detail", d, "worker", "metrics", "leases")
		if md, _ := json.Marshal(d["metrics"]); string(md) != `{"gpu_util":0.93,"vram_used_mb":20100}` {
			t.Errorf("metrics = %s", md)
		}
		ls := d["leases"].([]any)
		if len(ls) != 1 {
			t.Fatalf("leases = %v", ls)
		}
		exactKeys(t, "worker lease", ls[0].(obj), "job_id", "job_type", "state", "lease_id", "lease_epoch", "expires_at", "accept_by", "cancel_requested")
		if ls[0].(obj)["job_id"] != jobID || ls[0].(obj)["state"] != "leased" {
			t.Errorf("lease = %v", ls[0])
		}

		// Ban: the receipt, and the worker is refused.
		count := env.Receipts(t)
		m = mustOp(t, env, http.StatusOK, "POST", "/operator/workers/"+n.WorkerID+"/ban", obj{"reason": "stolen key"})
		exactKeys(t, "ban", m, "worker", "receipt_id")
		if w := m["worker"].(obj); w["banned"] != true || w["ban_reason"] != "stolen key" || w["banned_at"] == nil {
			t.Errorf("banned worker = %v", w)
		}
		r := logReceipt(t, env, m["receipt_id"].(string))
		if r.Kind != receipts.KindWorkerBanned || r.WorkerID != n.WorkerID || r.NodeID != "studio-gpu-1" ||
			r.Actor != apitest.OperatorID || r.Reason != "stolen key" || r.PolicyVersion != 1 {
			t.Errorf("ban receipt = %v", r)
		}
		if got := env.Receipts(t); got != count+1 {
			t.Errorf("receipts: %d, want %d", got, count+1)
		}
		resp, b := n.Do(t, http.MethodPost, "/workers/heartbeat", obj{"status": "idle"})
		var e obj
		json.Unmarshal(b, &e)
		wantOpError(t, "heartbeat of a banned worker", resp.StatusCode, e, http.StatusForbidden, wire.CodeWorkerBanned)

		// Banning again for the same reason changes nothing.
		before := env.Dump(t)
		m = mustOp(t, env, http.StatusOK, "POST", "/operator/workers/"+n.WorkerID+"/ban", obj{"reason": "stolen key"})
		if m["receipt_id"] != nil || m["worker"].(obj)["banned"] != true {
			t.Errorf("ban again: %v", m)
		}
		stateUnchanged(t, env, "a repeated ban", before)

		m = mustOp(t, env, http.StatusOK, "POST", "/operator/workers/"+n.WorkerID+"/unban", "")
		if m["worker"].(obj)["banned"] != false || m["worker"].(obj)["ban_reason"] != nil || m["receipt_id"] == nil {
			t.Errorf("unban: %v", m)
		}
		if r := logReceipt(t, env, m["receipt_id"].(string)); r.Kind != receipts.KindWorkerUnbanned || r.Actor != apitest.OperatorID {
			t.Errorf("unban receipt = %v", r)
		}
		signedCall(t, n, http.StatusOK, "/workers/heartbeat", obj{"status": "idle"})

		before = env.Dump(t)
		for _, p := range []string{"GET /operator/workers/wrk_nope", "POST /operator/workers/wrk_nope/ban", "POST /operator/workers/wrk_nope/unban"} {
			method, path, _ := strings.Cut(p, " ")
			sc, m := op(t, env, method, path, obj{"reason": "x"})
			wantOpError(t, p, sc, m, http.StatusNotFound, wire.CodeNotFound)
		}
		stateUnchanged(t, env, "unknown worker ids", before)
	})
}

// Credentials.

func TestOperatorCredentials(t *testing.T) {
	t.Parallel()
	onDialects(t, func(t *testing.T, dialect string) {
		env := newOpEnv(t, dialect)
		now := env.Clock.Now()

		m := mustOp(t, env, http.StatusCreated, "POST", "/operator/credentials", obj{
			"principal": apitest.OperatorID, "scopes": []string{"operator:receipts", "operator:jobs"}, "ttl_seconds": 3600,
		})
		exactKeys(t, "mint", m, "credential_id", "token", "principal", "scopes", "expires_at", "receipt_id", "max_registrations")
		if m["max_registrations"] != nil {
			t.Errorf("max_registrations = %v, want null for a credential without a limit", m["max_registrations"])
		}
		if diff := cmp.Diff([]any{"operator:jobs", "operator:receipts"}, m["scopes"]); diff != "" {
			t.Errorf("scopes (-want +got):\n%s", diff)
		}
		exp, err := time.Parse(time.RFC3339Nano, m["expires_at"].(string))
		if err != nil || exp.Sub(now) < time.Hour-time.Minute || exp.Sub(now) > time.Hour+time.Minute {
			t.Errorf("expires_at %v, want about an hour from %v", m["expires_at"], now)
		}
		r := logReceipt(t, env, m["receipt_id"].(string))
		if r.Kind != receipts.KindCredentialMinted || r.CredentialID != m["credential_id"] || r.PrincipalID != apitest.OperatorID ||
			r.Scopes != "operator:jobs operator:receipts" || r.Actor != apitest.OperatorID || !r.ExpiresAt.Equal(exp) {
			t.Errorf("mint receipt = %v", r)
		}
		token, credID := m["token"].(string), m["credential_id"].(string)
		if st, m := opCall(t, env, token, "GET", "/operator/receipts", nil); st != http.StatusOK {
			t.Errorf("new token on its scope: %d %v", st, m)
		}
		st, e := opCall(t, env, token, "GET", "/operator/envelope", nil)
		wantOpError(t, "new token off its scope", st, e, http.StatusForbidden, wire.CodeInsufficientScope)

		m = mustOp(t, env, http.StatusOK, "POST", "/operator/credentials/"+credID+"/revoke", obj{"reason": "rotated"})
		exactKeys(t, "revoke", m, "credential_id", "principal", "revoked_at", "receipt_id")
		if m["credential_id"] != credID || m["revoked_at"] == nil {
			t.Errorf("revoke = %v", m)
		}
		r = logReceipt(t, env, m["receipt_id"].(string))
		if r.Kind != receipts.KindCredentialRevoked || r.CredentialID != credID || r.PrincipalID != apitest.OperatorID || r.Reason != "rotated" {
			t.Errorf("revoke receipt = %v", r)
		}
		st, e = opCall(t, env, token, "GET", "/operator/receipts", nil)
		wantOpError(t, "revoked token", st, e, http.StatusUnauthorized, wire.CodeTokenRevoked)
		before := env.Dump(t)
		if m2 := mustOp(t, env, http.StatusOK, "POST", "/operator/credentials/"+credID+"/revoke", ""); m2["receipt_id"] != nil || m2["revoked_at"] != m["revoked_at"] {
			t.Errorf("revoke again: %v", m2)
		}
		stateUnchanged(t, env, "a repeated revoke", before)

		// A node's credential, minted by a credential that holds the node
		// scope (a credential mints only scopes it holds).
		n := opGPUNode(t, env, "studio-gpu-1", 1)
		nodeMinter, _ := env.Credential(t, apitest.OperatorID, credential.ScopeOperatorCredentials, credential.ScopeNodeHeartbeat)
		if st, m := opCall(t, env, nodeMinter, "POST", "/operator/credentials", obj{"principal": n.WorkerID, "scopes": []string{"node:heartbeat"}}); st != http.StatusCreated || m["principal"] != n.WorkerID {
			t.Errorf("node credential = %d %v", st, m)
		}

		before = env.Dump(t)
		for _, tc := range []struct {
			name   string
			body   any
			status int
			code   string
		}{
			{"unknown principal", obj{"principal": "nobody", "scopes": []string{"operator:jobs"}}, 404, wire.CodeNotFound},
			{"unknown scope", obj{"principal": apitest.OperatorID, "scopes": []string{"operator:*"}}, 400, wire.CodeInvalidRequest},
			{"no scopes", obj{"principal": apitest.OperatorID, "scopes": []string{}}, 400, wire.CodeInvalidRequest},
			{"no principal", obj{"scopes": []string{"operator:jobs"}}, 400, wire.CodeInvalidRequest},
			{"negative ttl", obj{"principal": apitest.OperatorID, "scopes": []string{"operator:jobs"}, "ttl_seconds": -1}, 400, wire.CodeInvalidRequest},
			{"ttl too long", obj{"principal": apitest.OperatorID, "scopes": []string{"operator:jobs"}, "ttl_seconds": int64(1) << 40}, 400, wire.CodeInvalidRequest},
			{"ttl not a number", `{"principal": "x", "scopes": ["operator:jobs"], "ttl_seconds": "1h"}`, 400, wire.CodeInvalidRequest},
			{"operator scope for a node", obj{"principal": n.WorkerID, "scopes": []string{"operator:jobs"}}, 400, wire.CodeInvalidRequest},
		} {
			st, m := op(t, env, "POST", "/operator/credentials", tc.body)
			wantOpError(t, tc.name, st, m, tc.status, tc.code)
		}
		st, e = op(t, env, "POST", "/operator/credentials/0123456789abcdef0123456789abcdef/revoke", "")
		wantOpError(t, "revoke unknown", st, e, http.StatusNotFound, wire.CodeNotFound)
		stateUnchanged(t, env, "refused credential requests", before)
	})
}

// Envelope.

func TestOperatorEnvelope(t *testing.T) {
	t.Parallel()
	onDialects(t, func(t *testing.T, dialect string) {
		env := newOpEnv(t, dialect)
		m := mustOp(t, env, http.StatusOK, "GET", "/operator/envelope", nil)
		exactKeys(t, "envelope", m, envelopeKeys...)
		if m["active"] != false || m["policy_version"] != 1.0 || m["until"] != nil || m["changed_at"] != nil {
			t.Errorf("initial envelope = %v", m)
		}
		if !slices.Contains(m["safe_types"].([]any), any("status_check")) || !slices.Contains(m["blocked_types"].([]any), any("lora_train")) {
			t.Errorf("types = %v %v", m["safe_types"], m["blocked_types"])
		}

		until := env.Clock.Now().Add(time.Hour).UTC().Truncate(time.Second)
		m = mustOp(t, env, http.StatusOK, "POST", "/operator/envelope/activate", obj{"reason": "nightly LoRA run", "until": until})
		exactKeys(t, "activate", m, append(envelopeKeys, "receipt_id")...)
		if m["active"] != true || m["policy_version"] != 2.0 || m["by"] != apitest.OperatorID || m["reason"] != "nightly LoRA run" ||
			m["until"] != until.Format(time.RFC3339) {
			t.Errorf("activated = %v", m)
		}
		r := logReceipt(t, env, m["receipt_id"].(string))
		if r.Kind != receipts.KindEnvelopeActivated || r.PolicyVersion != 2 || r.Actor != apitest.OperatorID ||
			r.Reason != "nightly LoRA run" || !r.Until.Equal(until) {
			t.Errorf("activation receipt = %v", r)
		}
		if g := mustOp(t, env, http.StatusOK, "GET", "/operator/envelope", nil); g["active"] != true || g["policy_version"] != 2.0 {
			t.Errorf("after activate: %v", g)
		}

		m = mustOp(t, env, http.StatusOK, "POST", "/operator/envelope/deactivate", obj{"reason": "run finished"})
		if m["active"] != false || m["policy_version"] != 3.0 || m["until"] != nil {
			t.Errorf("deactivated = %v", m)
		}
		r = logReceipt(t, env, m["receipt_id"].(string))
		if r.Kind != receipts.KindEnvelopeDeactivated || r.PolicyVersion != 3 || r.Reason != "run finished" {
			t.Errorf("deactivation receipt = %v", r)
		}

		before := env.Dump(t)
		for _, tc := range []struct {
			name, path string
			body       any
		}{
			{"activate without reason", "/operator/envelope/activate", obj{}},
			{"activate until the past", "/operator/envelope/activate", obj{"reason": "x", "until": env.Clock.Now().Add(-time.Minute)}},
			{"activate until not a time", "/operator/envelope/activate", `{"reason": "x", "until": "tomorrow"}`},
			{"activate without body", "/operator/envelope/activate", ""},
			{"deactivate without reason", "/operator/envelope/deactivate", obj{"reason": "  "}},
		} {
			st, m := op(t, env, "POST", tc.path, tc.body)
			wantOpError(t, tc.name, st, m, http.StatusBadRequest, wire.CodeInvalidRequest)
		}
		stateUnchanged(t, env, "refused envelope changes", before)
	})
}

// Receipts.

func TestOperatorReceipts(t *testing.T) {
	t.Parallel()
	onDialects(t, func(t *testing.T, dialect string) {
		env := newOpEnv(t, dialect)
		ctx := context.Background()
		key := env.Server.ReceiptVerifierKey()
		origin := env.Config.Origin

		// The checkpoint of a new log.
		resp, b := env.Raw(t, opTextRequest(t, env, "/operator/receipts/checkpoint"))
		if resp.StatusCode != http.StatusOK || resp.Header.Get("Content-Type") != "text/plain; charset=utf-8" {
			t.Fatalf("checkpoint: %d %s: %s", resp.StatusCode, resp.Header.Get("Content-Type"), b)
		}
		cp0, err := receipts.OpenCheckpoint(b, key, origin)
		if err != nil || cp0.Size != 0 {
			t.Fatalf("checkpoint of a new log: %v, %v", cp0, err)
		}

		activated := activateEnvelope(t, env)["receipt_id"].(string)
		m := mustOp(t, env, http.StatusOK, "GET", "/operator/receipts/"+activated, nil)
		exactKeys(t, "receipt", m, "receipt", "proof", "checkpoint")
		exactKeys(t, "receipt.receipt", m["receipt"].(obj), receiptKeys...)
		exactKeys(t, "receipt.proof", m["proof"].(obj), "index", "tree_size", "hashes")
		var got struct {
			Receipt    receipts.WireReceipt
			Proof      receipts.Proof
			Checkpoint string
		}
		remarshalJSON(t, m, &got)
		if got.Receipt.ID != activated || got.Receipt.Kind != receipts.KindEnvelopeActivated || got.Receipt.Index == nil {
			t.Errorf("receipt = %+v", got.Receipt)
		}
		if _, err := receipts.Verify(key, origin, got.Receipt.Body, got.Proof, []byte(got.Checkpoint)); err != nil {
			t.Errorf("the receipt does not verify offline: %v", err)
		}
		cp1, err := receipts.OpenCheckpoint([]byte(got.Checkpoint), key, origin)
		if err != nil {
			t.Fatal(err)
		}

		// More receipts; list them in pages.
		mustOp(t, env, http.StatusOK, "POST", "/operator/envelope/deactivate", obj{"reason": "a"})
		activateEnvelope(t, env)
		mustOp(t, env, http.StatusOK, "POST", "/operator/envelope/deactivate", obj{"reason": "b"})
		if _, err := env.Server.Sequence(ctx); err != nil {
			t.Fatal(err)
		}
		m = mustOp(t, env, http.StatusOK, "GET", "/operator/receipts", nil)
		exactKeys(t, "receipt list", m, "receipts", "next")
		all := m["receipts"].([]any)
		if len(all) != 4 || m["next"] != nil {
			t.Fatalf("receipts: %d, next %v", len(all), m["next"])
		}
		for i, r := range all {
			exactKeys(t, "listed receipt", r.(obj), receiptKeys...)
			if r.(obj)["index"] != float64(i) {
				t.Errorf("receipt %d has index %v", i, r.(obj)["index"])
			}
		}
		m = mustOp(t, env, http.StatusOK, "GET", "/operator/receipts?limit=3", nil)
		if rs := m["receipts"].([]any); len(rs) != 3 || m["next"] != 2.0 {
			t.Errorf("first page: %d receipts, next %v", len(rs), m["next"])
		}
		m = mustOp(t, env, http.StatusOK, "GET", "/operator/receipts?limit=3&after=2", nil)
		if rs := m["receipts"].([]any); len(rs) != 1 || rs[0].(obj)["index"] != 3.0 || m["next"] != nil {
			t.Errorf("second page: %v", m)
		}

		// The latest checkpoint, and its consistency with the first.
		_, b = env.Raw(t, opTextRequest(t, env, "/operator/receipts/checkpoint"))
		cp2, err := receipts.OpenCheckpoint(b, key, origin)
		if err != nil || cp2.Size != 4 {
			t.Fatalf("checkpoint: %v, %v", cp2, err)
		}
		m = mustOp(t, env, http.StatusOK, "GET", fmt.Sprintf("/operator/receipts/consistency?old=%d&new=%d", cp1.Size, cp2.Size), nil)
		exactKeys(t, "consistency", m, "hashes")
		var cons wire.ConsistencyResponse
		remarshalJSON(t, m, &cons)
		if err := receipts.CheckConsistency(cp1.Tree(), cp2.Tree(), cons.Hashes); err != nil {
			t.Errorf("consistency proof: %v", err)
		}
		if m := mustOp(t, env, http.StatusOK, "GET", "/operator/receipts/consistency?old=0&new=4", nil); len(m["hashes"].([]any)) != 0 {
			t.Errorf("consistency from 0: %v", m)
		}

		// A receipt not yet sequenced comes with its proof: the route sequences.
		fresh := activateEnvelope(t, env)["receipt_id"].(string)
		if m := mustOp(t, env, http.StatusOK, "GET", "/operator/receipts/"+fresh, nil); m["proof"] == nil || m["receipt"].(obj)["index"] != 4.0 {
			t.Errorf("fresh receipt: %v", m)
		}

		before := env.Dump(t)
		for _, q := range []string{
			"consistency?old=abc&new=2", "consistency?old=3&new=2", "consistency?old=1&new=99", "consistency?old=1",
			"consistency?old=-1&new=2", "consistency?old=1&old=2&new=3", "?after=-1", "?after=x", "?limit=0", "?limit=1001", "?limit=",
		} {
			st, m := op(t, env, "GET", "/operator/receipts/"+strings.TrimPrefix(q, "?"), nil)
			if strings.HasPrefix(q, "?") {
				st, m = op(t, env, "GET", "/operator/receipts"+q, nil)
			}
			wantOpError(t, q, st, m, http.StatusBadRequest, wire.CodeInvalidRequest)
		}
		st, e := op(t, env, "GET", "/operator/receipts/rcp_nope", nil)
		wantOpError(t, "unknown receipt", st, e, http.StatusNotFound, wire.CodeNotFound)
		stateUnchanged(t, env, "refused receipt requests", before)
	})
}

func opTextRequest(t *testing.T, env *apitest.Env, path string) *http.Request {
	t.Helper()
	req, err := http.NewRequest(http.MethodGet, env.URL+path, nil)
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer "+env.OperatorToken)
	return req
}

func remarshalJSON(t *testing.T, from, to any) {
	t.Helper()
	b, err := json.Marshal(from)
	if err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(b, to); err != nil {
		t.Fatalf("%s: %v", b, err)
	}
}

// Credentials and scopes on every route.

// operatorRoutes are the operator routes of PROTOCOL.md with their scopes.
var operatorRoutes = []struct {
	method, path string
	scope        credential.Scope
}{
	{"POST", "/operator/jobs", credential.ScopeOperatorJobs},
	{"POST", "/operator/jobs/batch", credential.ScopeOperatorJobs},
	{"GET", "/operator/jobs", credential.ScopeOperatorJobs},
	{"GET", "/operator/jobs/job_x", credential.ScopeOperatorJobs},
	{"POST", "/operator/jobs/job_x/cancel", credential.ScopeOperatorJobs},
	{"GET", "/operator/artifacts", credential.ScopeOperatorJobs},
	{"GET", "/operator/workers", credential.ScopeOperatorWorkers},
	{"GET", "/operator/workers/wrk_x", credential.ScopeOperatorWorkers},
	{"POST", "/operator/workers/wrk_x/ban", credential.ScopeOperatorWorkers},
	{"POST", "/operator/workers/wrk_x/unban", credential.ScopeOperatorWorkers},
	{"POST", "/operator/credentials", credential.ScopeOperatorCredentials},
	{"POST", "/operator/credentials/c_x/revoke", credential.ScopeOperatorCredentials},
	{"GET", "/operator/credentials", credential.ScopeOperatorCredentials},
	{"POST", "/operator/principals", credential.ScopeOperatorCredentials},
	{"GET", "/operator/envelope", credential.ScopeOperatorEnvelope},
	{"POST", "/operator/envelope/activate", credential.ScopeOperatorEnvelope},
	{"POST", "/operator/envelope/deactivate", credential.ScopeOperatorEnvelope},
	{"GET", "/operator/receipts", credential.ScopeOperatorReceipts},
	{"GET", "/operator/receipts/rcp_x", credential.ScopeOperatorReceipts},
	{"GET", "/operator/receipts/checkpoint", credential.ScopeOperatorReceipts},
	{"GET", "/operator/receipts/consistency?old=0&new=0", credential.ScopeOperatorReceipts},
}

func TestOperatorAuth(t *testing.T) {
	t.Parallel()
	env := newOpEnv(t, "sqlite")
	n := opGPUNode(t, env, "studio-gpu-1", 1)
	dispatchJob(t, env, obj{"job_type": "status_check"})
	body := obj{"job_type": "status_check", "reason": "r", "principal": apitest.OperatorID, "scopes": []string{"operator:jobs"}}

	expired, _ := env.Credential(t, apitest.OperatorID, credential.ScopeOperatorJobs)
	// lacking[s] carries every operator scope but s.
	lacking := map[credential.Scope]string{}
	for _, rt := range operatorRoutes {
		if _, ok := lacking[rt.scope]; ok {
			continue
		}
		var others []credential.Scope
		for _, sc := range credential.AllScopes() {
			if strings.HasPrefix(string(sc), "operator:") && sc != rt.scope {
				others = append(others, sc)
			}
		}
		lacking[rt.scope], _ = env.Credential(t, apitest.OperatorID, others...)
	}
	before := env.Dump(t)
	for _, rt := range operatorRoutes {
		name := rt.method + " " + rt.path
		for _, tc := range []struct {
			name, token string
			status      int
			code        string
		}{
			{"no token", "", http.StatusUnauthorized, wire.CodeMissingCredential},
			{"garbage token", "nlc_garbage", http.StatusUnauthorized, wire.CodeInvalidToken},
			{"node token", n.Token, http.StatusForbidden, wire.CodeInsufficientScope},
			{"provisioning token", env.ProvisioningToken, http.StatusForbidden, wire.CodeInsufficientScope},
			{"operator token lacking the scope", lacking[rt.scope], http.StatusForbidden, wire.CodeInsufficientScope},
		} {
			var b any
			if rt.method == "POST" {
				b = body
			}
			st, m := opCall(t, env, tc.token, rt.method, rt.path, b)
			wantOpError(t, name+": "+tc.name, st, m, tc.status, tc.code)
		}
		// Operator routes are bearer only: a signed request is no better.
		resp, b := n.Do(t, rt.method, rt.path, body)
		var m obj
		json.Unmarshal(b, &m)
		wantOpError(t, name+": signed by a node", resp.StatusCode, m, http.StatusForbidden, wire.CodeInsufficientScope)
	}
	env.Clock.Advance(25 * time.Hour)
	st, m := opCall(t, env, expired, "GET", "/operator/jobs", nil)
	wantOpError(t, "expired token", st, m, http.StatusUnauthorized, wire.CodeTokenExpired)
	stateUnchanged(t, env, "refused requests", before)
}

func TestOperatorBadRequests(t *testing.T) {
	t.Parallel()
	env := newOpEnv(t, "sqlite")
	n := opGPUNode(t, env, "studio-gpu-1", 1)
	dispatchJob(t, env, obj{"job_type": "status_check"})
	jobID := mustOp(t, env, http.StatusOK, "GET", "/operator/jobs", nil)["jobs"].([]any)[0].(obj)["id"].(string)
	_, credID := env.Credential(t, apitest.OperatorID, credential.ScopeOperatorJobs)

	before := env.Dump(t)
	for _, tc := range []struct {
		method, path string
		body         any
	}{
		// Malformed or mistyped JSON.
		{"POST", "/operator/jobs", `{"job_type": "status_check"`},
		{"POST", "/operator/jobs", `{"job_type": 7}`},
		{"POST", "/operator/jobs", `[]`},
		{"POST", "/operator/jobs", `{"job_type": "status_check"} {}`},
		{"POST", "/operator/jobs", ""},
		{"POST", "/operator/jobs", obj{"payload": obj{}}},
		{"POST", "/operator/jobs", obj{"job_type": "status_check", "payload": []int{1}}},
		{"POST", "/operator/jobs", obj{"job_type": "status_check", "payload": "text"}},
		{"POST", "/operator/jobs", obj{"job_type": "status_check", "priority": 1.5}},
		{"POST", "/operator/jobs", obj{"job_type": "status_check", "max_attempts": 101}},
		{"POST", "/operator/jobs", obj{"job_type": "status_check", "requirements": obj{"gpu_count": -1}}},
		{"POST", "/operator/jobs", obj{"job_type": strings.Repeat("x", 129)}},
		{"POST", "/operator/jobs/" + jobID + "/cancel", `{`},
		{"POST", "/operator/workers/" + n.WorkerID + "/ban", `{"reason": 1}`},
		{"POST", "/operator/workers/" + n.WorkerID + "/ban", obj{"reason": strings.Repeat("x", 1025)}},
		{"POST", "/operator/workers/" + n.WorkerID + "/unban", `nope`},
		{"POST", "/operator/credentials", `{"principal": "operator", "scopes": "operator:jobs"}`},
		{"POST", "/operator/credentials/" + credID + "/revoke", `{"reason": {}}`},
		{"POST", "/operator/envelope/activate", `{"reason": "x", "until": 5}`},
		{"POST", "/operator/envelope/deactivate", `{"reason": `},
		// Bad query values.
		{"GET", "/operator/jobs?state=done", nil},
		{"GET", "/operator/jobs?state=queued&state=leased", nil},
		{"GET", "/operator/jobs?limit=0", nil},
		{"GET", "/operator/jobs?limit=1001", nil},
		{"GET", "/operator/jobs?limit=ten", nil},
		{"GET", "/operator/jobs/" + jobID + "?events_after=-1", nil},
		{"GET", "/operator/artifacts?limit=-5", nil},
		{"GET", "/operator/workers?limit=x", nil},
		{"GET", "/operator/receipts?after=1.5", nil},
	} {
		st, m := op(t, env, tc.method, tc.path, tc.body)
		wantOpError(t, fmt.Sprintf("%s %s %v", tc.method, tc.path, tc.body), st, m, http.StatusBadRequest, wire.CodeInvalidRequest)
	}
	// Framing: a POST without application/json.
	req, _ := http.NewRequest(http.MethodPost, env.URL+"/operator/jobs", strings.NewReader(`{"job_type":"status_check"}`))
	req.Header.Set("Authorization", "Bearer "+env.OperatorToken)
	req.Header.Set("Content-Type", "text/plain")
	resp, b := env.Raw(t, req)
	var m obj
	json.Unmarshal(b, &m)
	wantOpError(t, "text/plain body", resp.StatusCode, m, http.StatusUnsupportedMediaType, wire.CodeUnsupportedMediaType)
	st, m := op(t, env, "DELETE", "/operator/jobs/"+jobID, nil)
	wantOpError(t, "DELETE a job", st, m, http.StatusMethodNotAllowed, wire.CodeMethodNotAllowed)
	stateUnchanged(t, env, "bad requests", before)
}

// Bootstrap.

func TestBootstrap(t *testing.T) {
	t.Parallel()
	onDialects(t, func(t *testing.T, dialect string) {
		env := newOpEnv(t, dialect)
		ctx := context.Background()
		count := env.Receipts(t)
		res, err := env.Server.Bootstrap(ctx)
		if err != nil || !res.Created || res.OperatorToken == "" || res.ProvisioningToken == "" ||
			res.OperatorCredentialID == "" || res.ProvisioningCredentialID == "" {
			t.Fatalf("Bootstrap = %+v, %v", res, err)
		}
		if got := env.Receipts(t); got != count+2 {
			t.Errorf("receipts: %d, want %d", got, count+2)
		}
		if _, err := env.Server.Sequence(ctx); err != nil {
			t.Fatal(err)
		}
		minted := map[string]string{}
		for _, r := range mustOp(t, env, http.StatusOK, "GET", "/operator/receipts", nil)["receipts"].([]any) {
			if rc := decodeReceipt(t, r); rc.Kind == receipts.KindCredentialMinted {
				minted[rc.CredentialID] = rc.Actor + " " + rc.PrincipalID + " " + rc.Scopes
			}
		}
		want := map[string]string{
			res.OperatorCredentialID: "system operator node:register node:heartbeat node:poll node:result:submit node:audit:submit " +
				"operator:jobs operator:workers operator:credentials operator:envelope operator:receipts",
			res.ProvisioningCredentialID: "system provisioner node:register",
		}
		for id, w := range want {
			if minted[id] != w {
				t.Errorf("credential_minted of %s: %q, want %q", id, minted[id], w)
			}
		}

		// The operator token opens every operator route.
		for _, path := range []string{"/operator/jobs", "/operator/artifacts", "/operator/workers", "/operator/envelope", "/operator/receipts"} {
			if st, m := opCall(t, env, res.OperatorToken, "GET", path, nil); st != http.StatusOK {
				t.Errorf("bootstrap operator token on %s: %d %v", path, st, m)
			}
		}
		if st, m := opCall(t, env, res.OperatorToken, "POST", "/operator/credentials", obj{"principal": workerapi.OperatorPrincipal, "scopes": []string{"operator:jobs"}}); st != http.StatusCreated {
			t.Errorf("bootstrap operator token mints: %d %v", st, m)
		}
		// It holds every scope, so it can replace the provisioning token.
		if st, m := opCall(t, env, res.OperatorToken, "POST", "/operator/credentials", obj{"principal": workerapi.ProvisionerPrincipal, "scopes": []string{"node:register"}}); st != http.StatusCreated {
			t.Errorf("bootstrap operator token mints a provisioning token: %d %v", st, m)
		}
		// The provisioning token registers nodes, and nothing else.
		st, m := opCall(t, env, res.ProvisioningToken, "GET", "/operator/jobs", nil)
		wantOpError(t, "provisioning token on an operator route", st, m, http.StatusForbidden, wire.CodeInsufficientScope)
		env.ProvisioningToken = res.ProvisioningToken
		opGPUNode(t, env, "provisioned-1", 1)

		before := env.Dump(t)
		again, err := env.Server.Bootstrap(ctx)
		if err != nil || again.Created || again.OperatorToken != "" || again.ProvisioningToken != "" {
			t.Errorf("second Bootstrap = %+v, %v", again, err)
		}
		stateUnchanged(t, env, "a second Bootstrap", before)
	})
}

func TestBootstrapReplicas(t *testing.T) {
	t.Parallel()
	onDialects(t, func(t *testing.T, dialect string) {
		env := newOpEnv(t, dialect)
		replicas := []*apitest.Env{env, env.Replica(t), env.Replica(t), env.Replica(t)}
		results := make([]*workerapi.BootstrapResult, len(replicas))
		errs := make([]error, len(replicas))
		var wg sync.WaitGroup
		start := make(chan struct{})
		for i, r := range replicas {
			wg.Go(func() {
				<-start
				results[i], errs[i] = r.Server.Bootstrap(context.Background())
			})
		}
		close(start)
		wg.Wait()
		created := 0
		for i, res := range results {
			if errs[i] != nil {
				t.Errorf("replica %d: %v", i, errs[i])
				continue
			}
			if res.Created {
				created++
				if st, m := opCall(t, env, res.OperatorToken, "GET", "/operator/envelope", nil); st != http.StatusOK {
					t.Errorf("the token of replica %d: %d %v", i, st, m)
				}
			}
		}
		if created != 1 {
			t.Errorf("%d replicas created the operator, want 1", created)
		}
		for _, p := range []string{workerapi.OperatorPrincipal, workerapi.ProvisionerPrincipal} {
			if cs, err := env.Server.Issuer().Credentials(context.Background(), p); err != nil || len(cs) != 1 {
				t.Errorf("credentials of %s: %d, %v; want 1", p, len(cs), err)
			}
		}
	})
}
