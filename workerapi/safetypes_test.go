package workerapi_test

import (
	"net/http"
	"slices"
	"strings"
	"testing"

	"github.com/nodelane/nodelane/envelope"
	"github.com/nodelane/nodelane/internal/apitest"
	"github.com/nodelane/nodelane/receipts"
	"github.com/nodelane/nodelane/workerapi"
	"github.com/nodelane/nodelane/workerapi/wire"
)

// evalNode registers a node that runs the custom type eval_run beside
// status_check.
func evalNode(t *testing.T, env *apitest.Env, nodeID string) *apitest.Node {
	t.Helper()
	n := env.NewNode(t, nodeID)
	n.Now = env.Clock.Now
	n.Register(t, wire.RegisterRequest{
		Name: nodeID, Hostname: nodeID + ".local", Role: "local_gpu_compute", Version: "worker/1.0.0",
		Capabilities:   wire.Capabilities{GPUs: []wire.GPU{{SKU: "rtx-4090", VRAMMB: 24576}}, JobTypes: []string{"status_check", "eval_run"}},
		GovernorLimits: wire.GovernorLimits{MaxJobs: 2, MaxVRAMMB: 24576},
	})
	return n
}

// POST /operator/envelope/safe-types makes a custom job type safe at run
// time, with a new policy version and a receipt, and a queued job of it
// becomes leasable without an activation (which would also unlock
// raw_training); removing it blocks it again. A canonical blocked type
// is refused naming it, as are bad changes, and nothing changes.
func TestOperatorSafeTypes(t *testing.T) {
	t.Parallel()
	if wire.MaxSafeTypesChange != envelope.MaxSafeTypesChange || wire.MaxRuntimeSafeTypes != envelope.MaxSafeTypes {
		t.Fatalf("wire limits %d/%d differ from the envelope's %d/%d", wire.MaxSafeTypesChange, wire.MaxRuntimeSafeTypes, envelope.MaxSafeTypesChange, envelope.MaxSafeTypes)
	}
	onDialects(t, func(t *testing.T, d string) {
		env := newOpEnv(t, d)
		n := evalNode(t, env, "gpu-eval")
		d0 := dispatchJob(t, env, obj{"job_type": "eval_run"})
		job := d0["job"].(obj)["id"].(string)
		if d0["leasable"] != false || !strings.Contains(d0["reason"].(string), "unknown job type") {
			t.Fatalf("an eval_run job before the change: %v", d0)
		}
		v0 := mustOp(t, env, http.StatusOK, "GET", "/operator/envelope", nil)
		if rs := v0["runtime_safe_types"].([]any); len(rs) != 0 {
			t.Fatalf("runtime_safe_types before any change: %v", rs)
		}

		m := mustOp(t, env, http.StatusOK, "POST", "/operator/envelope/safe-types", obj{"add": []string{"eval_run"}, "reason": "our eval job"})
		if m["policy_version"].(float64) != v0["policy_version"].(float64)+1 || m["active"] != false {
			t.Fatalf("after the change: %v (before %v)", m, v0)
		}
		if rs := m["runtime_safe_types"].([]any); len(rs) != 1 || rs[0] != "eval_run" {
			t.Fatalf("runtime_safe_types: %v", rs)
		}
		if !slices.Contains(m["safe_types"].([]any), any("eval_run")) {
			t.Fatalf("safe_types lacks eval_run: %v", m["safe_types"])
		}
		v := retriedReceipt(t, env, m["receipt_id"].(string))
		if v.Kind != receipts.KindEnvelopeSafeTypesChanged || v.JobTypes != "eval_run" || v.OldJobTypes != "" || v.Actor != apitest.OperatorID ||
			v.Reason != "our eval job" || v.PolicyVersion != int64(m["policy_version"].(float64)) {
			t.Fatalf("the receipt: %+v", v)
		}
		if got := mustOp(t, env, http.StatusOK, "GET", "/operator/jobs/"+job, nil); got["leasable"] != true {
			t.Fatalf("the queued eval_run job after the change: %v", got)
		}
		if id, tok := runOne(t, n, "eval_run"); id != job {
			t.Fatalf("leased %s, want %s", id, job)
		} else {
			completeJob(t, n, id, tok)
		}
		// raw_training stays blocked: nothing was activated.
		raw := dispatchJob(t, env, obj{"job_type": "raw_training"})
		if raw["leasable"] != false || !strings.Contains(raw["reason"].(string), "raw_training is blocked") {
			t.Fatalf("raw_training after the change: %v", raw)
		}

		// Refusals change nothing and mint nothing.
		before := env.Dump(t)
		count := env.Receipts(t)
		many := make([]string, wire.MaxSafeTypesChange+1)
		for i := range many {
			many[i] = "t" + strings.Repeat("x", i+1)
		}
		for _, c := range []struct {
			what string
			body any
			name string // what the message must name
		}{
			{"a canonical blocked type", obj{"add": []string{"eval2", "raw_training"}, "reason": "r"}, "raw_training"},
			{"model_file_write", obj{"add": []string{"model_file_write"}, "reason": "r"}, "model_file_write"},
			{"lora_train", obj{"add": []string{"lora_train"}, "reason": "r"}, "lora_train"},
			{"a canonical safe type removed", obj{"remove": []string{"status_check"}, "reason": "r"}, "status_check"},
			{"no type", obj{"reason": "r"}, ""},
			{"no reason", obj{"add": []string{"eval2"}}, "reason"},
			{"a reason over 1024 bytes", obj{"add": []string{"eval2"}, "reason": strings.Repeat("r", wire.MaxReasonBytes+1)}, "reason"},
			{"too many types", obj{"add": many, "reason": "r"}, ""},
			{"a type named twice", obj{"add": []string{"eval2"}, "remove": []string{"eval2"}, "reason": "r"}, "eval2"},
			{"a type with a space", obj{"add": []string{"eval 2"}, "reason": "r"}, ""},
			{"a type over 128 bytes", obj{"add": []string{strings.Repeat("a", 129)}, "reason": "r"}, ""},
			{"add not a list", obj{"add": "eval2", "reason": "r"}, ""},
			{"no body", nil, ""},
		} {
			st, m := op(t, env, "POST", "/operator/envelope/safe-types", c.body)
			wantOpError(t, c.what, st, m, http.StatusBadRequest, wire.CodeInvalidRequest)
			if msg, _ := m["error"].(obj)["message"].(string); c.name != "" && !strings.Contains(msg, c.name) {
				t.Errorf("%s: message %q does not name %s", c.what, msg, c.name)
			}
		}
		stateUnchanged(t, env, "refused safe-types changes", before)
		if got := env.Receipts(t); got != count {
			t.Fatalf("refused changes minted %d receipts", got-count)
		}
		tok, _ := env.Credential(t, apitest.OperatorID, "operator:jobs")
		if st, _ := env.Bearer(t, tok, "POST", "/operator/envelope/safe-types", obj{"add": []string{"eval2"}, "reason": "r"}); st != http.StatusForbidden {
			t.Fatalf("without operator:envelope: %d, want 403", st)
		}

		// Removing it blocks it again.
		m = mustOp(t, env, http.StatusOK, "POST", "/operator/envelope/safe-types", obj{"remove": []string{"eval_run"}, "reason": "done"})
		if rs := m["runtime_safe_types"].([]any); len(rs) != 0 {
			t.Fatalf("runtime_safe_types after the removal: %v", rs)
		}
		if v := retriedReceipt(t, env, m["receipt_id"].(string)); v.JobTypes != "" || v.OldJobTypes != "eval_run" {
			t.Fatalf("the removal's receipt: %+v", v)
		}
		if d := dispatchJob(t, env, obj{"job_type": "eval_run"}); d["leasable"] != false {
			t.Fatalf("an eval_run job after the removal: %v", d)
		}
	})
}

