package workerapi_test

import (
	"context"
	"errors"
	"net/http"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nodelane/nodelane/internal/apitest"
	"github.com/nodelane/nodelane/lease"
	"github.com/nodelane/nodelane/receipts"
	"github.com/nodelane/nodelane/workerapi"
	"github.com/nodelane/nodelane/workerapi/wire"
)

// Every attempt's end is a receipt: each way a lease ends mints exactly
// one, job_completed for a success and job_failed for every other end,
// naming the job, worker, attempt, lease_epoch and reason, with the
// attempt's GPU time (actual_ms, from accept; absent when never
// accepted), gpu_count and whether it was charged; each verified offline
// against a signed checkpoint.

// attemptEnds returns the job_completed and job_failed receipts of job
// id, each fetched with its proof and checkpoint over HTTP and verified
// offline with receipts.Verify, and checks that no lease of it has two.
func attemptEnds(t *testing.T, env *apitest.Env, id string) []*receipts.Receipt {
	t.Helper()
	ctx := context.Background()
	if _, err := env.Server.Sequence(ctx); err != nil {
		t.Fatalf("Sequence: %v", err)
	}
	var out []*receipts.Receipt
	epochs := map[int64]string{}
	for from := int64(0); ; {
		ss, err := env.DB.ReceiptStore().ListReceipts(ctx, from, 1000)
		if err != nil {
			t.Fatal(err)
		}
		for _, st := range ss {
			if st.Kind != receipts.KindJobCompleted && st.Kind != receipts.KindJobFailed {
				continue
			}
			r, err := st.Receipt()
			if err != nil {
				t.Fatal(err)
			}
			if r.JobID != id {
				continue
			}
			var resp wire.ReceiptResponse
			remarshalJSON(t, mustOp(t, env, http.StatusOK, http.MethodGet, "/operator/receipts/"+r.ID, nil), &resp)
			if resp.Proof == nil || resp.Checkpoint == nil {
				t.Fatalf("receipt %s has no proof", r.ID)
			}
			v, err := receipts.Verify(env.Server.ReceiptVerifierKey(), env.Config.Origin, resp.Receipt.Body, *resp.Proof, []byte(*resp.Checkpoint))
			if err != nil {
				t.Fatalf("verify %s: %v", r.ID, err)
			}
			if prev, ok := epochs[v.LeaseEpoch]; ok {
				t.Fatalf("lease %d of job %s ended twice: %s and %s", v.LeaseEpoch, id, prev, v.ID)
			}
			epochs[v.LeaseEpoch] = v.ID
			out = append(out, v)
		}
		if len(ss) < 1000 {
			return out
		}
		from = ss[len(ss)-1].Index + 1
	}
}

// wantEnd checks the one receipt of the job's only lease.
type wantEnd struct {
	kind     receipts.Kind
	code     string // job_failed's error_code
	outcome  string // job_failed's outcome
	ms       int64  // actual_ms; 0 for never accepted
	charged  string
	jobState lease.State
}

func checkEnd(t *testing.T, env *apitest.Env, n *apitest.Node, id string, w wantEnd) *receipts.Receipt {
	t.Helper()
	rs := attemptEnds(t, env, id)
	if len(rs) != 1 {
		t.Fatalf("job %s: %d receipts of its lease's end, want 1: %v", id, len(rs), rs)
	}
	r := rs[0]
	j := env.Job(t, id)
	if r.Kind != w.kind || r.ErrorCode != w.code || r.Outcome != w.outcome || r.ActualMS != w.ms || r.Charged != w.charged ||
		r.GPUCount != 1 || r.WorkerID != n.WorkerID || r.LeaseEpoch != 1 || r.Attempt != 1 || r.LeaseID != j.Lease.ID {
		t.Fatalf("job %s: receipt %v, want %+v", id, r, w)
	}
	if (w.ms == 0) != r.StartedAt.IsZero() {
		t.Fatalf("job %s: started_at %v with actual_ms %d", id, r.StartedAt, r.ActualMS)
	}
	if j.State != w.jobState {
		t.Fatalf("job %s is %s, want %s", id, j.State, w.jobState)
	}
	if j.State.Terminal() && j.ReceiptID != r.ID {
		t.Fatalf("job %s: receipt_id %q, want %s", id, j.ReceiptID, r.ID)
	}
	if j.State == lease.StateQueued {
		// Out of the way of the next case.
		mustOp(t, env, http.StatusOK, http.MethodPost, "/operator/jobs/"+id+"/cancel", nil)
	}
	return r
}

