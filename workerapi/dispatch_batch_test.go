package workerapi_test

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"testing"

	"github.com/nodelane/nodelane/internal/apitest"
	"github.com/nodelane/nodelane/lease"
	"github.com/nodelane/nodelane/workerapi/wire"
)

// POST /operator/jobs/batch queues its jobs in order, each answered as
// POST /operator/jobs answers it, with the leasability of its kind.
func TestDispatchBatch(t *testing.T) {
	t.Parallel()
	onDialects(t, func(t *testing.T, dialect string) {
		env := newOpEnv(t, dialect)
		opGPUNode(t, env, "studio-gpu-1", 4)
		m := mustOp(t, env, http.StatusCreated, "POST", "/operator/jobs/batch", obj{"jobs": []obj{
			{"job_type": "status_check", "payload": obj{"n": 0}},
			{"job_type": "lora_train", "requirements": obj{"gpu_sku": "rtx-4090"}},
			{"job_type": "status_check", "payload": obj{"n": 2}, "priority": 7},
			{"job_type": "status_check", "requirements": obj{"gpu_sku": "h100"}},
		}})
		exactKeys(t, "batch dispatch", m, "jobs")
		jobs, _ := m["jobs"].([]any)
		if len(jobs) != 4 {
			t.Fatalf("%d answers, want 4: %v", len(jobs), m)
		}
		want := []struct {
			typ      string
			leasable bool
			reason   string
		}{
			{"status_check", true, ""},
			{"lora_train", false, "lora_train is blocked: the runtime is not activated"},
			{"status_check", true, ""},
			{"status_check", false, `no registered worker that supports status_check has a GPU of SKU "h100"`},
		}
		seen := map[string]bool{}
		for i, w := range want {
			a := jobs[i].(obj)
			exactKeys(t, fmt.Sprintf("jobs[%d]", i), a, "job", "leasable", "reason")
			job := a["job"].(obj)
			id, _ := job["id"].(string)
			if job["job_type"] != w.typ || job["state"] != "queued" || a["leasable"] != w.leasable || a["reason"] != w.reason || seen[id] {
				t.Errorf("jobs[%d] = %v; want a new queued %s, leasable %v, reason %q", i, a, w.typ, w.leasable, w.reason)
			}
			seen[id] = true
			if j := env.Job(t, id); j.Type != w.typ || j.State != lease.StateQueued {
				t.Errorf("jobs[%d] as stored: %s %s", i, j.Type, j.State)
			}
		}
		if p := jobs[2].(obj)["job"].(obj); p["priority"] != 7.0 {
			t.Errorf("jobs[2] priority %v, want 7", p["priority"])
		}

		// In Go, a job Enqueue refuses names its index, and nothing is queued.
		before := countJobs(t, env)
		_, err := env.Server.DispatchAll(context.Background(), []lease.NewJob{{Type: "status_check"}, {Type: "status_check", MaxAttempts: 101}})
		var be *lease.BatchError
		if !errors.As(err, &be) || be.Index != 1 || !errors.Is(err, lease.ErrInvalidArgument) {
			t.Errorf("DispatchAll with a bad second job: %v; want a lease.BatchError of index 1", err)
		}
		if n := countJobs(t, env); n != before {
			t.Errorf("a refused batch queued %d jobs", n-before)
		}
	})
}

// A batch that breaks any rule is refused whole with 400 (or 413, 401,
// 403) and queues nothing.
func TestDispatchBatchRefused(t *testing.T) {
	t.Parallel()
	env := newOpEnv(t, "sqlite")
	ok := obj{"job_type": "status_check"}
	many := make([]obj, wire.MaxBatchDispatch+1)
	for i := range many {
		many[i] = ok
	}
	for _, tc := range []struct {
		name string
		body any
		want string
	}{
		{"no jobs", obj{"jobs": []obj{}}, "jobs holds 0 jobs; it must hold 1 to 100"},
		{"jobs absent", obj{}, "jobs holds 0 jobs"},
		{"too many", obj{"jobs": many}, "jobs holds 101 jobs; it must hold 1 to 100"},
		{"jobs not an array", obj{"jobs": "status_check"}, "jobs"},
		{"a job without a type", obj{"jobs": []obj{ok, {"payload": obj{}}}}, "jobs[1]: job_type is required"},
		{"a payload not an object", obj{"jobs": []obj{ok, ok, {"job_type": "x", "payload": []int{1}}}}, "jobs[2]: payload must be a JSON object"},
		{"max_attempts over 100", obj{"jobs": []obj{ok, {"job_type": "x", "max_attempts": 101}}}, "jobs[1]: "},
		{"a bad tag", obj{"jobs": []obj{{"job_type": "x", "requirements": obj{"tags": []string{"a b"}}}}}, "jobs[0]: "},
		{"a type too long", obj{"jobs": []obj{{"job_type": strings.Repeat("t", 129)}}}, "jobs[0]: "},
		{"malformed JSON", `{"jobs": [`, ""},
	} {
		st, m := op(t, env, "POST", "/operator/jobs/batch", tc.body)
		wantOpError(t, tc.name, st, m, http.StatusBadRequest, wire.CodeInvalidRequest)
		if msg, _ := m["error"].(obj)["message"].(string); !strings.Contains(msg, tc.want) {
			t.Errorf("%s: message %q, want it to hold %q", tc.name, msg, tc.want)
		}
	}
	big := make([]obj, 100)
	for i := range big {
		big[i] = obj{"job_type": "status_check", "payload": obj{"pad": strings.Repeat("x", 11<<10)}}
	}
	st, m := op(t, env, "POST", "/operator/jobs/batch", obj{"jobs": big})
	wantOpError(t, "a body over 1 MiB", st, m, http.StatusRequestEntityTooLarge, wire.CodePayloadTooLarge)
	st, m = opCall(t, env, "nlc_not-a-token", "POST", "/operator/jobs/batch", obj{"jobs": []obj{ok}})
	wantOpError(t, "a wrong token", st, m, http.StatusUnauthorized, wire.CodeInvalidToken)
	if n := countJobs(t, env); n != 0 {
		t.Errorf("refused batches queued %d jobs", n)
	}
}

// countJobs is how many jobs the server lists.
func countJobs(t *testing.T, env *apitest.Env) int {
	t.Helper()
	jobs, _ := mustOp(t, env, http.StatusOK, "GET", "/operator/jobs?limit=1000", nil)["jobs"].([]any)
	return len(jobs)
}