// The server's own safe types (Config.EnvelopeSafe, the example server's
// -safe-type) run without an activation and cannot be removed at run
// time (TestNewFailsFast checks that New refuses a canonical blocked one).
func TestConfigSafeTypes(t *testing.T) {
	t.Parallel()
	env := newOpEnv(t, "sqlite", apitest.WithConfig(func(c *workerapi.Config) { c.EnvelopeSafe = []string{"eval_run"} }))
	evalNode(t, env, "gpu-eval")
	if d := dispatchJob(t, env, obj{"job_type": "eval_run"}); d["leasable"] != true {
		t.Fatalf("an eval_run job with eval_run safe: %v", d)
	}
	v := mustOp(t, env, http.StatusOK, "GET", "/operator/envelope", nil)
	if !slices.Contains(v["safe_types"].([]any), any("eval_run")) || len(v["runtime_safe_types"].([]any)) != 0 {
		t.Fatalf("the envelope: %v", v)
	}
	before := env.Dump(t)
	st, m := op(t, env, "POST", "/operator/envelope/safe-types", obj{"remove": []string{"eval_run"}, "reason": "r"})
	wantOpError(t, "removing a server safe type", st, m, http.StatusBadRequest, wire.CodeInvalidRequest)
	stateUnchanged(t, env, "removing a server safe type", before)
}