func TestEveryEndIsAReceipt(t *testing.T) {
	t.Parallel()
	onDialects(t, func(t *testing.T, dialect string) {
		env, n := boundsEnv(t, dialect)
		env.Clock.Set(time.Now().UTC().Truncate(time.Millisecond))
		ctx := context.Background()
		maintain := func(t *testing.T) {
			t.Helper()
			if err := env.Server.MaintainOnce(ctx); err != nil {
				t.Fatal(err)
			}
		}
		act := func(t *testing.T, id, action string, body any, want int) []byte {
			t.Helper()
			st, b := post(t, n, "/workers/jobs/"+id+"/"+action, body)
			if st != want {
				t.Fatalf("%s %s: %d %s, want %d", action, id, st, b, want)
			}
			return b
		}
		job := func(t *testing.T, maxRuntime int) string {
			t.Helper()
			beat(t, n) // the worker is online
			return gpuJob(t, env, obj{"max_runtime_seconds": maxRuntime})
		}
		run := func(t *testing.T, id string) string {
			t.Helper()
			got, tok := leaseOne(t, n, "status_check")
			if got != id {
				t.Fatalf("leased %s, want %s", got, id)
			}
			act(t, id, "accept", wire.TokenRequest{LeaseToken: tok}, http.StatusOK)
			return tok
		}
		second := time.Second
		ms := second.Milliseconds()

		t.Run("complete", func(t *testing.T) {
			id := job(t, 0)
			tok := run(t, id)
			env.Clock.Advance(second)
			act(t, id, "complete", wire.CompleteRequest{LeaseToken: tok}, http.StatusOK)
			checkEnd(t, env, n, id, wantEnd{kind: receipts.KindJobCompleted, ms: ms, charged: receipts.ChargedYes, jobState: lease.StateSucceeded})
		})
		t.Run("fail", func(t *testing.T) {
			id := job(t, 0)
			tok := run(t, id)
			env.Clock.Advance(second)
			b := act(t, id, "fail", wire.FailRequest{LeaseToken: tok, ErrorCode: "oom"}, http.StatusOK)
			r := checkEnd(t, env, n, id, wantEnd{kind: receipts.KindJobFailed, code: "oom", outcome: receipts.OutcomeFailed, ms: ms, charged: receipts.ChargedNo, jobState: lease.StateFailed})
			if out := decode[wire.FailResponse](t, b); out.ReceiptID != r.ID {
				t.Fatalf("fail answered receipt_id %s, want %s", out.ReceiptID, r.ID)
			}
		})
		t.Run("fail retryable", func(t *testing.T) {
			id := job(t, 0)
			tok := run(t, id)
			env.Clock.Advance(second)
			act(t, id, "fail", wire.FailRequest{LeaseToken: tok, ErrorCode: "flaky", Retryable: true}, http.StatusOK)
			checkEnd(t, env, n, id, wantEnd{kind: receipts.KindJobFailed, code: "flaky", outcome: receipts.OutcomeRequeued, ms: ms, charged: receipts.ChargedNo, jobState: lease.StateQueued})
		})
		t.Run("release before accept", func(t *testing.T) {
			id := job(t, 0)
			got, tok := leaseOne(t, n, "status_check")
			if got != id {
				t.Fatalf("leased %s, want %s", got, id)
			}
			act(t, id, "release", wire.ReleaseRequest{LeaseToken: tok}, http.StatusOK)
			checkEnd(t, env, n, id, wantEnd{kind: receipts.KindJobFailed, code: "released", outcome: receipts.OutcomeRequeued, charged: receipts.ChargedNo, jobState: lease.StateQueued})
		})
		t.Run("accept timeout", func(t *testing.T) {
			id := job(t, 0)
			if got, _ := leaseOne(t, n, "status_check"); got != id {
				t.Fatalf("leased %s, want %s", got, id)
			}
			env.Clock.Advance(workerapi.DefaultAcceptTimeout)
			maintain(t)
			checkEnd(t, env, n, id, wantEnd{kind: receipts.KindJobFailed, code: "accept_timeout", outcome: receipts.OutcomeRequeued, charged: receipts.ChargedNo, jobState: lease.StateQueued})
		})
		t.Run("TTL expiry after accept", func(t *testing.T) {
			id := job(t, 0)
			run(t, id)
			env.Clock.Advance(workerapi.DefaultLeaseTTL)
			maintain(t)
			checkEnd(t, env, n, id, wantEnd{kind: receipts.KindJobFailed, code: "lease_expired", outcome: receipts.OutcomeRequeued,
				ms: workerapi.DefaultLeaseTTL.Milliseconds(), charged: receipts.ChargedNo, jobState: lease.StateQueued})
		})
		t.Run("cancel grace runs out", func(t *testing.T) {
			id := job(t, 0)
			run(t, id)
			mustOp(t, env, http.StatusOK, http.MethodPost, "/operator/jobs/"+id+"/cancel", nil)
			env.Clock.Advance(workerapi.DefaultCancelGrace)
			maintain(t)
			checkEnd(t, env, n, id, wantEnd{kind: receipts.KindJobFailed, code: "lease_expired", outcome: receipts.OutcomeCanceled,
				ms: workerapi.DefaultCancelGrace.Milliseconds(), charged: receipts.ChargedNo, jobState: lease.StateCanceled})
		})
		t.Run("cancel then complete", func(t *testing.T) {
			id := job(t, 0)
			tok := run(t, id)
			mustOp(t, env, http.StatusOK, http.MethodPost, "/operator/jobs/"+id+"/cancel", nil)
			env.Clock.Advance(second)
			act(t, id, "complete", wire.CompleteRequest{LeaseToken: tok}, http.StatusConflict)
			checkEnd(t, env, n, id, wantEnd{kind: receipts.KindJobFailed, code: "completed", outcome: receipts.OutcomeCanceled, ms: ms, charged: receipts.ChargedNo, jobState: lease.StateCanceled})
		})
		t.Run("max runtime exceeded", func(t *testing.T) {
			id := job(t, 30)
			run(t, id)
			env.Clock.Advance(30 * second)
			maintain(t)
			checkEnd(t, env, n, id, wantEnd{kind: receipts.KindJobFailed, code: lease.CodeMaxRuntimeExceeded, outcome: receipts.OutcomeFailed,
				ms: 30 * ms, charged: receipts.ChargedNo, jobState: lease.StateFailed})
		})
		t.Run("worker offline", func(t *testing.T) {
			id := job(t, 0)
			run(t, id)
			off := 3 * workerapi.DefaultHeartbeatInterval
			env.Clock.Advance(off)
			maintain(t)
			checkEnd(t, env, n, id, wantEnd{kind: receipts.KindJobFailed, code: lease.CodeWorkerOffline, outcome: receipts.OutcomeRequeued,
				ms: off.Milliseconds(), charged: receipts.ChargedNo, jobState: lease.StateQueued})
		})
		t.Run("retire", func(t *testing.T) {
			id := job(t, 0)
			run(t, id)
			env.Clock.Advance(second)
			mustOp(t, env, http.StatusOK, http.MethodPost, "/operator/workers/"+n.WorkerID+"/retire", obj{"reason": "gone"})
			checkEnd(t, env, n, id, wantEnd{kind: receipts.KindJobFailed, code: lease.CodeWorkerRetired, outcome: receipts.OutcomeRequeued,
				ms: ms, charged: receipts.ChargedNo, jobState: lease.StateQueued})
		})
	})
}

