package workerapi_test

import (
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"testing"

	"github.com/nodelane/nodelane/credential"
	"github.com/nodelane/nodelane/internal/apitest"
	"github.com/nodelane/nodelane/lease"
	"github.com/nodelane/nodelane/receipts"
	"github.com/nodelane/nodelane/workerapi"
	"github.com/nodelane/nodelane/workerapi/wire"
)

// Least privilege for nodes over real HTTP: a node is granted only the
// job types it registered, never more live leases than the control
// plane's cap, and nothing while it awaits an operator's approval.

// typedNode registers a CPU node that runs types, at most maxJobs at once.
func typedNode(t *testing.T, env *apitest.Env, nodeID string, maxJobs int, types ...string) (*apitest.Node, wire.RegisterResponse) {
	t.Helper()
	n := env.NewNode(t, nodeID)
	n.Now = env.Clock.Now
	resp := n.Register(t, wire.RegisterRequest{
		Name: nodeID, Capabilities: wire.Capabilities{GPUs: []wire.GPU{{SKU: "rtx-4090", VRAMMB: 24576}}, JobTypes: types},
		GovernorLimits: wire.GovernorLimits{MaxJobs: maxJobs},
	})
	return n, resp
}

// emptyLease sends a lease request that must grant nothing, checks that
// it changed no state, and returns its message.
func emptyLease(t *testing.T, env *apitest.Env, n *apitest.Node, body obj) string {
	t.Helper()
	before := env.Dump(t)
	m := signedCall(t, n, http.StatusOK, "/workers/jobs/lease", body)
	if m["lease_token"] != nil || m["job"] != nil || len(m["leases"].([]any)) != 0 {
		t.Fatalf("lease %v granted %v", body, m)
	}
	stateUnchanged(t, env, "an empty lease", before)
	return m["message"].(string)
}

func wantContains(t *testing.T, what, got, want string) {
	t.Helper()
	if !strings.Contains(got, want) {
		t.Errorf("%s: %q does not say %q", what, got, want)
	}
}

// The first attack of the issue: a node registered for status_check asks
// for telemetry_sync, and must neither lease the job nor see its payload.
func TestLeaseNarrowsRegisteredTypes(t *testing.T) {
	t.Parallel()
	onDialects(t, func(t *testing.T, dialect string) {
		env := newOpEnv(t, dialect)
		n, _ := typedNode(t, env, "status-only", 4, "status_check")
		secret := dispatchJob(t, env, obj{"job_type": "telemetry_sync", "payload": obj{"secret": "s3://telemetry/keys"}})["job"].(obj)["id"].(string)
		h100 := dispatchJob(t, env, obj{"job_type": "status_check", "requirements": obj{"gpu_sku": "h100"}})["job"].(obj)["id"].(string)

		msg := emptyLease(t, env, n, obj{"supported_job_types": []string{"telemetry_sync"}, "max_jobs": 5})
		wantContains(t, "asking for an unregistered type", msg, `ignored job types the worker did not register: "telemetry_sync"`)
		msg = emptyLease(t, env, n, obj{"supported_job_types": []string{"telemetry_sync", "raw_training"}, "wait_seconds": 1})
		wantContains(t, "asking for two unregistered types", msg, `ignored job types the worker did not register: "telemetry_sync", "raw_training"`)
		// GPU SKUs count only among the registered GPUs.
		msg = emptyLease(t, env, n, obj{"supported_gpu_skus": []string{"h100"}})
		wantContains(t, "offering an unregistered SKU", msg, "no eligible job")
		for _, id := range []string{secret, h100} {
			if j := env.Job(t, id); j.State != lease.StateQueued || j.Lease != nil {
				t.Errorf("job %s: %s, lease %v", id, j.State, j.Lease)
			}
		}

		// Asking for both leases only the registered one.
		mine := dispatchJob(t, env, obj{"job_type": "status_check"})["job"].(obj)["id"].(string)
		m := signedCall(t, n, http.StatusOK, "/workers/jobs/lease", obj{"supported_job_types": []string{"telemetry_sync", "status_check"}, "max_jobs": 5})
		ls := m["leases"].([]any)
		if len(ls) != 1 || ls[0].(obj)["job"].(obj)["id"] != mine {
			t.Fatalf("asking for both leased %v, want only %s", ls, mine)
		}
		if j := env.Job(t, secret); j.State != lease.StateQueued {
			t.Errorf("the telemetry_sync job is %s", j.State)
		}

		// A heartbeat's capabilities are what the node registers now.
		signedCall(t, n, http.StatusOK, "/workers/heartbeat", obj{"status": "idle",
			"capabilities": obj{"gpus": []obj{}, "job_types": []string{"status_check", "telemetry_sync"}}})
		id, _ := leaseOne(t, n, "telemetry_sync")
		if id != secret {
			t.Errorf("after registering telemetry_sync, leased %s, want %s", id, secret)
		}
	})
}

