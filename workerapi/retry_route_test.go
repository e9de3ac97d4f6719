package workerapi_test

import (
	"net/http"
	"strings"
	"testing"

	"github.com/nodelane/nodelane/credential"
	"github.com/nodelane/nodelane/internal/apitest"
	"github.com/nodelane/nodelane/receipts"
	"github.com/nodelane/nodelane/workerapi/wire"
)

// retriedReceipt reads receipt id, checks its proof against the log's
// key, and returns it decoded.
func retriedReceipt(t *testing.T, env *apitest.Env, id string) *receipts.Receipt {
	t.Helper()
	var resp wire.ReceiptResponse
	remarshalJSON(t, mustOp(t, env, http.StatusOK, http.MethodGet, "/operator/receipts/"+id, nil), &resp)
	if resp.Proof == nil || resp.Checkpoint == nil {
		t.Fatalf("receipt %s has no proof", id)
	}
	v, err := receipts.Verify(env.Server.ReceiptVerifierKey(), env.Config.Origin, resp.Receipt.Body, *resp.Proof, []byte(*resp.Checkpoint))
	if err != nil {
		t.Fatalf("verify %s: %v", id, err)
	}
	return v
}

// POST /operator/jobs/{id}/retry puts a failed job, and a canceled one,
// back in the queue with a fresh attempt budget and a job_retried
// receipt; the job leases and succeeds again. A job in any other state
// (queued, running, succeeded), an unknown job and a bad body are refused
// and change nothing.
func TestOperatorRetryJob(t *testing.T) {
	t.Parallel()
	onDialects(t, func(t *testing.T, d string) {
		env := newOpEnv(t, d)
		n := opGPUNode(t, env, "gpu-1", 1)
		failed := dispatchJob(t, env, obj{"job_type": "status_check", "max_attempts": 1})["job"].(obj)["id"].(string)
		id, tok := runOne(t, n, "status_check")
		if id != failed {
			t.Fatalf("ran %s, want %s", id, failed)
		}
		signedCall(t, n, http.StatusOK, "/workers/jobs/"+id+"/fail", obj{"lease_token": tok, "error_code": "oom", "message": "out of memory", "retryable": false})
		if j := env.Job(t, failed); j.State != "failed" {
			t.Fatalf("the job is %s, want failed", j.State)
		}

		m := mustOp(t, env, http.StatusOK, "POST", "/operator/jobs/"+failed+"/retry", obj{"reason": "driver fixed"})
		job := m["job"].(obj)
		if job["state"] != "queued" || job["attempt"].(float64) != 1 || job["finished_at"] != nil || job["cancel_requested"] != false {
			t.Fatalf("the retried job: %v", job)
		}
		rid, _ := m["receipt_id"].(string)
		if rid == "" {
			t.Fatalf("no receipt_id: %v", m)
		}
		v := retriedReceipt(t, env, rid)
		if v.Kind != receipts.KindJobRetried || v.JobID != failed || v.JobType != "status_check" || v.Actor != apitest.OperatorID || v.Reason != "driver fixed" || v.ErrorCode != "oom" {
			t.Fatalf("the job_retried receipt: %+v", v)
		}
		if j := env.Job(t, failed); j.LastError == nil || j.LastError.Code != "oom" || j.ReceiptID != "" {
			t.Fatalf("the stored job after the retry: last error %+v, receipt %q", j.LastError, j.ReceiptID)
		}
		// It runs again and succeeds, under a new lease.
		id, tok = runOne(t, n, "status_check")
		if id != failed {
			t.Fatalf("ran %s after the retry, want %s", id, failed)
		}
		completeJob(t, n, id, tok)
		if j := env.Job(t, failed); j.State != "succeeded" || j.Lease.Epoch < 2 {
			t.Fatalf("after the retry the job is %s at epoch %d", j.State, j.Lease.Epoch)
		}

		// A canceled job, retried without a body: no error_code.
		canceled := dispatchJob(t, env, obj{"job_type": "lora_train"})["job"].(obj)["id"].(string)
		mustOp(t, env, http.StatusOK, "POST", "/operator/jobs/"+canceled+"/cancel", nil)
		m = mustOp(t, env, http.StatusOK, "POST", "/operator/jobs/"+canceled+"/retry", nil)
		if m["job"].(obj)["state"] != "queued" {
			t.Fatalf("the retried canceled job: %v", m)
		}
		if v := retriedReceipt(t, env, m["receipt_id"].(string)); v.ErrorCode != "" || v.Reason != "" || v.JobType != "lora_train" {
			t.Fatalf("the job_retried receipt of a canceled job: %+v", v)
		}

		// Refusals: nothing changes, no receipt is minted.
		running := dispatchJob(t, env, obj{"job_type": "status_check"})["job"].(obj)["id"].(string)
		if id, _ := runOne(t, n, "status_check"); id != running {
			t.Fatalf("ran %s, want %s", id, running)
		}
		before := env.Dump(t)
		receiptsBefore := env.Receipts(t)
		for _, c := range []struct {
			what, id string
			body     any
			status   int
			code     string
		}{
			{"a queued job", canceled, nil, http.StatusConflict, wire.CodeInvalidTransition},
			{"a running job", running, obj{"reason": "x"}, http.StatusConflict, wire.CodeInvalidTransition},
			{"a succeeded job", failed, nil, http.StatusConflict, wire.CodeInvalidTransition},
			{"an unknown job", "job_nope", nil, http.StatusNotFound, wire.CodeNotFound},
			{"a reason over 1024 bytes", failed, obj{"reason": strings.Repeat("r", wire.MaxReasonBytes+1)}, http.StatusBadRequest, wire.CodeInvalidRequest},
			{"a body that is not an object", failed, []int{1}, http.StatusBadRequest, wire.CodeInvalidRequest},
			{"a reason that is not a string", failed, obj{"reason": 5}, http.StatusBadRequest, wire.CodeInvalidRequest},
		} {
			st, m := op(t, env, "POST", "/operator/jobs/"+c.id+"/retry", c.body)
			wantOpError(t, "retry of "+c.what, st, m, c.status, c.code)
		}
		stateUnchanged(t, env, "refused retries", before)
		if n := env.Receipts(t); n != receiptsBefore {
			t.Fatalf("refused retries minted %d receipts", n-receiptsBefore)
		}
		// The scope: a credential without operator:jobs is refused.
		tokJobs, _ := env.Credential(t, apitest.OperatorID, credential.ScopeOperatorReceipts)
		st, _ := env.Bearer(t, tokJobs, "POST", "/operator/jobs/"+canceled+"/retry", nil)
		if st != http.StatusForbidden {
			t.Fatalf("retry without operator:jobs: %d, want 403", st)
		}
		stateUnchanged(t, env, "a retry without the scope", before)
	})
}
