package workerapi_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"

	"github.com/nodelane/nodelane/internal/apitest"
	"github.com/nodelane/nodelane/lease"
	"github.com/nodelane/nodelane/receipts"
	"github.com/nodelane/nodelane/workerapi"
	"github.com/nodelane/nodelane/workerapi/artifacttest"
	"github.com/nodelane/nodelane/workerapi/wire"
)

// operatorGETs returns every operator GET route of the served OpenAPI
// document (which TestOpenAPIRoutes holds to the routes served), with
// {id} filled from ids by the route's first segment after /operator/, and
// the query parameters the document gives it.
func operatorGETs(t *testing.T, env *apitest.Env, ids map[string]string) map[string][]string {
	t.Helper()
	resp, err := http.Get(env.URL + wire.PathOpenAPI)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var doc struct {
		Paths map[string]map[string]json.RawMessage `json:"paths"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&doc); err != nil {
		t.Fatal(err)
	}
	out := map[string][]string{}
	for path, ops := range doc.Paths {
		raw, ok := ops["get"]
		if !ok || !strings.HasPrefix(path, "/operator/") {
			continue
		}
		var get struct {
			Parameters []struct {
				Name string `json:"name"`
				In   string `json:"in"`
			} `json:"parameters"`
		}
		if err := json.Unmarshal(raw, &get); err != nil {
			t.Fatal(err)
		}
		if strings.Contains(path, "{id}") {
			seg := strings.Split(strings.TrimPrefix(path, "/operator/"), "/")[0]
			id, ok := ids[seg]
			if !ok {
				t.Fatalf("no id for %s", path)
			}
			path = strings.Replace(path, "{id}", id, 1)
		}
		var q []string
		for _, p := range get.Parameters {
			if p.In == "query" {
				q = append(q, p.Name)
			}
		}
		out[path] = q
	}
	return out
}

// Every operator GET route refuses a query parameter it does not take,
// with 400 invalid_request naming it, and changes nothing; the same
// request without it succeeds, so the refusal is the parameter's.
func TestOperatorUnknownQueryParameters(t *testing.T) {
	t.Parallel()
	onDialects(t, func(t *testing.T, d string) {
		store := artifacttest.NewMemory()
		env := newOpEnv(t, d, apitest.WithConfig(func(c *workerapi.Config) { c.Artifacts.Store = store }))
		n := opGPUNode(t, env, "gpu-1", 1)
		dispatchJob(t, env, obj{"job_type": "status_check"})
		jobID, tok := runOne(t, n, "status_check")
		// A stored artifact, for its content route.
		ctx := context.Background()
		if err := store.Put(ctx, "jobs/"+jobID+"/u/000001", strings.NewReader("abc"), nil); err != nil {
			t.Fatal(err)
		}
		art, err := env.Server.Leases().AddArtifact(ctx, lease.Ref{JobID: jobID, WorkerID: n.WorkerID, Token: tok}, lease.Artifact{
			Type: "adapter", Name: "a", SHA256: strings.Repeat("0", 64), SizeBytes: 3, Object: "jobs/" + jobID + "/u/", PartSize: 3,
		})
		if err != nil {
			t.Fatal(err)
		}
		completeJob(t, n, jobID, tok)
		rid := env.Job(t, jobID).ReceiptID
		routes := operatorGETs(t, env, map[string]string{"jobs": jobID, "workers": n.WorkerID, "receipts": rid, "artifacts": art.ID})
		if len(routes) < 12 {
			t.Fatalf("only %d operator GET routes in the document: %v", len(routes), routes)
		}
		before := env.Dump(t)
		for path, params := range routes {
			ok := path
			if strings.HasSuffix(path, "/consistency") {
				ok += "?old=0&new=1"
			}
			if st, b := env.Operator(t, "GET", ok, nil); st != http.StatusOK {
				t.Errorf("GET %s: %d, want 200: %s", ok, st, b)
			}
			sep := "?"
			if strings.Contains(ok, "?") {
				sep = "&"
			}
			for _, bad := range []string{"bogus=1", "Limit=5", "limit_=5", "stat=queued", "kind%00=x"} {
				st, m := op(t, env, "GET", ok+sep+bad, nil)
				what := fmt.Sprintf("GET %s%s%s (takes %v)", ok, sep, bad, params)
				wantOpError(t, what, st, m, http.StatusBadRequest, wire.CodeInvalidRequest)
				name := strings.ReplaceAll(strings.Split(bad, "=")[0], "%00", `\x00`)
				if msg, _ := m["error"].(obj)["message"].(string); !strings.Contains(msg, name) {
					t.Errorf("%s: message %q does not name %q", what, msg, name)
				}
			}
			// A parameter of another route is unknown here.
			for _, other := range []string{"state", "kind", "principal", "events_after", "group_by"} {
				if slices.Contains(params, other) {
					continue
				}
				st, m := op(t, env, "GET", ok+sep+other+"=x", nil)
				wantOpError(t, "GET "+ok+sep+other, st, m, http.StatusBadRequest, wire.CodeInvalidRequest)
			}
		}
		// A query that does not parse.
		st, m := op(t, env, "GET", "/operator/jobs?state=%zz", nil)
		wantOpError(t, "bad escape", st, m, http.StatusBadRequest, wire.CodeInvalidRequest)
		stateUnchanged(t, env, "unknown query parameters", before)
	})
}

// listJobIDs lists the ids of GET /operator/jobs with query, following
// next through every page.
func listJobIDs(t *testing.T, env *apitest.Env, query string) []string {
	t.Helper()
	ids := []string{}
	after := ""
	for {
		path := "/operator/jobs?" + query
		if after != "" {
			path += "&after=" + after
		}
		m := mustOp(t, env, http.StatusOK, "GET", path, nil)
		for _, j := range m["jobs"].([]any) {
			ids = append(ids, j.(obj)["id"].(string))
		}
		next, _ := m["next"].(string)
		if next == "" {
			return ids
		}
		after = next
	}
}

// GET /operator/jobs filters by worker_id (the worker of the job's last
// lease, live or ended), job_type and tag, with state and paging.
func TestOperatorJobFilters(t *testing.T) {
	t.Parallel()
	onDialects(t, func(t *testing.T, d string) {
		env := newOpEnv(t, d)
		a := opGPUNode(t, env, "gpu-a", 1)
		b := opGPUNode(t, env, "gpu-b", 1)
		dispatch := func(typ string, tags ...string) string {
			body := obj{"job_type": typ}
			if len(tags) > 0 {
				body["requirements"] = obj{"tags": tags}
			}
			return dispatchJob(t, env, body)["job"].(obj)["id"].(string)
		}
		// a runs and completes a tagged status_check; b runs one untagged
		// and holds it; a leases and releases another (queued again, its
		// last lease a's); two stay queued, never leased.
		j1 := dispatch("status_check", "lab")
		id, tok := runOne(t, a, "status_check")
		if id != j1 {
			t.Fatalf("a ran %s, want %s", id, j1)
		}
		completeJob(t, a, id, tok)
		j2 := dispatch("status_check")
		if id, _ = runOne(t, b, "status_check"); id != j2 {
			t.Fatalf("b ran %s, want %s", id, j2)
		}
		j3 := dispatch("status_check", "lab")
		id, tok = leaseOne(t, a, "status_check")
		if id != j3 {
			t.Fatalf("a leased %s, want %s", id, j3)
		}
		signedCall(t, a, http.StatusOK, "/workers/jobs/"+id+"/release", obj{"lease_token": tok, "reason": "preempted"})
		j4 := dispatch("lora_train", "lab")
		j5 := dispatch("inference")

		sorted := func(ids ...string) []string { return slices.Sorted(slices.Values(ids)) }
		for _, c := range []struct {
			query string
			want  []string
		}{
			{"", sorted(j1, j2, j3, j4, j5)},
			{"worker_id=" + a.WorkerID, sorted(j1, j3)},
			{"worker_id=" + a.WorkerID + "&state=succeeded", []string{j1}},
			{"worker_id=" + a.WorkerID + "&state=queued", []string{j3}},
			{"worker_id=" + b.WorkerID, []string{j2}},
			{"worker_id=" + b.WorkerID + "&state=running", []string{j2}},
			{"worker_id=wrk_nobody", nil},
			{"tag=lab", sorted(j1, j3, j4)},
			{"tag=lab&job_type=status_check", sorted(j1, j3)},
			{"tag=lab&job_type=lora_train&state=queued", []string{j4}},
			{"tag=lab&worker_id=" + a.WorkerID, sorted(j1, j3)},
			{"tag=la", nil},
			{"tag=lab&limit=1", sorted(j1, j3, j4)}, // one a page, followed to the end
			{"job_type=inference", []string{j5}},
			{"job_type=status_check&worker_id=" + b.WorkerID + "&tag=lab", nil},
		} {
			got := listJobIDs(t, env, c.query)
			if d := cmp.Diff(c.want, got, cmpopts.EquateEmpty()); d != "" {
				t.Errorf("?%s (-want +got):\n%s", c.query, d)
			}
		}
		for _, q := range []string{"worker_id=a&worker_id=b", "tag=x&tag=y", "job_type=a&job_type=b"} {
			st, m := op(t, env, "GET", "/operator/jobs?"+q, nil)
			wantOpError(t, q, st, m, http.StatusBadRequest, wire.CodeInvalidRequest)
		}
	})
}

// GET /operator/receipts?kind= lists the sequenced receipts of one kind
// in index order, paging with after and limit.
func TestOperatorReceiptKindFilter(t *testing.T) {
	t.Parallel()
	onDialects(t, func(t *testing.T, d string) {
		env := newOpEnv(t, d)
		n := opGPUNode(t, env, "gpu-1", 1)
		for range 3 {
			dispatchJob(t, env, obj{"job_type": "status_check"})
			id, tok := runOne(t, n, "status_check")
			completeJob(t, n, id, tok)
		}
		if st, b := env.Operator(t, "GET", "/operator/receipts/checkpoint", nil); st != http.StatusOK {
			t.Fatalf("checkpoint: %d %s", st, b)
		}
		// Every receipt, by kind, from the unfiltered list.
		byKind := map[string][]int64{}
		m := mustOp(t, env, http.StatusOK, "GET", "/operator/receipts?limit=1000", nil)
		for _, r := range m["receipts"].([]any) {
			r := r.(obj)
			byKind[r["kind"].(string)] = append(byKind[r["kind"].(string)], int64(r["index"].(float64)))
		}
		if len(byKind[string(receipts.KindJobCharged)]) != 3 {
			t.Fatalf("job_charged receipts %v, want 3", byKind)
		}
		for _, k := range receipts.Kinds() {
			for _, limit := range []int{1, 2, 100} {
				var got []int64
				after := ""
				for pages := 0; ; pages++ {
					if pages > 10 {
						t.Fatalf("kind %s: too many pages", k)
					}
					path := fmt.Sprintf("/operator/receipts?kind=%s&limit=%d%s", k, limit, after)
					m := mustOp(t, env, http.StatusOK, "GET", path, nil)
					rs := m["receipts"].([]any)
					if len(rs) > limit {
						t.Fatalf("%s: %d receipts", path, len(rs))
					}
					for _, r := range rs {
						r := r.(obj)
						if r["kind"] != string(k) {
							t.Errorf("%s: a %s receipt", path, r["kind"])
						}
						exactKeys(t, path, r, receiptKeys...)
						got = append(got, int64(r["index"].(float64)))
					}
					next, ok := m["next"].(float64)
					if !ok {
						break
					}
					after = fmt.Sprintf("&after=%d", int64(next))
				}
				if d := cmp.Diff(byKind[string(k)], got, cmpopts.EquateEmpty()); d != "" {
					t.Errorf("kind %s, limit %d (-want +got):\n%s", k, limit, d)
				}
			}
		}
		for _, q := range []string{"kind=", "kind=job_charge", "kind=JOB_CHARGED", "kind=job_charged&kind=job_completed"} {
			st, m := op(t, env, "GET", "/operator/receipts?"+q, nil)
			wantOpError(t, q, st, m, http.StatusBadRequest, wire.CodeInvalidRequest)
		}
	})
}
