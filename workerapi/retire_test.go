package workerapi_test

import (
	"net/http"
	"testing"

	"github.com/nodelane/nodelane/credential"
	"github.com/nodelane/nodelane/internal/apitest"
	"github.com/nodelane/nodelane/lease"
	"github.com/nodelane/nodelane/receipts"
	"github.com/nodelane/nodelane/workerapi/wire"
)

// POST /operator/workers/{id}/retire retires a worker for good: its
// credentials revoked (its next request refused), its live leases ended
// with their jobs back in the queue, a worker_retired receipt minted and
// verifiable; again, it answers the same; a token without
// operator:workers may not.
func TestOperatorRetireWorker(t *testing.T) {
	t.Parallel()
	onDialects(t, func(t *testing.T, d string) {
		env := newOpEnv(t, d)
		n := opGPUNode(t, env, "gpu-retiring", 2)
		other := opGPUNode(t, env, "gpu-other", 2)
		j1 := dispatchJob(t, env, obj{"job_type": "status_check"})["job"].(obj)["id"].(string)
		j2 := dispatchJob(t, env, obj{"job_type": "status_check"})["job"].(obj)["id"].(string)
		leased, _ := leaseOne(t, n, "status_check")
		running, _ := runOne(t, n, "status_check")
		if leased != j1 || running != j2 {
			t.Fatalf("leased %s and ran %s, want %s and %s", leased, running, j1, j2)
		}
		path := "/operator/workers/" + n.WorkerID + "/retire"

		// Without operator:workers: 403, nothing changes.
		jobsOnly, _ := env.Credential(t, apitest.OperatorID, credential.ScopeOperatorJobs)
		before := env.Dump(t)
		st, m := opCall(t, env, jobsOnly, "POST", path, obj{"reason": "x"})
		wantOpError(t, "retire without operator:workers", st, m, http.StatusForbidden, wire.CodeInsufficientScope)
		st, m = op(t, env, "POST", "/operator/workers/wrk_nobody/retire", nil)
		wantOpError(t, "retire an unknown worker", st, m, http.StatusNotFound, wire.CodeNotFound)
		st, m = op(t, env, "POST", path, obj{"reason": 5})
		wantOpError(t, "retire with a bad body", st, m, http.StatusBadRequest, wire.CodeInvalidRequest)
		stateUnchanged(t, env, "refused retirements", before)

		receiptsBefore := env.Receipts(t)
		first := mustOp(t, env, http.StatusOK, "POST", path, obj{"reason": "decommissioned"})
		exactKeys(t, "retire answer", first, "worker", "receipt_id")
		w := first["worker"].(obj)
		exactKeys(t, "retired worker", w, workerKeys...)
		if w["status"] != lease.StatusRetired || w["worker_id"] != n.WorkerID || w["banned"] != true {
			t.Errorf("retired worker: %v", w)
		}
		rid, _ := first["receipt_id"].(string)
		if rid == "" {
			t.Fatalf("no receipt_id: %v", first)
		}
		// The worker_retired receipt, and a job_failed one for each of
		// the two leases the retirement ended.
		if got := env.Receipts(t); got != receiptsBefore+3 {
			t.Errorf("%d receipts minted, want 3", got-receiptsBefore)
		}
		// The receipt: in the log with its proof, verifiable offline.
		rr := mustOp(t, env, http.StatusOK, "GET", "/operator/receipts/"+rid, nil)
		var resp wire.ReceiptResponse
		remarshalJSON(t, rr, &resp)
		if resp.Proof == nil || resp.Checkpoint == nil {
			t.Fatalf("worker_retired receipt has no proof: %v", rr)
		}
		rc, err := receipts.Verify(env.Server.ReceiptVerifierKey(), env.Config.Origin, resp.Receipt.Body, *resp.Proof, []byte(*resp.Checkpoint))
		if err != nil {
			t.Fatalf("verify: %v", err)
		}
		if rc.Kind != receipts.KindWorkerRetired || rc.WorkerID != n.WorkerID || rc.NodeID != "gpu-retiring" ||
			rc.Actor != apitest.OperatorID || rc.Reason != "decommissioned" {
			t.Errorf("worker_retired receipt: %+v", rc)
		}

		// Its live leases ended: both jobs queued again, no attempt used.
		for _, id := range []string{j1, j2} {
			j := env.Job(t, id)
			if j.State != lease.StateQueued || j.LastError == nil || j.LastError.Code != lease.CodeWorkerRetired || j.Attempt != 1 {
				t.Errorf("job %s after the retirement: state %s, attempt %d, last error %+v", id, j.State, j.Attempt, j.LastError)
			}
		}
		// Its credentials are revoked, and its next signed request is
		// refused; the other worker takes its jobs.
		creds := mustOp(t, env, http.StatusOK, "GET", "/operator/credentials?principal="+n.WorkerID, nil)["credentials"].([]any)
		if len(creds) == 0 {
			t.Fatalf("the worker has no credentials")
		}
		for _, c := range creds {
			if c.(obj)["revoked_at"] == nil {
				t.Errorf("credential %v is not revoked", c)
			}
		}
		for _, p := range []string{"/workers/heartbeat", "/workers/jobs/lease"} {
			resp, b := n.Do(t, http.MethodPost, p, obj{"status": "idle", "supported_job_types": []string{"status_check"}})
			if resp.StatusCode != http.StatusUnauthorized && resp.StatusCode != http.StatusForbidden {
				t.Errorf("POST %s by the retired worker: %d %s", p, resp.StatusCode, b)
			}
		}
		got := map[string]bool{}
		for range 2 {
			id, _ := leaseOne(t, other, "status_check")
			got[id] = true
		}
		if !got[j1] || !got[j2] {
			t.Errorf("the other worker leased %v, want %s and %s", got, j1, j2)
		}
		// The lease layer grants it nothing either, whatever its token.
		dispatchJob(t, env, obj{"job_type": "status_check"})
		gs, err := env.Server.Leases().Lease(t.Context(), lease.LeaseRequest{WorkerID: n.WorkerID, MaxJobs: 1})
		if err != nil || len(gs) != 0 {
			t.Errorf("Lease for the retired worker: %d grants, %v", len(gs), err)
		}

		// Again: the first answer, nothing minted.
		before = env.Dump(t)
		again := mustOp(t, env, http.StatusOK, "POST", path, obj{"reason": "again"})
		if again["receipt_id"] != rid || again["worker"].(obj)["status"] != lease.StatusRetired {
			t.Errorf("retiring again: %v, want receipt %s", again, rid)
		}
		// It stays banned: unban and ban are refused.
		for _, a := range []string{"unban", "ban"} {
			st, m := op(t, env, "POST", "/operator/workers/"+n.WorkerID+"/"+a, nil)
			wantOpError(t, a+" a retired worker", st, m, http.StatusConflict, wire.CodeInvalidTransition)
		}
		stateUnchanged(t, env, "retiring again", before)
		v := mustOp(t, env, http.StatusOK, "GET", "/operator/workers/"+n.WorkerID, nil)["worker"].(obj)
		if v["status"] != lease.StatusRetired {
			t.Errorf("GET worker: status %v", v["status"])
		}
	})
}
