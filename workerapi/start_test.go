package workerapi_test

import (
	"encoding/json"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/nodelane/nodelane/credential"
	"github.com/nodelane/nodelane/internal/apitest"
	"github.com/nodelane/nodelane/lease"
	"github.com/nodelane/nodelane/receipts"
	"github.com/nodelane/nodelane/workerapi"
	"github.com/nodelane/nodelane/workerapi/wire"
)

// Restart reconciliation and capabilities that follow the box, over real
// HTTP (PROTOCOL.md §5.17).

// startBody is what opGPUNode registered, with changes.
func startBody(held []string, edit func(*wire.StartRequest)) wire.StartRequest {
	r := wire.StartRequest{
		Name: "n", Hostname: "n.local", Role: "local_gpu_compute", Version: "worker/1.0.0",
		Capabilities: wire.Capabilities{
			GPUs:     []wire.GPU{{SKU: "rtx-4090", VRAMMB: 24576}},
			JobTypes: []string{"status_check", "lora_train"},
		},
		GovernorLimits: wire.GovernorLimits{MaxJobs: 4, MaxVRAMMB: 24576},
		Tags:           []string{"lab"},
		CurrentJobs:    &held,
	}
	if held == nil {
		r.CurrentJobs = &[]string{}
	}
	if edit != nil {
		edit(&r)
	}
	return r
}

func strs(v any) []string {
	var out []string
	for _, s := range v.([]any) {
		out = append(out, s.(string))
	}
	return out
}

func wantLastError(t *testing.T, env *apitest.Env, id string, state lease.State, code string, attempt int) {
	t.Helper()
	j := env.Job(t, id)
	if j.State != state || j.LastError == nil || j.LastError.Code != code || j.Attempt != attempt {
		t.Errorf("job %s: %s, attempt %d, last error %+v; want %s, attempt %d, %s", id, j.State, j.Attempt, j.LastError, state, attempt, code)
	}
}

