package workerapi_test

import (
	"context"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/nodelane/nodelane/internal/apitest"
	"github.com/nodelane/nodelane/lease"
	"github.com/nodelane/nodelane/receipts"
	"github.com/nodelane/nodelane/workerapi"
	"github.com/nodelane/nodelane/workerapi/wire"
)

// receiptTables are the tables of the receipt log.
var receiptTables = []string{"nodelane_receipts", "nodelane_receipt_hashes", "nodelane_receipt_tree", "nodelane_receipt_checkpoints"}

// verifiedReceipt reads a receipt with its proof over HTTP and verifies
// it offline, as a third party does.
func verifiedReceipt(t *testing.T, env *apitest.Env, id string) *receipts.Receipt {
	t.Helper()
	m := mustOp(t, env, http.StatusOK, "GET", "/operator/receipts/"+id, nil)
	var got struct {
		Receipt    receipts.WireReceipt
		Proof      receipts.Proof
		Checkpoint string
	}
	remarshalJSON(t, m, &got)
	r, err := receipts.Verify(env.Server.ReceiptVerifierKey(), env.Config.Origin, got.Receipt.Body, got.Proof, []byte(got.Checkpoint))
	if err != nil {
		t.Fatalf("receipt %s does not verify offline: %v", id, err)
	}
	return r
}

// endedJob runs a job to completion on n with a log line, a status event
// and an artifact, and returns its id, its lease token and the ids of its
// artifact's and its completion's receipts.
func endedJob(t *testing.T, env *apitest.Env, n *apitest.Node) (id, token string, rcpts []string) {
	t.Helper()
	dispatchJob(t, env, obj{"job_type": "status_check"})
	id, token = runOne(t, n, "status_check")
	signedCall(t, n, http.StatusOK, "/workers/jobs/"+id+"/logs", obj{"lease_token": token, "seq": 1, "message": "epoch 1"})
	signedCall(t, n, http.StatusOK, "/workers/jobs/"+id+"/status", obj{"lease_token": token, "event_type": "progress"})
	art := signedCall(t, n, http.StatusCreated, "/workers/jobs/"+id+"/artifacts", obj{
		"lease_token": token, "artifact_type": "log", "name": "out.txt", "uri": "s3://bucket/" + id,
	})
	completeJob(t, n, id, token)
	job := mustOp(t, env, http.StatusOK, "GET", "/operator/jobs/"+id, nil)
	if evs := job["events"].([]any); len(evs) != 2 {
		t.Fatalf("job %s has %d events, want 2", id, len(evs))
	}
	return id, token, []string{art["receipt_id"].(string), job["job"].(obj)["receipt_id"].(string)}
}

// With Config.Lease.Retention, the maintainer deletes the jobs that ended
// longer ago with their events and artifacts: the operator routes answer
// 404 for them as for unknown jobs, and a worker's old lease token 409
// lease_lost. Younger, queued and live jobs stay, and every receipt stays
// and verifies.
func TestRetention(t *testing.T) {
	t.Parallel()
	const retention = 2 * time.Hour
	onDialects(t, func(t *testing.T, dialect string) {
		ctx := context.Background()
		env := newOpEnv(t, dialect, apitest.WithConfig(func(c *workerapi.Config) {
			c.Lease.Retention = retention
			// The clock jumps hours with no heartbeat: the node's live
			// job must not end because the node went offline.
			c.Lease.OfflineAfter = 24 * time.Hour
		}))
		n := opGPUNode(t, env, "gpu-1", 4)
		old, oldToken, oldReceipts := endedJob(t, env, n)
		queued := dispatchJob(t, env, obj{"job_type": "lora_train"})["job"].(obj)["id"].(string) // blocked: never leased
		env.Clock.Advance(retention - time.Hour)
		young, _, youngReceipts := endedJob(t, env, n)
		env.Clock.Advance(time.Hour - time.Minute) // old ended a minute less than Retention ago: kept
		if err := env.Server.MaintainOnce(ctx); err != nil {
			t.Fatal(err)
		}
		mustOp(t, env, http.StatusOK, "GET", "/operator/jobs/"+old, nil)

		dispatchJob(t, env, obj{"job_type": "status_check"})
		live, _ := runOne(t, n, "status_check")
		env.Clock.Advance(2 * time.Minute)
		if _, err := env.Server.Sequence(ctx); err != nil {
			t.Fatal(err)
		}
		before := env.Dump(t)
		if err := env.Server.MaintainOnce(ctx); err != nil {
			t.Fatal(err)
		}
		after := env.Dump(t)
		for _, table := range receiptTables {
			if d := cmp.Diff(before[table], after[table]); d != "" {
				t.Errorf("retention changed %s (-before +after):\n%s", table, d)
			}
		}
		var left []string
		for _, row := range after["nodelane_job_events"] {
			if strings.Contains(row, old) {
				left = append(left, row)
			}
		}
		if len(left) != 0 {
			t.Errorf("events of the deleted job kept: %v", left)
		}

		st, m := op(t, env, "GET", "/operator/jobs/"+old, nil)
		wantOpError(t, "the deleted job", st, m, http.StatusNotFound, wire.CodeNotFound)
		st, m = op(t, env, "GET", "/operator/artifacts?job_id="+old, nil)
		wantOpError(t, "the deleted job's artifacts", st, m, http.StatusNotFound, wire.CodeNotFound)
		for _, a := range mustOp(t, env, http.StatusOK, "GET", "/operator/artifacts", nil)["artifacts"].([]any) {
			if a.(obj)["job_id"] == old {
				t.Errorf("artifact of the deleted job listed: %v", a)
			}
		}
		st, b := post(t, n, "/workers/jobs/"+old+"/complete", obj{"lease_token": oldToken})
		wantErr(t, st, b, http.StatusConflict, wire.CodeLeaseLost)

		for id, state := range map[string]string{young: "succeeded", queued: "queued", live: "running"} {
			j := mustOp(t, env, http.StatusOK, "GET", "/operator/jobs/"+id, nil)
			if got := j["job"].(obj)["state"]; got != state {
				t.Errorf("job %s kept in state %v, want %s", id, got, state)
			}
		}
		if evs := mustOp(t, env, http.StatusOK, "GET", "/operator/jobs/"+young, nil)["events"].([]any); len(evs) != 2 {
			t.Errorf("the young job kept %d events, want 2", len(evs))
		}
		for _, id := range append(oldReceipts, youngReceipts...) {
			verifiedReceipt(t, env, id)
		}
		if r := verifiedReceipt(t, env, oldReceipts[1]); r.JobID != old {
			t.Errorf("the deleted job's completion receipt names job %q, want %q", r.JobID, old)
		}
	})
}

