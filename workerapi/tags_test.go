package workerapi_test

import (
	"fmt"
	"net/http"
	"slices"
	"strings"
	"testing"

	"github.com/nodelane/nodelane/internal/apitest"
	"github.com/nodelane/nodelane/workerapi/wire"
)

// tagNode registers a GPU node for status_check and telemetry_sync with tags.
func tagNode(t *testing.T, env *apitest.Env, nodeID string, tags ...string) *apitest.Node {
	t.Helper()
	n := env.NewNode(t, nodeID)
	n.Now = env.Clock.Now
	n.Register(t, wire.RegisterRequest{
		Name: nodeID, Version: "worker/1.0.0",
		Capabilities: wire.Capabilities{
			GPUs:     []wire.GPU{{SKU: "rtx-4090", VRAMMB: 24576}},
			JobTypes: []string{"status_check", "telemetry_sync"},
		},
		GovernorLimits: wire.GovernorLimits{MaxJobs: 8},
		Tags:           tags,
	})
	return n
}

// jobTags returns the requirements.tags of a job view, failing unless
// they are a JSON array of strings.
func jobTags(t *testing.T, job obj) []string {
	t.Helper()
	raw, ok := job["requirements"].(obj)["tags"].([]any)
	if !ok {
		t.Fatalf("requirements.tags of %v is not an array", job["requirements"])
	}
	out := []string{}
	for _, v := range raw {
		out = append(out, v.(string))
	}
	return out
}

// requirements.tags at dispatch: refused with 400 invalid_request when they
// break the limits (nothing stored); kept sorted and deduplicated; shown
// in every job view and in the worker's grant; a job goes only to a
// worker with every one of its tags; and leasability names the tags no
// worker has.
func TestDispatchTags(t *testing.T) {
	t.Parallel()
	onDialects(t, func(t *testing.T, dialect string) {
		env := newOpEnv(t, dialect)
		many := make([]string, wire.MaxTags+1)
		for i := range many {
			many[i] = fmt.Sprintf("%q", fmt.Sprintf("t%d", i))
		}
		for name, body := range map[string]string{
			"too many":       `{"job_type":"status_check","requirements":{"tags":[` + strings.Join(many, ",") + `]}}`,
			"too long":       `{"job_type":"status_check","requirements":{"tags":["` + strings.Repeat("a", wire.MaxTagBytes+1) + `"]}}`,
			"empty":          `{"job_type":"status_check","requirements":{"tags":["lab-a",""]}}`,
			"space":          `{"job_type":"status_check","requirements":{"tags":["lab a"]}}`,
			"tab":            `{"job_type":"status_check","requirements":{"tags":["lab\ta"]}}`,
			"control":        `{"job_type":"status_check","requirements":{"tags":["lab\u0001"]}}`,
			"a string":       `{"job_type":"status_check","requirements":{"tags":"lab-a"}}`,
			"a number":       `{"job_type":"status_check","requirements":{"tags":[1]}}`,
			"an object":      `{"job_type":"status_check","requirements":{"tags":{"lab-a":true}}}`,
			"nested arrays":  `{"job_type":"status_check","requirements":{"tags":[["lab-a"]]}}`,
			"a null element": `{"job_type":"status_check","requirements":{"tags":["lab-a",null]}}`,
		} {
			before := env.Dump(t)
			st, m := op(t, env, http.MethodPost, "/operator/jobs", body)
			wantOpError(t, name, st, m, http.StatusBadRequest, wire.CodeInvalidRequest)
			if e, _ := m["error"].(obj); e != nil && !strings.Contains(fmt.Sprint(e["message"]), "tags") {
				t.Errorf("%s: message %q does not name tags", name, e["message"])
			}
			stateUnchanged(t, env, "dispatch "+name, before)
		}
		// At the limits.
		at := make([]string, wire.MaxTags)
		for i := range at {
			at[i] = fmt.Sprintf("%02d", i) + strings.Repeat("☃", (wire.MaxTagBytes-2)/3)
		}
		if got := jobTags(t, dispatchJob(t, env, obj{"job_type": "status_check", "requirements": obj{"tags": at}})["job"].(obj)); !slices.Equal(got, at) {
			t.Errorf("dispatch at the limits kept %d tags, want %d", len(got), len(at))
		}

		plain := tagNode(t, env, "plain")
		other := tagNode(t, env, "other", "lab-b")
		// No worker has lab-a yet.
		m := dispatchJob(t, env, obj{"job_type": "status_check", "requirements": obj{"tags": []string{"lab-a", "lab-a"}}})
		job := m["job"].(obj)
		id := job["id"].(string)
		if got := jobTags(t, job); !slices.Equal(got, []string{"lab-a"}) {
			t.Errorf("dispatched tags = %q, want [lab-a]", got)
		}
		if want := "no registered worker that supports status_check has tags lab-a"; m["leasable"] != false || m["reason"] != want {
			t.Errorf("no worker in the pool: leasable %v, reason %q; want false, %q", m["leasable"], m["reason"], want)
		}
		for _, n := range []*apitest.Node{plain, other} {
			if got := signedCall(t, n, http.StatusOK, "/workers/jobs/lease", obj{"max_jobs": 4}); got["lease_token"] != nil || got["job"] != nil {
				t.Fatalf("node %s outside the pool leased %v", n.NodeID, got)
			}
		}

		// A node in the pool: the job is leasable, and it leases it with
		// its tags.
		lab := tagNode(t, env, "lab", "lab-a", "lab-b")
		d := mustOp(t, env, http.StatusOK, "GET", "/operator/jobs/"+id, nil)
		if d["leasable"] != true || !slices.Equal(jobTags(t, d["job"].(obj)), []string{"lab-a"}) {
			t.Errorf("job detail with a worker in the pool: %v", d)
		}
		list := mustOp(t, env, http.StatusOK, "GET", "/operator/jobs?state=queued", nil)
		for _, j := range list["jobs"].([]any) {
			if j.(obj)["id"] == id && !slices.Equal(jobTags(t, j.(obj)), []string{"lab-a"}) {
				t.Errorf("job list: %v", j)
			}
		}
		untagged := dispatchJob(t, env, obj{"job_type": "telemetry_sync"})["job"].(obj)
		if got := jobTags(t, untagged); len(got) != 0 {
			t.Errorf("an untagged job shows tags %q", got)
		}
		got := signedCall(t, lab, http.StatusOK, "/workers/jobs/lease", obj{"supported_job_types": []string{"status_check"}, "max_jobs": 4})
		leases, _ := got["leases"].([]any)
		if len(leases) != 1 || got["job"] == nil {
			t.Fatalf("the node in the pool leased %v", got)
		}
		if g := got["job"].(obj); g["id"] != id || !slices.Equal(jobTags(t, g), []string{"lab-a"}) {
			t.Errorf("granted job: %v", g)
		}
		// The untagged job goes to anyone.
		if jid, _ := leaseOne(t, plain, "telemetry_sync"); jid != untagged["id"] {
			t.Errorf("the untagged node leased %s, want %s", jid, untagged["id"])
		}
	})
}