// A worker restarts holding nothing and with a new job type and
// max_jobs: both of its leases end at once (the running one uses an
// attempt), the change is a worker_updated receipt, and the new type is
// leasable at once. A second, identical start changes nothing.
func TestStartReconcilesAndUpdates(t *testing.T) {
	t.Parallel()
	onDialects(t, func(t *testing.T, dialect string) {
		env := newOpEnv(t, dialect)
		n := opGPUNode(t, env, "box", 1)
		first := dispatchJob(t, env, obj{"job_type": "status_check"})["job"].(obj)["id"].(string)
		running, _ := runOne(t, n)
		if running != first {
			t.Fatalf("ran %s, want %s", running, first)
		}
		// max_jobs 1: the second job waits; start with max_jobs 2.
		second := dispatchJob(t, env, obj{"job_type": "status_check"})["job"].(obj)["id"].(string)
		m := signedCall(t, n, http.StatusOK, wire.PathStart, startBody(nil, func(r *wire.StartRequest) {
			r.Capabilities.JobTypes = []string{"status_check", "lora_train", "telemetry_sync"}
			r.Capabilities.GPUs = append(r.Capabilities.GPUs, wire.GPU{SKU: "rtx-4090", VRAMMB: 24576})
			r.GovernorLimits.MaxJobs = 2
		}))
		exactKeys(t, "start", m, "worker_id", "status", "changed", "receipt_id", "pending_job_types", "pending_tags",
			"ended_jobs", "policy_version", "server_time", "next_heartbeat_seconds", "heartbeat_deadline")
		if m["worker_id"] != n.WorkerID || m["status"] != "registered" || m["changed"] != true || m["receipt_id"] == nil ||
			!slices.Equal(strs(m["ended_jobs"]), []string{first}) || len(m["pending_job_types"].([]any)) != 0 {
			t.Fatalf("start = %v", m)
		}
		wantLastError(t, env, first, lease.StateQueued, lease.CodeWorkerRestarted, 2)
		r := logReceipt(t, env, m["receipt_id"].(string))
		want := receipts.Receipt{
			Kind: receipts.KindWorkerUpdated, WorkerID: n.WorkerID, NodeID: "box",
			OldJobTypes: "lora_train status_check", JobTypes: "lora_train status_check telemetry_sync",
			OldTags: "lab", Tags: "lab", OldGPUs: "rtx-4090:24576", GPUs: "rtx-4090:24576 rtx-4090:24576",
			OldMaxJobs: 1, MaxJobs: 2, OldMaxVRAMMB: 24576, MaxVRAMMB: 24576,
		}
		want.ID, want.PolicyVersion, want.ServerTime = r.ID, r.PolicyVersion, r.ServerTime
		if *r != want {
			t.Errorf("worker_updated = %+v\nwant %+v", *r, want)
		}
		// The new type and the second slot are leasable at once.
		embed := dispatchJob(t, env, obj{"job_type": "telemetry_sync"})["job"].(obj)["id"].(string)
		got := signedCall(t, n, http.StatusOK, wire.PathLease, obj{"max_jobs": 2})
		var ids []string
		for _, g := range got["leases"].([]any) {
			ids = append(ids, g.(obj)["job"].(obj)["id"].(string))
		}
		slices.Sort(ids)
		wantIDs := []string{second, embed}
		slices.Sort(wantIDs)
		if !slices.Equal(ids, wantIDs) || got["server_time"] == nil {
			t.Fatalf("leased %v, want %v (%v)", ids, wantIDs, got)
		}
		// The same start again, holding both: nothing changes.
		before := env.Receipts(t)
		m = signedCall(t, n, http.StatusOK, wire.PathStart, startBody(ids, func(r *wire.StartRequest) {
			r.Capabilities.JobTypes = []string{"status_check", "telemetry_sync", "lora_train", "telemetry_sync"}
			r.Capabilities.GPUs = append(r.Capabilities.GPUs, wire.GPU{SKU: "rtx-4090", VRAMMB: 24576})
			r.GovernorLimits.MaxJobs = 2
		}))
		if m["changed"] != false || m["receipt_id"] != nil || len(m["ended_jobs"].([]any)) != 0 {
			t.Fatalf("identical start = %v", m)
		}
		if got := env.Receipts(t); got != before {
			t.Errorf("an identical start minted %d receipts", got-before)
		}
		for _, id := range ids {
			if j := env.Job(t, id); j.State != lease.StateLeased {
				t.Errorf("held job %s: %s", id, j.State)
			}
		}
	})
}