// The second attack: a node that sets its own governor far above the
// control plane's cap leases at most the cap, however often it asks.
func TestLeaseCapPerWorker(t *testing.T) {
	t.Parallel()
	t.Run("DefaultCap", func(t *testing.T) {
		t.Parallel()
		onDialects(t, testDefaultLeaseCap)
	})
	t.Run("HostCap", func(t *testing.T) {
		t.Parallel()
		onDialects(t, testHostLeaseCap)
	})
}

func testDefaultLeaseCap(t *testing.T, dialect string) {
	env := newOpEnv(t, dialect)
	// 256 is the most governor_limits.max_jobs a node may register
	// with; any value above the cap is the attack.
	greedy, _ := typedNode(t, env, "greedy", 256, "status_check")
	for range 100 {
		env.Enqueue(t, lease.NewJob{Type: "status_check"})
	}
	total := 0
	for range 5 {
		m := signedCall(t, greedy, http.StatusOK, "/workers/jobs/lease", obj{"max_jobs": wire.MaxJobsPerLease})
		total += len(m["leases"].([]any))
	}
	if total != workerapi.DefaultMaxLeasesPerWorker {
		t.Fatalf("a node with max_jobs 256 leased %d of 100 jobs, want the cap of %d", total, workerapi.DefaultMaxLeasesPerWorker)
	}
	msg := emptyLease(t, env, greedy, obj{"max_jobs": 1})
	wantContains(t, "at the cap", msg, "the control plane allows any worker 16, below its governor's max_jobs of 256")
	w := mustOp(t, env, http.StatusOK, "GET", "/operator/workers/"+greedy.WorkerID, nil)["worker"].(obj)
	if w["max_leases"] != float64(workerapi.DefaultMaxLeasesPerWorker) {
		t.Errorf("max_leases = %v", w["max_leases"])
	}
	if queued := len(mustOp(t, env, http.StatusOK, "GET", "/operator/jobs?state=queued&limit=1000", nil)["jobs"].([]any)); queued != 100-total {
		t.Errorf("%d jobs queued, want %d", queued, 100-total)
	}
}

// The host's cap, and a governor below it.
func testHostLeaseCap(t *testing.T, dialect string) {
	env := newOpEnv(t, dialect, apitest.WithConfig(func(c *workerapi.Config) { c.Lease.MaxLeasesPerWorker = 3 }))
	big, _ := typedNode(t, env, "big", 100, "status_check")
	small, _ := typedNode(t, env, "small", 2, "status_check")
	for range 10 {
		env.Enqueue(t, lease.NewJob{Type: "status_check"})
	}
	for _, c := range []struct {
		n    *apitest.Node
		want int
	}{{big, 3}, {small, 2}} {
		got := 0
		for range 2 {
			got += len(signedCall(t, c.n, http.StatusOK, "/workers/jobs/lease", obj{"max_jobs": 10})["leases"].([]any))
		}
		if got != c.want {
			t.Errorf("%s leased %d, want %d", c.n.NodeID, got, c.want)
		}
		if w := mustOp(t, env, http.StatusOK, "GET", "/operator/workers/"+c.n.WorkerID, nil)["worker"].(obj); w["max_leases"] != float64(c.want) {
			t.Errorf("%s: max_leases = %v, want %d", c.n.NodeID, w["max_leases"], c.want)
		}
	}
}

