package workerapi_test

import (
	"context"
	"net/http"
	"testing"
	"time"

	"github.com/nodelane/nodelane/internal/apitest"
	"github.com/nodelane/nodelane/lease"
	"github.com/nodelane/nodelane/receipts"
	"github.com/nodelane/nodelane/workerapi"
	"github.com/nodelane/nodelane/workerapi/wire"
)

// Every request's cost is bounded: a cancel is enforced after its grace,
// and no lease runs past its job's max runtime, whatever the worker does.
// The attack these tests reproduce: after an operator's cancel, a worker
// kept heartbeating for 64 simulated hours, then completed and was
// charged for all of it.

// boundsEnv is a control plane that prices the rtx-4090, and a GPU node
// whose signatures follow the Env's clock.
func boundsEnv(t *testing.T, dialect string, opts ...apitest.Option) (*apitest.Env, *apitest.Node) {
	t.Helper()
	opts = append([]apitest.Option{apitest.WithConfig(func(c *workerapi.Config) {
		c.Prices = receipts.Prices{BySKU: map[string]int64{sku: rate}}
	})}, opts...)
	env := newOpEnv(t, dialect, opts...)
	return env, opGPUNode(t, env, "studio-gpu-1", 4)
}

// gpuJob dispatches a status_check job on one rtx-4090, with requirements
// extra merged in, and returns its id.
func gpuJob(t *testing.T, env *apitest.Env, extra obj) string {
	t.Helper()
	req := obj{"gpu_sku": sku, "gpu_count": 1}
	for k, v := range extra {
		req[k] = v
	}
	return dispatchJob(t, env, obj{"job_type": "status_check", "requirements": req})["job"].(obj)["id"].(string)
}

// beat sends a heartbeat that lists jobs.
func beat(t *testing.T, n *apitest.Node, jobs ...string) wire.HeartbeatResponse {
	t.Helper()
	return nodeCall[wire.HeartbeatResponse](t, n, "heartbeat", wire.PathHeartbeat, wire.HeartbeatRequest{Status: "busy", CurrentJobs: jobs}, http.StatusOK)
}