// A registration again with the same key reconciles current_jobs when
// present, and nothing when absent; a cancel requested ends canceled.
func TestRegisterCurrentJobs(t *testing.T) {
	t.Parallel()
	onDialects(t, func(t *testing.T, dialect string) {
		env := newOpEnv(t, dialect)
		n := opGPUNode(t, env, "box", 4)
		var ids []string
		for range 3 {
			ids = append(ids, dispatchJob(t, env, obj{"job_type": "status_check"})["job"].(obj)["id"].(string))
		}
		for range 3 {
			runOne(t, n)
		}
		mustOp(t, env, http.StatusOK, "POST", "/operator/jobs/"+ids[1]+"/cancel", nil)
		req := wire.RegisterRequest{Name: "box", Capabilities: wire.Capabilities{GPUs: []wire.GPU{{SKU: "rtx-4090", VRAMMB: 24576}},
			JobTypes: []string{"status_check", "lora_train"}}, GovernorLimits: wire.GovernorLimits{MaxJobs: 4, MaxVRAMMB: 24576}, Tags: []string{"lab"}}
		out := n.Register(t, req) // no current_jobs: nothing reconciled
		if len(out.EndedJobs) != 0 || out.EndedJobs == nil {
			t.Fatalf("register without current_jobs ended %v", out.EndedJobs)
		}
		held := []string{ids[2]}
		req.CurrentJobs = &held
		out = n.Register(t, req)
		got := slices.Clone(out.EndedJobs)
		slices.Sort(got)
		want := []string{ids[0], ids[1]}
		slices.Sort(want)
		if !slices.Equal(got, want) {
			t.Fatalf("ended %v, want %v", got, want)
		}
		wantLastError(t, env, ids[0], lease.StateQueued, lease.CodeWorkerRestarted, 2)
		wantLastError(t, env, ids[1], lease.StateCanceled, lease.CodeWorkerRestarted, 1)
		if j := env.Job(t, ids[2]); j.State != lease.StateRunning {
			t.Errorf("held job: %s", j.State)
		}
		// Too many ids, or ids of the wrong type, are refused.
		tooMany := make([]string, wire.MaxCurrentJobs+1)
		for i := range tooMany {
			tooMany[i] = fmt.Sprintf("job_%d", i)
		}
		for name, body := range map[string]any{
			"oversized":  withField(t, req, n, "current_jobs", tooMany),
			"wrong type": withField(t, req, n, "current_jobs", "job_1"),
		} {
			r := n.Request(t, http.MethodPost, wire.PathRegister, body)
			r.Header.Set("Authorization", "Bearer "+env.ProvisioningToken)
			resp, b := env.Raw(t, r)
			wantErr(t, resp.StatusCode, b, http.StatusBadRequest, wire.CodeInvalidRequest)
			_ = name
		}
		// Another key for the same node id: 409 that says how to fix it.
		other := env.NewNode(t, "box")
		r := other.Request(t, http.MethodPost, wire.PathRegister, withField(t, req, other, "current_jobs", []string{}))
		r.Header.Set("Authorization", "Bearer "+env.ProvisioningToken)
		resp, b := env.Raw(t, r)
		wantErr(t, resp.StatusCode, b, http.StatusConflict, wire.CodeNodeExists)
		if !strings.Contains(string(b), "restore that identity") || !strings.Contains(string(b), "another node_id") {
			t.Errorf("node_exists does not say how to fix it: %s", b)
		}
	})
}

// withField is the register body req of n (node_id and public_key filled
// in) as a JSON object with field set to v.
func withField(t *testing.T, req wire.RegisterRequest, n *apitest.Node, field string, v any) obj {
	t.Helper()
	req.NodeID, req.PublicKey = n.NodeID, n.PublicKey
	b, err := json.Marshal(req)
	if err != nil {
		t.Fatal(err)
	}
	var m obj
	if err := json.Unmarshal(b, &m); err != nil {
		t.Fatal(err)
	}
	m[field] = v
	return m
}

// A heartbeat's leases_through ends the leases not held that were
// granted at or before it, and spares one granted after: the race of a
// heartbeat signed before a lease answer arrived.
func TestHeartbeatLeasesThrough(t *testing.T) {
	t.Parallel()
	onDialects(t, func(t *testing.T, dialect string) {
		env := newOpEnv(t, dialect)
		n := opGPUNode(t, env, "box", 4)
		a := dispatchJob(t, env, obj{"job_type": "status_check"})["job"].(obj)["id"].(string)
		b := dispatchJob(t, env, obj{"job_type": "status_check"})["job"].(obj)["id"].(string)
		first := signedCall(t, n, http.StatusOK, wire.PathLease, obj{})
		through, err := time.Parse(time.RFC3339Nano, first["server_time"].(string))
		if err != nil || first["job"].(obj)["id"] != a {
			t.Fatalf("first lease %v: %v", first, err)
		}
		env.Clock.Advance(time.Millisecond)
		// b is granted after the answer the heartbeat echoes: the worker
		// may not have heard of it when it signed the heartbeat.
		if id, _ := leaseOne(t, n); id != b {
			t.Fatalf("leased %s, want %s", id, b)
		}
		// Without leases_through nothing is reconciled.
		m := signedCall(t, n, http.StatusOK, wire.PathHeartbeat, obj{"status": "busy", "current_jobs": []string{}})
		if len(m["ended_jobs"].([]any)) != 0 {
			t.Fatalf("heartbeat without leases_through ended %v", m["ended_jobs"])
		}
		m = signedCall(t, n, http.StatusOK, wire.PathHeartbeat, obj{"status": "busy", "current_jobs": []string{}, "leases_through": through})
		if !slices.Equal(strs(m["ended_jobs"]), []string{a}) {
			t.Fatalf("ended %v, want only %s", m["ended_jobs"], a)
		}
		wantLastError(t, env, a, lease.StateQueued, lease.CodeNotHeld, 1)
		if j := env.Job(t, b); j.State != lease.StateLeased {
			t.Fatalf("the later grant: %s", j.State)
		}
		// Listed, it is kept whatever leases_through says.
		m = signedCall(t, n, http.StatusOK, wire.PathHeartbeat, obj{"status": "busy", "current_jobs": []string{b}, "leases_through": env.Clock.Now()})
		if len(m["ended_jobs"].([]any)) != 0 {
			t.Fatalf("ended a held job: %v", m)
		}
		for name, v := range map[string]any{"not a time": "yesterday", "a number": 17, "an object": obj{}} {
			resp, body := n.Do(t, http.MethodPost, wire.PathHeartbeat, obj{"status": "busy", "leases_through": v})
			wantErr(t, resp.StatusCode, body, http.StatusBadRequest, wire.CodeInvalidRequest)
			_ = name
		}
	})
}