// With ApproveNodes, a new node registers pending and leases nothing
// until an operator approves it; approvals mint receipts, and pinned job
// types narrow leasing further.
func TestApproveNodes(t *testing.T) {
	t.Parallel()
	onDialects(t, func(t *testing.T, dialect string) {
		env := newOpEnv(t, dialect, apitest.WithConfig(func(c *workerapi.Config) { c.ApproveNodes = true }))
		n, reg := typedNode(t, env, "new-node", 4, "status_check", "telemetry_sync")
		if reg.Status != wire.RegisterStatusPending {
			t.Fatalf("register status = %q, want pending", reg.Status)
		}
		path := "/operator/workers/" + n.WorkerID + "/approve"
		job := dispatchJob(t, env, obj{"job_type": "status_check"})
		if job["leasable"] != false || job["reason"] != "every worker that can run it awaits an operator's approval (1 pending, 0 banned)" {
			t.Errorf("dispatch with only a pending node: %v", job)
		}
		jobID := job["job"].(obj)["id"].(string)

		// Pending: it heartbeats, but leases nothing, even asking.
		signedCall(t, n, http.StatusOK, "/workers/heartbeat", obj{"status": "idle"})
		for _, body := range []obj{{}, {"supported_job_types": []string{"status_check"}, "max_jobs": 5}} {
			msg := emptyLease(t, env, n, body)
			if msg != "no eligible job: the worker awaits an operator's approval" {
				t.Errorf("pending lease message = %q", msg)
			}
		}
		w := mustOp(t, env, http.StatusOK, "GET", "/operator/workers/"+n.WorkerID, nil)["worker"].(obj)
		if w["approval"] != wire.ApprovalPending || w["approved_at"] != nil || w["approved_by"] != nil || len(w["approved_job_types"].([]any)) != 0 {
			t.Errorf("pending worker view = %v", w)
		}
		// Registering again keeps it pending.
		if again := n.Register(t, wire.RegisterRequest{Capabilities: wire.Capabilities{JobTypes: []string{"status_check", "telemetry_sync"}},
			GovernorLimits: wire.GovernorLimits{MaxJobs: 4}}); again.Status != wire.RegisterStatusPending {
			t.Errorf("registering again: status %q", again.Status)
		}
		emptyLease(t, env, n, obj{})

		// Refused approvals change nothing.
		jobsOnly, _ := env.Credential(t, apitest.OperatorID, credential.ScopeOperatorJobs)
		before := env.Dump(t)
		st, m := opCall(t, env, jobsOnly, "POST", path, obj{})
		wantOpError(t, "approve without operator:workers", st, m, http.StatusForbidden, wire.CodeInsufficientScope)
		st, m = opCall(t, env, n.Token, "POST", path, obj{})
		wantOpError(t, "approve with the node's own token", st, m, http.StatusForbidden, wire.CodeInsufficientScope)
		st, m = op(t, env, "POST", "/operator/workers/wrk_nope/approve", obj{})
		wantOpError(t, "approve an unknown worker", st, m, http.StatusNotFound, wire.CodeNotFound)
		for name, body := range map[string]any{
			"empty job_types":     obj{"job_types": []string{}},
			"empty tags":          obj{"tags": []string{}},
			"a type with a space": obj{"job_types": []string{"status check"}},
			"an empty tag":        obj{"tags": []string{""}},
			"a long type":         obj{"job_types": []string{strings.Repeat("t", wire.MaxApprovalPinBytes+1)}},
			"too many tags":       obj{"tags": make([]string, wire.MaxApprovalPins+1)},
			"a long reason":       obj{"reason": strings.Repeat("r", wire.MaxApprovalReasonBytes+1)},
			"job_types not array": obj{"job_types": "status_check"},
			"an unknown field":    obj{"approved": true},
		} {
			st, m := op(t, env, "POST", path, body)
			wantOpError(t, name, st, m, http.StatusBadRequest, wire.CodeInvalidRequest)
		}
		stateUnchanged(t, env, "refused approvals", before)

		// A lease waiting when the approval commits gets the job.
		var (
			wg     sync.WaitGroup
			waited obj
		)
		wg.Add(1)
		go func() {
			defer wg.Done()
			resp, b := n.Do(t, http.MethodPost, "/workers/jobs/lease", obj{"wait_seconds": 10})
			if resp.StatusCode == http.StatusOK {
				json.Unmarshal(b, &waited)
			}
		}()
		env.AwaitLongPolls(t, 1)
		count := env.Receipts(t)
		m = mustOp(t, env, http.StatusOK, "POST", path, "")
		exactKeys(t, "approve", m, "worker", "receipt_id")
		w = m["worker"].(obj)
		if w["approval"] != wire.ApprovalApproved || w["approved_by"] != apitest.OperatorID || w["approved_at"] == nil ||
			fmt.Sprint(w["approved_job_types"]) != "[status_check telemetry_sync]" || len(w["approved_tags"].([]any)) != 0 ||
			len(w["pending_job_types"].([]any)) != 0 {
			// Pinning nothing covers what the node registered (so that a
			// widening it registers later is pending).
			t.Errorf("approved worker = %v", w)
		}
		r := logReceipt(t, env, m["receipt_id"].(string))
		if r.Kind != receipts.KindWorkerApproved || r.WorkerID != n.WorkerID || r.NodeID != "new-node" || r.Actor != apitest.OperatorID ||
			r.JobTypes != "status_check telemetry_sync" || r.Tags != "" || r.Reason != "" {
			t.Errorf("approval receipt = %+v", r)
		}
		if got := env.Receipts(t); got != count+1 {
			t.Errorf("receipts: %d, want %d", got, count+1)
		}
		wg.Wait()
		if waited == nil || waited["job"] == nil || waited["job"].(obj)["id"] != jobID {
			t.Fatalf("the waiting lease got %v, want job %s", waited, jobID)
		}

		// Approving again with the same (no) pins changes nothing.
		before = env.Dump(t)
		m = mustOp(t, env, http.StatusOK, "POST", path, obj{"reason": "again"})
		if m["receipt_id"] != nil || m["worker"].(obj)["approval"] != wire.ApprovalApproved {
			t.Errorf("approve again: %v", m)
		}
		stateUnchanged(t, env, "a repeated approval", before)

		// Pinned types narrow leasing: telemetry_sync only.
		m = mustOp(t, env, http.StatusOK, "POST", path, obj{"job_types": []string{"telemetry_sync", "lora_train", "telemetry_sync"}, "tags": []string{"lab", "eu"}, "reason": "telemetry box"})
		w = m["worker"].(obj)
		if m["receipt_id"] == nil || !sameStrings(w["approved_job_types"], "lora_train", "telemetry_sync") || !sameStrings(w["approved_tags"], "eu", "lab") {
			t.Fatalf("pinned approval = %v", m)
		}
		r = logReceipt(t, env, m["receipt_id"].(string))
		if r.Kind != receipts.KindWorkerApproved || r.JobTypes != "lora_train telemetry_sync" || r.Tags != "eu lab" || r.Reason != "telemetry box" {
			t.Errorf("pinned approval receipt = %+v", r)
		}
		sc := dispatchJob(t, env, obj{"job_type": "status_check"})["job"].(obj)["id"].(string)
		msg := emptyLease(t, env, n, obj{"supported_job_types": []string{"status_check"}})
		wantContains(t, "a type the approval leaves out", msg, `ignored job types the worker's approval does not include: "status_check"`)
		tel := dispatchJob(t, env, obj{"job_type": "telemetry_sync"})["job"].(obj)["id"].(string)
		ls := signedCall(t, n, http.StatusOK, "/workers/jobs/lease", obj{"max_jobs": 5})["leases"].([]any)
		if len(ls) != 1 || ls[0].(obj)["job"].(obj)["id"] != tel {
			t.Fatalf("under pins leased %v, want only %s", ls, tel)
		}
		if j := env.Job(t, sc); j.State != lease.StateQueued {
			t.Errorf("the status_check job is %s", j.State)
		}

		// A node registered before approvals were required is not pending
		// on a replica that requires them; one registered there is.
		off := *env
		off.Config.ApproveNodes = false
		plain, reg := typedNode(t, off.Replica(t), "plain", 1, "status_check")
		if reg.Status != "registered" {
			t.Errorf("register without approvals: status %q", reg.Status)
		}
		if w := mustOp(t, env, http.StatusOK, "GET", "/operator/workers/"+plain.WorkerID, nil)["worker"].(obj); w["approval"] != wire.ApprovalNotRequired {
			t.Errorf("worker registered without approvals: approval %v", w["approval"])
		}
		if id, _ := leaseOne(t, plain.On(env), "status_check"); id != sc {
			t.Errorf("the plain node leased %s, want %s", id, sc)
		}
	})
}