// Two replicas on one PostgreSQL database expire the same leases at once:
// each lease's end is minted once, by the replica whose write won.
func TestReplicasExpireOnce(t *testing.T) {
	t.Parallel()
	env, n := boundsEnv(t, "postgres")
	replica := env.Replica(t)
	env.Clock.Set(time.Now().UTC().Truncate(time.Millisecond))
	const jobs = 4
	ids := make([]string, jobs)
	for i := range ids {
		ids[i] = gpuJob(t, env, nil)
	}
	for range ids {
		id, tok := leaseOne(t, n, "status_check")
		if st, b := post(t, n, "/workers/jobs/"+id+"/accept", wire.TokenRequest{LeaseToken: tok}); st != http.StatusOK {
			t.Fatalf("accept: %d %s", st, b)
		}
	}
	env.Clock.Advance(workerapi.DefaultLeaseTTL)
	var wg sync.WaitGroup
	errs := make([]error, 6)
	for i := range errs {
		s := env.Server
		if i%2 == 1 {
			s = replica.Server
		}
		wg.Go(func() { errs[i] = s.MaintainOnce(context.Background()) })
	}
	wg.Wait()
	for _, err := range errs {
		if err != nil {
			t.Fatalf("MaintainOnce: %v", err)
		}
	}
	for _, id := range ids {
		rs := attemptEnds(t, env, id)
		if len(rs) != 1 || rs[0].ErrorCode != "lease_expired" {
			t.Fatalf("job %s: receipts %v, want one lease_expired", id, rs)
		}
		if j := env.Job(t, id); j.State != lease.StateQueued || j.LastError == nil || j.LastError.Code != "lease_expired" {
			t.Fatalf("job %s: %+v", id, j)
		}
	}
	if got := kindCount(t, env, receipts.KindJobFailed); got != jobs {
		t.Fatalf("%d job_failed receipts, want %d", got, jobs)
	}
}