// kindCount counts the minted receipts of kind.
func kindCount(t *testing.T, env *apitest.Env, kind receipts.Kind) int {
	t.Helper()
	n, err := env.DB.Bun().NewSelect().Table("nodelane_receipts").Where("kind = ?", string(kind)).Count(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	return int(n)
}

// refusedUnchanged sends a signed POST, wants the error status and code,
// and checks that nothing changed.
func refusedUnchanged(t *testing.T, env *apitest.Env, n *apitest.Node, what, path string, body any, status int, code string) {
	t.Helper()
	before := env.Dump(t)
	st, b := post(t, n, path, body)
	wantErr(t, st, b, status, code)
	stateUnchanged(t, env, what, before)
}

// The attack, with every way the revoked job gets swept: by the
// maintainer, by a lease request, and by the worker's own late complete.
func TestCancelEnforced(t *testing.T) {
	t.Parallel()
	sweeps := []struct {
		name  string
		sweep func(t *testing.T, env *apitest.Env, n *apitest.Node)
	}{
		{"maintainer", func(t *testing.T, env *apitest.Env, _ *apitest.Node) {
			if err := env.Server.MaintainOnce(context.Background()); err != nil {
				t.Fatal(err)
			}
		}},
		{"lease request", func(t *testing.T, _ *apitest.Env, n *apitest.Node) {
			// Nothing is queued: the request only sweeps.
			nodeCall[wire.LeaseResponse](t, n, "lease", wire.PathLease, wire.LeaseRequest{SupportedJobTypes: []string{"status_check"}}, http.StatusOK)
		}},
		{"complete", nil},
	}
	onDialects(t, func(t *testing.T, dialect string) {
		for _, sw := range sweeps {
			t.Run(sw.name, func(t *testing.T) {
				t.Parallel()
				env, n := boundsEnv(t, dialect)
				gpuJob(t, env, nil)
				id, tok := runOne(t, n, "status_check")
				path := func(action string) string { return wire.JobPath(id, action) }
				for range 3 {
					env.Clock.Advance(5 * time.Minute)
					if hb := beat(t, n, id); len(hb.Leases) != 1 || len(hb.CancelJobs) != 0 {
						t.Fatalf("heartbeat before the cancel: %+v", hb)
					}
				}
				mustOp(t, env, http.StatusOK, http.MethodPost, "/operator/jobs/"+id+"/cancel", nil)
				deadline := env.Job(t, id).Lease.ExpiresAt
				if want := env.Clock.Now().Add(workerapi.DefaultCancelGrace); deadline.After(want) || deadline.Before(want.Add(-5*time.Second)) {
					t.Fatalf("after the cancel the lease expires at %v, want about %v", deadline, want)
				}

				// Within the grace the worker is told to stop, and its
				// lease is not extended.
				env.Clock.Advance(30 * time.Second)
				hb := beat(t, n, id)
				if len(hb.CancelJobs) != 1 || hb.CancelJobs[0] != id || len(hb.Leases) != 1 || !hb.Leases[0].ExpiresAt.Equal(deadline) {
					t.Fatalf("heartbeat within the grace: %+v; want the job to cancel, expiring at %v", hb, deadline)
				}
				st := nodeCall[wire.StatusResponse](t, n, "status", path(wire.ActionStatus), wire.StatusRequest{LeaseToken: tok, EventType: "progress"}, http.StatusOK)
				if !st.CancelRequested || !st.ExpiresAt.Equal(deadline) {
					t.Fatalf("status within the grace: %+v; want cancel_requested, expiring at %v", st, deadline)
				}

				// Past the grace the lease is revoked, for hours of
				// heartbeats.
				env.Clock.Advance(31 * time.Second)
				for h := 0; h < 64; h += 8 {
					hb := beat(t, n, id)
					if len(hb.LostJobs) != 1 || hb.LostJobs[0] != id || len(hb.Leases) != 0 {
						t.Fatalf("heartbeat %d h after the grace: %+v; want the job lost", h, hb)
					}
					refusedUnchanged(t, env, n, "status after the grace", path(wire.ActionStatus),
						wire.StatusRequest{LeaseToken: tok, EventType: "progress"}, http.StatusConflict, wire.CodeLeaseLost)
					env.Clock.Advance(8 * time.Hour)
				}
				failed := kindCount(t, env, receipts.KindJobFailed)
				if sw.sweep != nil {
					// The revocation's end is a job_failed receipt, as
					// every lease's end is: outcome canceled, error_code
					// lease_expired, the attempt's GPU time uncharged.
					sw.sweep(t, env, n)
					j := env.Job(t, id)
					if j.State != lease.StateCanceled || j.ReceiptID == "" {
						t.Fatalf("swept by the %s: %s, receipt %q; want canceled with a receipt", sw.name, j.State, j.ReceiptID)
					}
					if r := receiptOf(t, env, j.ReceiptID); r.Kind != receipts.KindJobFailed || r.Outcome != receipts.OutcomeCanceled ||
						r.ErrorCode != "lease_expired" || r.JobID != id || r.LeaseID != j.Lease.ID || r.Charged != receipts.ChargedNo ||
						r.ActualMS == 0 || r.StartedAt.IsZero() {
						t.Fatalf("receipt of the revocation: %+v", r)
					}
					failed++
					refusedUnchanged(t, env, n, "complete after the revocation", path(wire.ActionComplete),
						wire.CompleteRequest{LeaseToken: tok, FinalMessage: ptr("done")}, http.StatusConflict, wire.CodeJobCanceled)
				} else {
					// The late complete sweeps it itself: the job ends
					// canceled, with a job_failed receipt, and 409.
					st, b := post(t, n, path(wire.ActionComplete), wire.CompleteRequest{LeaseToken: tok, FinalMessage: ptr("done")})
					wantErr(t, st, b, http.StatusConflict, wire.CodeJobCanceled)
					j := env.Job(t, id)
					if j.State != lease.StateCanceled || j.ReceiptID == "" || j.Result != nil {
						t.Fatalf("after the late complete: %+v", j)
					}
					if r := receiptOf(t, env, j.ReceiptID); r.Kind != receipts.KindJobFailed || r.Outcome != receipts.OutcomeCanceled ||
						r.ErrorCode != "completed" || r.JobID != id || r.LeaseID != j.Lease.ID {
						t.Fatalf("receipt of the late complete: %+v", r)
					}
					failed++
				}
				if got := kindCount(t, env, receipts.KindJobFailed); got != failed {
					t.Errorf("job_failed receipts: %d, want %d", got, failed)
				}
				if n := kindCount(t, env, receipts.KindJobCharged); n != 0 {
					t.Fatalf("%d job_charged receipts for a canceled job", n)
				}
				// Whatever the worker sends now changes nothing.
				refusedUnchanged(t, env, n, "complete again", path(wire.ActionComplete),
					wire.CompleteRequest{LeaseToken: tok}, http.StatusConflict, wire.CodeJobCanceled)
				refusedUnchanged(t, env, n, "fail after the revocation", path(wire.ActionFail),
					wire.FailRequest{LeaseToken: tok, ErrorCode: "x"}, http.StatusConflict, wire.CodeLeaseLost)
				refusedUnchanged(t, env, n, "release after the revocation", path(wire.ActionRelease),
					wire.ReleaseRequest{LeaseToken: tok}, http.StatusConflict, wire.CodeLeaseLost)
			})
		}
	})
}

// A complete within the grace ends the job canceled at once, uncharged:
// the one refusal that changes state.
func TestCompleteAfterCancel(t *testing.T) {
	t.Parallel()
	onDialects(t, func(t *testing.T, dialect string) {
		hooks := &opHookLog{}
		env, n := boundsEnv(t, dialect, apitest.Started(), apitest.WithConfig(func(c *workerapi.Config) { c.Hooks = hooks }))
		for _, accepted := range []bool{true, false} {
			gpuJob(t, env, nil)
			var id, tok string
			if accepted {
				id, tok = runOne(t, n, "status_check")
			} else {
				id, tok = leaseOne(t, n, "status_check")
			}
			path := func(action string) string { return wire.JobPath(id, action) }
			// Half the accept timeout: the maintainer, which runs
			// meanwhile, must not end the unaccepted lease at accept_by.
			env.Clock.Advance(workerapi.DefaultAcceptTimeout / 2)
			mustOp(t, env, http.StatusOK, http.MethodPost, "/operator/jobs/"+id+"/cancel", nil)
			env.Clock.Advance(time.Second)
			charged := kindCount(t, env, receipts.KindJobCharged)
			st, b := post(t, n, path(wire.ActionComplete), wire.CompleteRequest{LeaseToken: tok, OutputURI: ptr("s3://out"), FinalMessage: ptr("done")})
			wantErr(t, st, b, http.StatusConflict, wire.CodeJobCanceled)
			j := env.Job(t, id)
			if j.State != lease.StateCanceled || j.FinishedAt == nil || j.Result != nil || j.ReceiptID == "" {
				t.Fatalf("accepted %v: complete after the cancel left %+v", accepted, j)
			}
			r := receiptOf(t, env, j.ReceiptID)
			if r.Kind != receipts.KindJobFailed || r.Outcome != receipts.OutcomeCanceled || r.ErrorCode != "completed" ||
				r.StartedAt.IsZero() == accepted || r.LeaseEpoch != j.Lease.Epoch {
				t.Fatalf("accepted %v: receipt %+v", accepted, r)
			}
			if got := kindCount(t, env, receipts.KindJobCharged); got != charged {
				t.Fatalf("accepted %v: a canceled job was charged", accepted)
			}
			// The change committed although the answer is an error: its
			// hook is delivered, and the operator sees the job canceled.
			from := lease.StateLeased
			if accepted {
				from = lease.StateRunning
			}
			hooks.waitFor(t, "JobChanged of the canceled complete", func() bool {
				for _, e := range hooks.jobs {
					if e.Job.ID == id && e.From == from && e.Job.State == lease.StateCanceled {
						return true
					}
				}
				return false
			})
			if job := mustOp(t, env, http.StatusOK, http.MethodGet, "/operator/jobs/"+id, nil)["job"].(obj); job["state"] != "canceled" {
				t.Fatalf("operator view: %v", job)
			}
			// The maintainer sequences receipts meanwhile: let it finish
			// before the state is compared.
			if _, err := env.Server.Sequence(context.Background()); err != nil {
				t.Fatal(err)
			}
			refusedUnchanged(t, env, n, "complete again", path(wire.ActionComplete),
				wire.CompleteRequest{LeaseToken: tok}, http.StatusConflict, wire.CodeJobCanceled)
			refusedUnchanged(t, env, n, "status after the canceled complete", path(wire.ActionStatus),
				wire.StatusRequest{LeaseToken: tok, EventType: "progress"}, http.StatusConflict, wire.CodeInvalidTransition)
			if hb := beat(t, n, id); len(hb.LostJobs) != 1 {
				t.Fatalf("heartbeat after the canceled complete: %+v", hb)
			}
		}
	})
}

// requirements.max_runtime_seconds caps every extension and ends the job
// failed, max_runtime_exceeded, when reached; it is validated at dispatch.
func TestMaxRuntimeEnforced(t *testing.T) {
	t.Parallel()
	onDialects(t, func(t *testing.T, dialect string) {
		env, n := boundsEnv(t, dialect)
		for name, req := range map[string]string{
			"negative":     `{"job_type":"status_check","requirements":{"max_runtime_seconds":-1}}`,
			"over 30 days": `{"job_type":"status_check","requirements":{"max_runtime_seconds":2592001}}`,
			"a string":     `{"job_type":"status_check","requirements":{"max_runtime_seconds":"1h"}}`,
			"fractional":   `{"job_type":"status_check","requirements":{"max_runtime_seconds":1.5}}`,
		} {
			before := env.Dump(t)
			st, m := op(t, env, http.MethodPost, "/operator/jobs", req)
			wantOpError(t, name, st, m, http.StatusBadRequest, wire.CodeInvalidRequest)
			stateUnchanged(t, env, "dispatch "+name, before)
		}
		if j := dispatchJob(t, env, obj{"job_type": "telemetry_sync", "requirements": obj{"max_runtime_seconds": wire.MaxRuntimeSeconds}})["job"].(obj); j["requirements"].(obj)["max_runtime_seconds"] != float64(wire.MaxRuntimeSeconds) {
			t.Fatalf("dispatch at the limit: %v", j)
		}

		id := gpuJob(t, env, obj{"max_runtime_seconds": 3600})
		lid, tok := leaseOne(t, n, "status_check")
		if lid != id {
			t.Fatalf("leased %s, want %s", lid, id)
		}
		path := func(action string) string { return wire.JobPath(id, action) }
		acc := nodeCall[wire.AcceptResponse](t, n, "accept", path(wire.ActionAccept), wire.TokenRequest{LeaseToken: tok}, http.StatusOK)
		if acc.Job.Requirements.MaxRuntimeSeconds != 3600 || acc.Job.AcceptedAt == nil {
			t.Fatalf("accept: %+v", acc.Job)
		}
		end := acc.Job.AcceptedAt.Add(time.Hour)
		for i := 1; i <= 11; i++ {
			env.Clock.Advance(5 * time.Minute)
			hb := beat(t, n, id)
			if len(hb.Leases) != 1 || hb.Leases[0].ExpiresAt.After(end) {
				t.Fatalf("heartbeat at %d min: %+v; want the lease to end by %v", 5*i, hb, end)
			}
		}
		st := nodeCall[wire.StatusResponse](t, n, "status", path(wire.ActionStatus), wire.StatusRequest{LeaseToken: tok, EventType: "progress"}, http.StatusOK)
		if !st.ExpiresAt.Equal(end) {
			t.Fatalf("status 55 min in: expires at %v, want the max runtime's end %v", st.ExpiresAt, end)
		}
		env.Clock.Advance(end.Sub(env.Clock.Now()) + time.Second)
		if hb := beat(t, n, id); len(hb.LostJobs) != 1 || len(hb.Leases) != 0 {
			t.Fatalf("heartbeat past the max runtime: %+v", hb)
		}
		refusedUnchanged(t, env, n, "complete past the max runtime", path(wire.ActionComplete),
			wire.CompleteRequest{LeaseToken: tok}, http.StatusConflict, wire.CodeLeaseLost)
		if err := env.Server.MaintainOnce(context.Background()); err != nil {
			t.Fatal(err)
		}
		job := mustOp(t, env, http.StatusOK, http.MethodGet, "/operator/jobs/"+id, nil)["job"].(obj)
		if le, _ := job["last_error"].(obj); job["state"] != "failed" || le["code"] != wire.CodeMaxRuntimeExceeded || job["attempt"] != float64(1) {
			t.Fatalf("job past its max runtime: %v", job)
		}
		if n := kindCount(t, env, receipts.KindJobCharged); n != 0 {
			t.Fatalf("%d job_charged receipts", n)
		}
		refusedUnchanged(t, env, n, "complete after the revocation", path(wire.ActionComplete),
			wire.CompleteRequest{LeaseToken: tok}, http.StatusConflict, wire.CodeLeaseLost)
		refusedUnchanged(t, env, n, "fail after the revocation", path(wire.ActionFail),
			wire.FailRequest{LeaseToken: tok}, http.StatusConflict, wire.CodeLeaseLost)

		// Lazily: a lease request sweeps a lease at its max runtime.
		id2 := gpuJob(t, env, obj{"max_runtime_seconds": 60})
		if got, _ := runOne(t, n, "status_check"); got != id2 {
			t.Fatalf("ran %s, want %s", got, id2)
		}
		env.Clock.Advance(time.Minute)
		nodeCall[wire.LeaseResponse](t, n, "lease", wire.PathLease, wire.LeaseRequest{SupportedJobTypes: []string{"status_check"}}, http.StatusOK)
		if j := env.Job(t, id2); j.State != lease.StateFailed || j.LastError == nil || j.LastError.Code != lease.CodeMaxRuntimeExceeded {
			t.Fatalf("swept by a lease request: %+v", j)
		}
	})
}

// A job without max_runtime_seconds runs for Config.Lease.MaxRuntime at most.
func TestMaxRuntimeDefault(t *testing.T) {
	t.Parallel()
	env := newOpEnv(t, "sqlite", apitest.WithConfig(func(c *workerapi.Config) { c.Lease.MaxRuntime = 20 * time.Minute }))
	n := opGPUNode(t, env, "studio-gpu-1", 4)
	id := gpuJob(t, env, nil)
	_, tok := runOne(t, n, "status_check")
	for range 3 {
		env.Clock.Advance(5 * time.Minute)
		beat(t, n, id)
	}
	env.Clock.Advance(5 * time.Minute)
	refusedUnchanged(t, env, n, "status at the default max runtime", wire.JobPath(id, wire.ActionStatus),
		wire.StatusRequest{LeaseToken: tok, EventType: "progress"}, http.StatusConflict, wire.CodeLeaseLost)
	if err := env.Server.MaintainOnce(context.Background()); err != nil {
		t.Fatal(err)
	}
	if j := env.Job(t, id); j.State != lease.StateFailed || j.LastError.Code != lease.CodeMaxRuntimeExceeded {
		t.Fatalf("job past the default max runtime: %s %+v", j.State, j.LastError)
	}
}

// The wire's limit is the lease package's.
func TestMaxRuntimeLimit(t *testing.T) {
	t.Parallel()
	if time.Duration(wire.MaxRuntimeSeconds)*time.Second != lease.MaxRuntimeLimit {
		t.Fatalf("wire.MaxRuntimeSeconds %d s, lease.MaxRuntimeLimit %v", wire.MaxRuntimeSeconds, lease.MaxRuntimeLimit)
	}
	if wire.CodeMaxRuntimeExceeded != lease.CodeMaxRuntimeExceeded {
		t.Fatalf("wire.CodeMaxRuntimeExceeded %q, lease's %q", wire.CodeMaxRuntimeExceeded, lease.CodeMaxRuntimeExceeded)
	}
}