func sameStrings(v any, want ...string) bool {
	got, _ := v.([]any)
	if len(got) != len(want) {
		return false
	}
	for i := range got {
		if got[i] != want[i] {
			return false
		}
	}
	return true
}

// The wire limits of an approval are the lease core's, which checks them
// again.
func TestApprovalLimitsAgree(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		name       string
		wire, core int
	}{
		{"pins", wire.MaxApprovalPins, lease.MaxPins},
		{"pin bytes", wire.MaxApprovalPinBytes, lease.MaxPinLen},
		{"reason bytes", wire.MaxApprovalReasonBytes, lease.MaxApprovalReason},
		{"default cap", workerapi.DefaultMaxLeasesPerWorker, lease.DefaultMaxLeasesPerWorker},
	} {
		if c.wire != c.core {
			t.Errorf("%s: wire %d, lease %d", c.name, c.wire, c.core)
		}
	}
}

// TestConcurrentApprovals checks that approvals of one worker at once are ordered.
// Of identical ones, one changes the approval and mints a receipt, the
// others see it and change nothing; of ones with different pins, the
// approval that stands is the one the last receipt records.
func TestConcurrentApprovals(t *testing.T) {
	t.Parallel()
	onDialects(t, func(t *testing.T, d string) {
		env := apitest.New(t, d, apitest.WithConfig(func(c *workerapi.Config) { c.ApproveNodes = true }))
		_, reg := typedNode(t, env, "gpu-approve", 4, "status_check")
		const n = 8
		approveAll := func(tags func(i int) string) (minted int) {
			var (
				wg sync.WaitGroup
				mu sync.Mutex
			)
			for i := range n {
				wg.Go(func() {
					st, b := env.Operator(t, "POST", "/operator/workers/"+reg.WorkerID+"/approve", obj{"tags": []string{tags(i)}})
					if st != http.StatusOK {
						t.Errorf("approval %d: %d %s", i, st, b)
						return
					}
					if decode[wire.WorkerResponse](t, b).ReceiptID != nil {
						mu.Lock()
						minted++
						mu.Unlock()
					}
				})
			}
			wg.Wait()
			return minted
		}
		if m := approveAll(func(int) string { return "pool-a" }); m != 1 {
			t.Errorf("%d identical approvals at once minted %d receipts, want 1", n, m)
		}
		approveAll(func(i int) string { return fmt.Sprintf("pool-%d", i) })
		last := lastReceipt(t, env, receipts.KindWorkerApproved, reg.WorkerID)
		w := decode[wire.WorkerDetailResponse](t, mustGet(t, env, "/operator/workers/"+reg.WorkerID))
		if got := strings.Join(w.Worker.ApprovedTags, " "); got != last.Tags {
			t.Fatalf("the approval that stands pins tags %q; the last receipt records %q", got, last.Tags)
		}
	})
}