// The refusals of the start route: a malformed or incomplete body, an
// oversized current_jobs, a token without node:heartbeat, no signature.
func TestStartRefusals(t *testing.T) {
	t.Parallel()
	env := newOpEnv(t, "sqlite")
	n := opGPUNode(t, env, "box", 1)
	dispatchJob(t, env, obj{"job_type": "status_check"})
	id, _ := runOne(t, n, "status_check")
	pollOnly, _ := env.Credential(t, n.WorkerID, credential.ScopeNodePoll)
	before := env.Dump(t)
	tooMany := make([]string, wire.MaxCurrentJobs+1)
	for i := range tooMany {
		tooMany[i] = fmt.Sprintf("job_%d", i)
	}
	for _, tc := range []struct {
		name string
		body any
	}{
		{"no current_jobs", obj{"name": "n"}},
		{"null current_jobs", obj{"current_jobs": nil}},
		{"current_jobs a string", obj{"current_jobs": "job_1"}},
		{"current_jobs of numbers", obj{"current_jobs": []int{1}}},
		{"oversized current_jobs", obj{"current_jobs": tooMany}},
		{"negative max_jobs", obj{"current_jobs": []string{}, "governor_limits": obj{"max_jobs": -1}}},
		{"negative vram", obj{"current_jobs": []string{}, "capabilities": obj{"gpus": []obj{{"sku": "x", "vram_mb": -1}}}}},
		{"long name", obj{"current_jobs": []string{}, "name": strings.Repeat("n", wire.MaxNameBytes+1)}},
		{"too many tags", obj{"current_jobs": []string{}, "tags": make([]string, wire.MaxTags+1)}},
		{"not JSON", json.RawMessage(`{"current_jobs":[`)},
		{"trailing data", json.RawMessage(`{"current_jobs":[]}]`)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			resp, b := n.Do(t, http.MethodPost, wire.PathStart, tc.body)
			wantErr(t, resp.StatusCode, b, http.StatusBadRequest, wire.CodeInvalidRequest)
		})
	}
	t.Run("scope", func(t *testing.T) {
		narrow := *n
		narrow.Token = pollOnly
		resp, b := narrow.Do(t, http.MethodPost, wire.PathStart, startBody([]string{}, nil))
		wantErr(t, resp.StatusCode, b, http.StatusForbidden, wire.CodeInsufficientScope)
	})
	t.Run("operator token", func(t *testing.T) {
		st, b := env.Bearer(t, env.OperatorToken, http.MethodPost, wire.PathStart, startBody([]string{}, nil))
		if st != http.StatusForbidden && st != http.StatusUnauthorized {
			t.Errorf("operator token: %d %s", st, b)
		}
	})
	t.Run("unsigned", func(t *testing.T) {
		r := n.Request(t, http.MethodPost, wire.PathStart, startBody([]string{}, nil))
		r.Header.Del("Signature")
		r.Header.Del("Signature-Input")
		resp, b := env.Raw(t, r)
		wantErr(t, resp.StatusCode, b, http.StatusUnauthorized, wire.CodeMissingSignature)
	})
	t.Run("no token", func(t *testing.T) {
		anon := *n
		anon.Token = ""
		resp, b := anon.Do(t, http.MethodPost, wire.PathStart, startBody([]string{}, nil))
		if resp.StatusCode != http.StatusUnauthorized {
			t.Errorf("no token: %d %s", resp.StatusCode, b)
		}
	})
	stateUnchanged(t, env, "refused starts", before)
	if j := env.Job(t, id); j.State != lease.StateRunning {
		t.Errorf("job %s after refused starts", j.State)
	}
}