// failingMints is a receipts store whose AddReceipt fails while fail is set.
type failingMints struct {
	receipts.Store
	fail *atomic.Bool
}

func (f failingMints) AddReceipt(ctx context.Context, s *receipts.Stored) error {
	if f.fail.Load() {
		return errors.New("injected: the receipt cannot be stored")
	}
	return f.Store.AddReceipt(ctx, s)
}

// No write without its receipt: an expiry whose receipt cannot be minted
// is rolled back, and the lease stays as it was until the next round can
// mint it; on every dialect.
func TestExpiryWithoutReceiptRollsBack(t *testing.T) {
	t.Parallel()
	onDialects(t, func(t *testing.T, dialect string) {
		fail := &atomic.Bool{}
		env, n := boundsEnv(t, dialect, apitest.WithStores(func(s workerapi.Stores) workerapi.Stores {
			s.Receipts = failingMints{s.Receipts, fail}
			return s
		}))
		env.Clock.Set(time.Now().UTC().Truncate(time.Millisecond))
		id := gpuJob(t, env, nil)
		got, tok := leaseOne(t, n, "status_check")
		if got != id {
			t.Fatalf("leased %s, want %s", got, id)
		}
		if st, b := post(t, n, "/workers/jobs/"+id+"/accept", wire.TokenRequest{LeaseToken: tok}); st != http.StatusOK {
			t.Fatalf("accept: %d %s", st, b)
		}
		env.Clock.Advance(workerapi.DefaultLeaseTTL)
		before := env.Job(t, id)
		fail.Store(true)
		if err := env.Server.MaintainOnce(context.Background()); err == nil {
			t.Fatal("MaintainOnce succeeded although no receipt could be minted")
		}
		// A lease request's sweep fails likewise, and grants nothing.
		st, b := post(t, n, "/workers/jobs/lease", obj{"supported_job_types": []string{"status_check"}})
		wantErr(t, st, b, http.StatusServiceUnavailable, wire.CodeUnavailable)
		if after := env.Job(t, id); after.State != lease.StateRunning || after.Rev != before.Rev {
			t.Fatalf("the expiry was written without its receipt: %s rev %d -> %s rev %d", before.State, before.Rev, after.State, after.Rev)
		}
		fail.Store(false)
		if err := env.Server.MaintainOnce(context.Background()); err != nil {
			t.Fatal(err)
		}
		if rs := attemptEnds(t, env, id); len(rs) != 1 || rs[0].ErrorCode != "lease_expired" {
			t.Fatalf("receipts %v, want one lease_expired", rs)
		}
	})
}
