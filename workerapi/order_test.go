package workerapi_test

import (
	"context"
	"fmt"
	"net/http"
	"slices"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"

	"github.com/nodelane/nodelane/internal/apitest"
	"github.com/nodelane/nodelane/lease"
	"github.com/nodelane/nodelane/workerapi/wire"
)

// listIDs lists path with query, following next through every page, and
// returns the field key of each item of the list field items.
func listIDs(t *testing.T, env *apitest.Env, path, query, items, key string) []string {
	t.Helper()
	ids := []string{}
	after := ""
	for pages := 0; ; pages++ {
		if pages > 50 {
			t.Fatalf("%s?%s: more than 50 pages", path, query)
		}
		p := path + "?" + query
		if after != "" {
			p += "&after=" + after
		}
		m := mustOp(t, env, http.StatusOK, "GET", p, nil)
		for _, v := range m[items].([]any) {
			ids = append(ids, fmt.Sprint(v.(obj)[key]))
		}
		next := m["next"]
		if next == nil {
			return ids
		}
		after = fmt.Sprint(next)
	}
}

func reversed(ids []string) []string {
	out := slices.Clone(ids)
	slices.Reverse(out)
	return out
}

// GET /operator/jobs, /operator/artifacts, /operator/workers,
// /operator/credentials and /operator/receipts with order=desc list
// newest first (credentials in descending id order), paging toward older
// items through next, with their filters; order=asc and no order list
// oldest first; a bad order is 400 invalid_request and changes nothing.
func TestOperatorListOrder(t *testing.T) {
	t.Parallel()
	onDialects(t, func(t *testing.T, d string) {
		env := newOpEnv(t, d)
		a := opGPUNode(t, env, "gpu-a", 1)
		b := opGPUNode(t, env, "gpu-b", 1)
		c := opGPUNode(t, env, "gpu-c", 1)
		var jobs, lora []string
		for i := range 7 {
			typ := "status_check"
			if i%3 == 0 {
				typ = "lora_train"
			}
			id := dispatchJob(t, env, obj{"job_type": typ})["job"].(obj)["id"].(string)
			jobs = append(jobs, id)
			if typ == "lora_train" {
				lora = append(lora, id)
			}
			env.Clock.Advance(time.Millisecond) // ids in creation order
		}
		jobID, tok := runOne(t, a, "status_check")
		var arts []string
		for range 4 {
			art, err := env.Server.Leases().AddArtifact(context.Background(), lease.Ref{JobID: jobID, WorkerID: a.WorkerID, Token: tok}, lease.Artifact{Type: "log", Name: "out.txt"})
			if err != nil {
				t.Fatal(err)
			}
			arts = append(arts, art.ID)
			env.Clock.Advance(time.Millisecond)
		}
		slices.Sort(arts)
		workers := slices.Sorted(slices.Values([]string{a.WorkerID, b.WorkerID, c.WorkerID}))
		completeJob(t, a, jobID, tok)
		for range 2 {
			id, tok := runOne(t, b, "status_check")
			completeJob(t, b, id, tok)
		}
		for range 3 {
			mustOp(t, env, http.StatusCreated, "POST", "/operator/credentials", obj{"principal": apitest.ProvisionerID, "scopes": []string{"node:register"}})
		}
		if st, body := env.Operator(t, "GET", "/operator/receipts/checkpoint", nil); st != http.StatusOK {
			t.Fatalf("checkpoint: %d %s", st, body)
		}
		creds := listIDs(t, env, "/operator/credentials", "limit=1000", "credentials", "credential_id")
		if !slices.IsSorted(creds) || len(creds) < 4 {
			t.Fatalf("credentials ascending: %v", creds)
		}
		rcpts := listIDs(t, env, "/operator/receipts", "limit=1000", "receipts", "index")
		charged := listIDs(t, env, "/operator/receipts", "limit=1000&kind=job_charged", "receipts", "index")
		if len(rcpts) < 10 || len(charged) != 3 {
			t.Fatalf("receipts %v, job_charged %v", rcpts, charged)
		}
		provisioner := listIDs(t, env, "/operator/credentials", "principal="+apitest.ProvisionerID, "credentials", "credential_id")

		for _, tc := range []struct {
			path, query, items, key string
			want                    []string
		}{
			{"/operator/jobs", "order=desc", "jobs", "id", reversed(jobs)},
			{"/operator/jobs", "order=desc&limit=2", "jobs", "id", reversed(jobs)},
			{"/operator/jobs", "order=desc&limit=1&job_type=lora_train", "jobs", "id", reversed(lora)},
			{"/operator/jobs", "order=desc&state=succeeded", "jobs", "id", []string{jobs[4], jobs[2], jobs[1]}},
			{"/operator/jobs", "order=asc&limit=3", "jobs", "id", jobs},
			{"/operator/jobs", "limit=3", "jobs", "id", jobs},
			{"/operator/jobs", "order=&limit=3", "jobs", "id", jobs},
			{"/operator/jobs", "order=desc&limit=2&after=" + jobs[3], "jobs", "id", reversed(jobs[:3])},
			{"/operator/jobs", "order=desc&after=" + jobs[0], "jobs", "id", nil},
			{"/operator/artifacts", "order=desc&limit=3", "artifacts", "artifact_id", reversed(arts)},
			{"/operator/artifacts", "order=desc&job_id=" + jobID, "artifacts", "artifact_id", reversed(arts)},
			{"/operator/artifacts", "order=asc&limit=3", "artifacts", "artifact_id", arts},
			{"/operator/workers", "order=desc&limit=2", "workers", "worker_id", reversed(workers)},
			{"/operator/workers", "order=desc&after=" + workers[2], "workers", "worker_id", reversed(workers[:2])},
			{"/operator/workers", "limit=2", "workers", "worker_id", workers},
			{"/operator/credentials", "order=desc&limit=2", "credentials", "credential_id", reversed(creds)},
			{"/operator/credentials", "order=desc&after=" + creds[2], "credentials", "credential_id", reversed(creds[:2])},
			{"/operator/credentials", "order=desc&limit=1&principal=" + apitest.ProvisionerID, "credentials", "credential_id", reversed(provisioner)},
			{"/operator/receipts", "order=desc&limit=3", "receipts", "index", reversed(rcpts)},
			{"/operator/receipts", "order=desc", "receipts", "index", reversed(rcpts)},
			{"/operator/receipts", "order=desc&limit=2&after=5", "receipts", "index", reversed(rcpts[:5])},
			{"/operator/receipts", "order=desc&after=0", "receipts", "index", nil},
			{"/operator/receipts", "order=desc&after=999999", "receipts", "index", reversed(rcpts)},
			{"/operator/receipts", "order=desc&limit=1&kind=job_charged", "receipts", "index", reversed(charged)},
			{"/operator/receipts", "order=asc&limit=1&kind=job_charged", "receipts", "index", charged},
			{"/operator/receipts", "order=desc&kind=principal_created", "receipts", "index", reversed(listIDs(t, env, "/operator/receipts", "kind=principal_created", "receipts", "index"))},
		} {
			got := listIDs(t, env, tc.path, tc.query, tc.items, tc.key)
			if d := cmp.Diff(tc.want, got, cmpopts.EquateEmpty()); d != "" {
				t.Errorf("%s?%s (-want +got):\n%s", tc.path, tc.query, d)
			}
		}

		before := env.Dump(t)
		for _, path := range []string{"/operator/jobs", "/operator/artifacts", "/operator/workers", "/operator/credentials", "/operator/receipts"} {
			for _, bad := range []string{"order=DESC", "order=descending", "order=newest", "order=asc&order=desc", "order=%20desc"} {
				st, m := op(t, env, "GET", path+"?"+bad, nil)
				wantOpError(t, "GET "+path+"?"+bad, st, m, http.StatusBadRequest, wire.CodeInvalidRequest)
			}
		}
		stateUnchanged(t, env, "bad order", before)
	})
}