// Under node approval a widening waits for the operator while what was
// approved keeps working: a new job type or tag is pending (in the start
// answer and the operator's worker view) and not granted until approved
// again.
func TestStartWideningPending(t *testing.T) {
	t.Parallel()
	onDialects(t, func(t *testing.T, dialect string) {
		env := newOpEnv(t, dialect, apitest.WithConfig(func(c *workerapi.Config) { c.ApproveNodes = true }))
		n := env.NewNode(t, "box")
		n.Now = env.Clock.Now
		reg := n.Register(t, wire.RegisterRequest{Capabilities: wire.Capabilities{JobTypes: []string{"status_check"}}, Tags: []string{"lab"},
			GovernorLimits: wire.GovernorLimits{MaxJobs: 4}})
		if reg.Status != wire.RegisterStatusPending || !slices.Equal(reg.PendingJobTypes, []string{"status_check"}) || !slices.Equal(reg.PendingTags, []string{"lab"}) {
			t.Fatalf("register = %+v", reg)
		}
		path := "/operator/workers/" + n.WorkerID + "/approve"
		mustOp(t, env, http.StatusOK, "POST", path, "")
		m := signedCall(t, n, http.StatusOK, wire.PathStart, wire.StartRequest{
			Capabilities: wire.Capabilities{JobTypes: []string{"status_check", "telemetry_sync"}}, Tags: []string{"lab", "eu"},
			GovernorLimits: wire.GovernorLimits{MaxJobs: 4}, CurrentJobs: &[]string{},
		})
		if m["status"] != "registered" || m["changed"] != true || !slices.Equal(strs(m["pending_job_types"]), []string{"telemetry_sync"}) ||
			!slices.Equal(strs(m["pending_tags"]), []string{"eu"}) {
			t.Fatalf("start = %v", m)
		}
		w := mustOp(t, env, http.StatusOK, "GET", "/operator/workers/"+n.WorkerID, nil)["worker"].(obj)
		if !slices.Equal(strs(w["pending_job_types"]), []string{"telemetry_sync"}) || !slices.Equal(strs(w["pending_tags"]), []string{"eu"}) {
			t.Fatalf("worker view = %v", w)
		}
		wide := dispatchJob(t, env, obj{"job_type": "telemetry_sync"})["job"].(obj)["id"].(string)
		pooled := dispatchJob(t, env, obj{"job_type": "status_check", "requirements": obj{"tags": []string{"eu"}}})["job"].(obj)["id"].(string)
		old := dispatchJob(t, env, obj{"job_type": "status_check", "requirements": obj{"tags": []string{"lab"}}})["job"].(obj)["id"].(string)
		got := signedCall(t, n, http.StatusOK, wire.PathLease, obj{"max_jobs": 4})
		if ls := got["leases"].([]any); len(ls) != 1 || ls[0].(obj)["job"].(obj)["id"] != old {
			t.Fatalf("before the approval leased %v; want only %s", got, old)
		}
		mustOp(t, env, http.StatusOK, "POST", path, "")
		got = signedCall(t, n, http.StatusOK, wire.PathLease, obj{"max_jobs": 4})
		var ids []string
		for _, g := range got["leases"].([]any) {
			ids = append(ids, g.(obj)["job"].(obj)["id"].(string))
		}
		slices.Sort(ids)
		want := []string{wide, pooled}
		slices.Sort(want)
		if !slices.Equal(ids, want) {
			t.Fatalf("after the approval leased %v, want %v", ids, want)
		}
	})
}