// Without Retention, the maintainer keeps every job.
func TestNoRetention(t *testing.T) {
	t.Parallel()
	env := newOpEnv(t, "sqlite")
	n := opGPUNode(t, env, "gpu-1", 4)
	id, _, _ := endedJob(t, env, n)
	env.Clock.Advance(20 * time.Hour)
	if err := env.Server.MaintainOnce(context.Background()); err != nil {
		t.Fatal(err)
	}
	if evs := mustOp(t, env, http.StatusOK, "GET", "/operator/jobs/"+id, nil)["events"].([]any); len(evs) != 2 {
		t.Errorf("the job kept %d events, want 2", len(evs))
	}
}

// racingLeases deletes every ended job, once armed, right after a list of
// artifacts read them: retention running between the artifacts' read and
// their jobs'.
type racingLeases struct {
	lease.Store
	armed *atomic.Bool
}

func (s racingLeases) ListArtifacts(ctx context.Context, f lease.ArtifactFilter) ([]*lease.Artifact, error) {
	as, err := s.Store.ListArtifacts(ctx, f)
	if err == nil && s.armed.CompareAndSwap(true, false) {
		_, err = s.Store.DeleteEnded(ctx, time.Now().Add(1000*time.Hour), lease.PruneBatch)
	}
	return as, err
}

// A list of artifacts whose jobs retention deletes while it is read
// leaves those artifacts out instead of failing.
func TestArtifactListRacesRetention(t *testing.T) {
	t.Parallel()
	armed := new(atomic.Bool)
	env := newOpEnv(t, "sqlite", apitest.WithStores(func(st workerapi.Stores) workerapi.Stores {
		st.Leases = racingLeases{st.Leases, armed}
		return st
	}))
	n := opGPUNode(t, env, "gpu-1", 4)
	ended, _, _ := endedJob(t, env, n)
	dispatchJob(t, env, obj{"job_type": "status_check"})
	live, tok := runOne(t, n, "status_check")
	reportArtifact(t, n, live, tok, "log", "live.txt")
	if as := mustOp(t, env, http.StatusOK, "GET", "/operator/artifacts", nil)["artifacts"].([]any); len(as) != 2 {
		t.Fatalf("%d artifacts before the deletion, want 2", len(as))
	}
	armed.Store(true)
	as := mustOp(t, env, http.StatusOK, "GET", "/operator/artifacts", nil)["artifacts"].([]any)
	if len(as) != 1 || as[0].(obj)["job_id"] != live {
		t.Errorf("artifacts listed while %s was deleted: %v; want only the live job's", ended, as)
	}
	st, m := op(t, env, "GET", "/operator/jobs/"+ended, nil)
	wantOpError(t, "the deleted job", st, m, http.StatusNotFound, wire.CodeNotFound)
}
