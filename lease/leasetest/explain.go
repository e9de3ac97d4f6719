package leasetest

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"

	"github.com/nodelane/nodelane/lease"
)

// explainTests are the tests of Manager.Explain and Manager.ExplainLease:
// every reason code, each in a case that fails if it is computed wrong.
var explainTests = []test{
	{"NotQueued", testExplainNotQueued},
	{"Scheduled", testExplainScheduled},
	{"NoWorker", testExplainNoWorker},
	{"Matching", testExplainMatching},
	{"MaxJobs", testExplainMaxJobs},
	{"Banned", testExplainBanned},
	{"LeaseTypes", testExplainLeaseTypes},
	{"LeaseFit", testExplainLeaseFit},
	{"LeaseWorker", testExplainLeaseWorker},
}

func (f *fixture) explain(id string, opts *lease.ExplainOptions) *lease.Explanation {
	f.t.Helper()
	ex, err := f.m.Explain(f.ctx, id, opts)
	if err != nil {
		f.t.Fatalf("Explain(%s): %v", id, err)
	}
	if ex.Job == nil || ex.Job.ID != id {
		f.t.Fatalf("Explain(%s) explained job %+v", id, ex.Job)
	}
	return ex
}

func (f *fixture) explainLease(req lease.LeaseRequest, opts *lease.ExplainOptions) *lease.LeaseExplanation {
	f.t.Helper()
	ex, err := f.m.ExplainLease(f.ctx, req, opts)
	if err != nil {
		f.t.Fatalf("ExplainLease(%s): %v", req.WorkerID, err)
	}
	if ex.Worker == nil || ex.Worker.ID != req.WorkerID {
		f.t.Fatalf("ExplainLease(%s) explained worker %+v", req.WorkerID, ex.Worker)
	}
	return ex
}

// wantExplained checks an explanation's verdict and its reasons, in order.
func wantExplained(t *testing.T, what string, ex *lease.Explanation, want ...lease.Reason) {
	t.Helper()
	if d := cmp.Diff(want, ex.Reasons, cmpopts.EquateEmpty()); d != "" {
		t.Errorf("%s: reasons (-want +got):\n%s", what, d)
	}
	if ex.Leasable != (len(want) == 0) {
		t.Errorf("%s: leasable = %v with reasons %v", what, ex.Leasable, ex.Reasons)
	}
}

// verdict finds the verdict on worker w.
func verdict(t *testing.T, ex *lease.Explanation, w *lease.Worker) lease.WorkerVerdict {
	t.Helper()
	for _, v := range ex.Workers {
		if v.WorkerID == w.ID {
			if v.NodeID != w.NodeID {
				t.Fatalf("verdict on %s names node %q, want %q", w.ID, v.NodeID, w.NodeID)
			}
			return v
		}
	}
	t.Fatalf("no verdict on worker %s (%s) among %d", w.ID, w.NodeID, len(ex.Workers))
	return lease.WorkerVerdict{}
}

func codes(rs []lease.Reason) []lease.ReasonCode {
	out := []lease.ReasonCode{}
	for _, r := range rs {
		out = append(out, r.Code)
	}
	return out
}

func testExplainNotQueued(t *testing.T, f *fixture) {
	w := f.defaultWorker("w")
	leased := f.enqueue("status_check")
	lj, _ := f.leaseOne(w)
	if lj.ID != leased.ID {
		t.Fatalf("leased %s, want %s", lj.ID, leased.ID)
	}
	running := f.enqueue("status_check")
	_, rref := f.leaseOne(w)
	f.accept(rref)
	done := f.enqueue("status_check")
	_, dref := f.leaseOne(w)
	f.accept(dref)
	f.complete(dref, lease.Result{})
	canceled := f.cancel(f.enqueue("status_check").ID)

	under := func(j *lease.Job) string {
		j = f.get(j.ID)
		return fmt.Sprintf("the job is %s under the lease of worker %s (epoch %d)", j.State, w.ID, j.Lease.Epoch)
	}
	cases := []struct {
		name string
		id   string
		want []lease.Reason
	}{
		{"leased", leased.ID, []lease.Reason{{Code: lease.ReasonJobLeased, Message: under(leased)}}},
		{"running", running.ID, []lease.Reason{{Code: lease.ReasonJobLeased, Message: under(running)}}},
		{"succeeded", done.ID, []lease.Reason{{Code: lease.ReasonJobFinished, Message: "the job ended succeeded"}}},
		{"canceled", canceled.ID, []lease.Reason{{Code: lease.ReasonJobFinished, Message: "the job ended canceled"}}},
	}
	for _, tc := range cases {
		ex := f.explain(tc.id, nil)
		wantExplained(t, tc.name, ex, tc.want...)
		if ex.Workers != nil {
			t.Errorf("%s: examined %d workers for a job that is not queued", tc.name, len(ex.Workers))
		}
	}

	// A requested cancel is one more reason, and only for a live job.
	f.cancel(running.ID)
	wantExplained(t, "running, cancel requested", f.explain(running.ID, nil),
		lease.Reason{Code: lease.ReasonJobLeased, Message: under(running)},
		lease.Reason{Code: lease.ReasonCancelRequested, Message: "its cancel was requested: the job ends canceled and is not leased again"})

	// A lease past its accept deadline still holds the job until an
	// expiry ends it; the reason says so.
	f.clock.Advance(acceptTTL)
	wantExplained(t, "leased past its accept deadline", f.explain(leased.ID, nil),
		lease.Reason{Code: lease.ReasonJobLeased, Message: under(leased) + "; the lease is past its deadline and the next expiry ends it"})
	wantExplained(t, "running within its TTL", f.explain(running.ID, nil),
		lease.Reason{Code: lease.ReasonJobLeased, Message: under(running)},
		lease.Reason{Code: lease.ReasonCancelRequested, Message: "its cancel was requested: the job ends canceled and is not leased again"})
	f.expire(1)
	wantExplained(t, "requeued by expiry", f.explain(leased.ID, nil))
	// Once the worker ends it, the requested cancel is no longer a reason.
	if j := f.fail(rref, lease.Failure{Code: "canceled"}); j.State != lease.StateCanceled || !j.CancelRequested {
		t.Fatalf("fail after a requested cancel: %s, cancel_requested %v", j.State, j.CancelRequested)
	}
	wantExplained(t, "canceled after a requested cancel", f.explain(running.ID, nil),
		lease.Reason{Code: lease.ReasonJobFinished, Message: "the job ended canceled"})

	_, err := f.m.Explain(f.ctx, "job_nobody", nil)
	wantErr(t, "Explain of an unknown job", err, lease.ErrNotFound)
}

func testExplainScheduled(t *testing.T, f *fixture) {
	w := f.defaultWorker("w")
	later := f.now().Add(time.Hour)
	delayed := f.enqueue("status_check", func(nj *lease.NewJob) { nj.ScheduledAt = later })
	ex := f.explain(delayed.ID, nil)
	wantExplained(t, "delayed", ex, lease.Reason{Code: lease.ReasonScheduled,
		Message: "scheduled for " + later.Format(time.RFC3339Nano) + ": not leasable before then"})
	if v := verdict(t, ex, w); !v.Available || len(v.Reasons) != 0 {
		t.Errorf("a worker free for a delayed job: %+v", v)
	}

	// A retry's backoff is named as one.
	retried := f.enqueue("lora_train", func(nj *lease.NewJob) { nj.Priority = 1 })
	_, ref := f.leaseOne(w)
	if ref.JobID != retried.ID {
		t.Fatalf("leased %s, want %s", ref.JobID, retried.ID)
	}
	f.accept(ref)
	fj := f.fail(ref, lease.Failure{Code: "oom", Retryable: true})
	if fj.State != lease.StateQueued || fj.Attempt != 2 || !fj.ScheduledAt.After(f.now()) {
		t.Fatalf("a retryable failure gave %s, attempt %d, scheduled %v", fj.State, fj.Attempt, fj.ScheduledAt)
	}
	wantExplained(t, "backoff", f.explain(retried.ID, nil), lease.Reason{Code: lease.ReasonScheduled,
		Message: "scheduled for " + fj.ScheduledAt.Format(time.RFC3339Nano) + " (a retry's backoff): not leasable before then"})

	// Due to the microsecond, and not before.
	f.clock.Advance(fj.ScheduledAt.Sub(f.now()) - time.Microsecond)
	if ex := f.explain(retried.ID, nil); ex.Leasable || len(ex.Reasons) != 1 || ex.Reasons[0].Code != lease.ReasonScheduled {
		t.Errorf("a microsecond before its backoff ends: %+v", ex.Reasons)
	}
	f.clock.Advance(time.Microsecond)
	wantExplained(t, "backoff over", f.explain(retried.ID, nil))
	if j, _ := f.leaseOne(w); j.ID != retried.ID {
		t.Fatalf("Lease took %s, the explanation said %s was leasable", j.ID, retried.ID)
	}
}

func testExplainNoWorker(t *testing.T, f *fixture) {
	j := f.enqueue("status_check")
	ex := f.explain(j.ID, nil)
	wantExplained(t, "no worker", ex, lease.Reason{Code: lease.ReasonNoWorker, Message: "no worker is registered"})
	if len(ex.Workers) != 0 || ex.Truncated {
		t.Errorf("workers %v, truncated %v", ex.Workers, ex.Truncated)
	}
	// A job scheduled later and without a worker has both reasons, the
	// worker first.
	later := f.now().Add(time.Minute)
	d := f.enqueue("status_check", func(nj *lease.NewJob) { nj.ScheduledAt = later })
	if got := codes(f.explain(d.ID, nil).Reasons); !cmp.Equal(got, []lease.ReasonCode{lease.ReasonNoWorker, lease.ReasonScheduled}) {
		t.Errorf("delayed, no worker: %v", got)
	}
}

func testExplainMatching(t *testing.T, f *fixture) {
	cpu := f.worker("cpu", nil, []string{"status_check"}, lease.Governor{MaxJobs: 4})
	small := f.worker("small", []lease.GPU{{SKU: "rtx-4090", VRAMMB: 24576}}, []string{"lora_train", "status_check"}, lease.Governor{MaxJobs: 4})
	big := f.worker("big", []lease.GPU{{SKU: "h100", VRAMMB: 81920}, {SKU: "h100", VRAMMB: 81920}, {SKU: "rtx-4090", VRAMMB: 24576}},
		[]string{"lora_train"}, lease.Governor{MaxJobs: 4, MaxVRAMMB: 40000})
	type want struct {
		code       lease.ReasonCode // "" when the worker matches
		gpus, vram int
	}
	cases := []struct {
		name    string
		typ     string
		req     lease.Requirements
		summary lease.Reason
		workers map[*lease.Worker]want
	}{
		{"unsupported type", "raw_training", lease.Requirements{},
			lease.Reason{Code: lease.ReasonJobType, Message: `no registered worker supports job type "raw_training"`},
			map[*lease.Worker]want{cpu: {code: lease.ReasonJobType}, small: {code: lease.ReasonJobType}, big: {code: lease.ReasonJobType}}},
		{"unknown SKU", "lora_train", lease.Requirements{GPUSKU: "a100"},
			lease.Reason{Code: lease.ReasonGPUSKU, Message: `no registered worker that supports lora_train has a GPU of SKU "a100"`},
			map[*lease.Worker]want{cpu: {code: lease.ReasonJobType}, small: {code: lease.ReasonGPUSKU}, big: {code: lease.ReasonGPUSKU}}},
		{"too many GPUs of the SKU", "lora_train", lease.Requirements{GPUSKU: "h100", GPUCount: 3},
			lease.Reason{Code: lease.ReasonGPUCount, Message: `no registered worker that supports lora_train has 3 GPUs of SKU "h100" (the most is 2)`},
			map[*lease.Worker]want{cpu: {code: lease.ReasonJobType}, small: {code: lease.ReasonGPUSKU}, big: {code: lease.ReasonGPUCount, gpus: 2}}},
		{"too many GPUs", "lora_train", lease.Requirements{GPUCount: 4},
			lease.Reason{Code: lease.ReasonGPUCount, Message: `no registered worker that supports lora_train has 4 GPUs (the most is 3)`},
			map[*lease.Worker]want{cpu: {code: lease.ReasonJobType}, small: {code: lease.ReasonGPUCount, gpus: 1}, big: {code: lease.ReasonGPUCount, gpus: 3}}},
		{"too little VRAM", "lora_train", lease.Requirements{GPUSKU: "rtx-4090", MinVRAMMB: 30000},
			lease.Reason{Code: lease.ReasonVRAM, Message: `no registered worker that supports lora_train has 1 GPUs of SKU "rtx-4090" with 30000 MiB of VRAM each, within its governor max_vram_mb (the most is 24576 MiB)`},
			map[*lease.Worker]want{cpu: {code: lease.ReasonJobType}, small: {code: lease.ReasonVRAM, gpus: 1, vram: 24576}, big: {code: lease.ReasonVRAM, gpus: 1, vram: 24576}}},
		{"VRAM over the governor", "lora_train", lease.Requirements{GPUCount: 1, MinVRAMMB: 50000},
			lease.Reason{Code: lease.ReasonMaxVRAM, Message: `no registered worker that supports lora_train has 1 GPUs with 50000 MiB of VRAM each, within its governor max_vram_mb (the most is 40000 MiB)`},
			map[*lease.Worker]want{cpu: {code: lease.ReasonJobType}, small: {code: lease.ReasonVRAM, gpus: 1, vram: 24576}, big: {code: lease.ReasonMaxVRAM, gpus: 3, vram: 40000}}},
		{"two GPUs of any SKU", "lora_train", lease.Requirements{GPUCount: 2, MinVRAMMB: 40000}, lease.Reason{},
			map[*lease.Worker]want{cpu: {code: lease.ReasonJobType}, small: {code: lease.ReasonGPUCount, gpus: 1}, big: {gpus: 3, vram: 40000}}},
		{"VRAM at the governor's cap", "lora_train", lease.Requirements{GPUSKU: "h100", MinVRAMMB: 40000}, lease.Reason{},
			map[*lease.Worker]want{cpu: {code: lease.ReasonJobType}, small: {code: lease.ReasonGPUSKU}, big: {gpus: 2, vram: 40000}}},
		{"CPU only", "status_check", lease.Requirements{}, lease.Reason{},
			map[*lease.Worker]want{cpu: {}, small: {gpus: 1}, big: {code: lease.ReasonJobType}}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			f := f.sub(t)
			j := f.enqueue(tc.typ, func(nj *lease.NewJob) { nj.Requirements = tc.req })
			defer f.cancel(j.ID)
			ex := f.explain(j.ID, &lease.ExplainOptions{AllWorkers: true})
			if tc.summary.Code == "" {
				wantExplained(t, "summary", ex)
			} else {
				wantExplained(t, "summary", ex, tc.summary)
			}
			if len(ex.Workers) != 3 || ex.Truncated {
				t.Fatalf("examined %d workers, truncated %v; want 3", len(ex.Workers), ex.Truncated)
			}
			for w, wv := range tc.workers {
				v := verdict(t, ex, w)
				got := want{gpus: v.GPUs, vram: v.VRAMMB}
				if len(v.Reasons) > 0 {
					got.code = v.Reasons[0].Code
				}
				if got != wv || len(v.Reasons) > 1 || v.Matches != (wv.code == "") || v.Available != (wv.code == "") {
					t.Errorf("verdict on %s = %+v; want %+v", w.NodeID, v, wv)
				}
				// Lease agrees: a worker the explanation rejects cannot
				// take the job, and one it accepts takes it.
				gs := f.lease(w, 1)
				if (len(gs) == 1) != v.Available {
					t.Errorf("worker %s: Lease granted %d, explanation says available=%v", w.NodeID, len(gs), v.Available)
				}
				for _, g := range gs {
					f.release(lease.Ref{JobID: g.Job.ID, WorkerID: w.ID, Token: g.Token}, "test")
				}
			}
		})
	}
	// The per-worker messages name what the worker lacks.
	j := f.enqueue("lora_train", func(nj *lease.NewJob) {
		nj.Requirements = lease.Requirements{GPUSKU: "h100", GPUCount: 2, MinVRAMMB: 50000}
	})
	ex := f.explain(j.ID, nil)
	wantVerdictReasons(t, verdict(t, ex, cpu), lease.Reason{Code: lease.ReasonJobType, Message: `the worker does not support job type "lora_train"`})
	wantVerdictReasons(t, verdict(t, ex, small), lease.Reason{Code: lease.ReasonGPUSKU, Message: `the worker has no GPU of SKU "h100"`})
	wantVerdictReasons(t, verdict(t, ex, big), lease.Reason{Code: lease.ReasonMaxVRAM,
		Message: "the job needs 50000 MiB of VRAM on each GPU; the worker's governor max_vram_mb caps it at 40000 MiB"})
	j = f.enqueue("lora_train", func(nj *lease.NewJob) { nj.Requirements = lease.Requirements{GPUCount: 2, MinVRAMMB: 90000} })
	ex = f.explain(j.ID, nil)
	wantVerdictReasons(t, verdict(t, ex, small), lease.Reason{Code: lease.ReasonGPUCount, Message: "the job needs 2 GPUs; the worker offers 1"})
	wantVerdictReasons(t, verdict(t, ex, big), lease.Reason{Code: lease.ReasonVRAM,
		Message: "the job needs 2 GPUs with 90000 MiB of VRAM each; the worker's best 2 have 81920 MiB each"})
}

func wantVerdictReasons(t *testing.T, v lease.WorkerVerdict, want ...lease.Reason) {
	t.Helper()
	if d := cmp.Diff(want, v.Reasons, cmpopts.EquateEmpty()); d != "" {
		t.Errorf("verdict on %s: reasons (-want +got):\n%s", v.NodeID, d)
	}
}

func testExplainMaxJobs(t *testing.T, f *fixture) {
	w := f.worker("w", nil, []string{"status_check"}, lease.Governor{MaxJobs: 2})
	f.enqueue("status_check")
	f.enqueue("status_check")
	_, first := f.leaseOne(w)
	f.accept(first)
	waiting := f.enqueue("status_check")
	// One slot of two is taken: still leasable.
	ex := f.explain(waiting.ID, nil)
	wantExplained(t, "one of two slots held", ex)
	if v := verdict(t, ex, w); !v.Checked || !v.Slot || v.LiveLeases != 1 || v.MaxJobs != 2 {
		t.Errorf("verdict with one of two slots held: %+v", v)
	}
	f.leaseOne(w)
	ex = f.explain(waiting.ID, nil)
	wantExplained(t, "full", ex, lease.Reason{Code: lease.ReasonMaxJobs,
		Message: "every worker that can run it is at its governor max_jobs (1 busy, 0 banned): it waits for a free slot"})
	v := verdict(t, ex, w)
	if !v.Matches || !v.Checked || v.Slot || v.Available || v.LiveLeases != 2 || v.ExpiredLeases != 0 || v.MaxJobs != 2 {
		t.Errorf("verdict on a full worker: %+v", v)
	}
	wantVerdictReasons(t, v, lease.Reason{Code: lease.ReasonMaxJobs, Message: "the worker holds 2 live leases, its governor's max_jobs"})
	if gs := f.lease(w, 1); len(gs) != 0 {
		t.Fatalf("Lease granted %d to a worker the explanation calls full", len(gs))
	}

	// A lease past its accept deadline no longer counts: the next Lease
	// expires it before it claims.
	f.clock.Advance(acceptTTL)
	ex = f.explain(waiting.ID, nil)
	wantExplained(t, "a lease past its accept deadline", ex)
	if v := verdict(t, ex, w); !v.Available || v.LiveLeases != 1 || v.ExpiredLeases != 1 {
		t.Errorf("verdict with one lease past its deadline: %+v", v)
	}
	if gs := f.lease(w, 1); len(gs) != 1 {
		t.Fatalf("Lease granted %d where the explanation saw a free slot", len(gs))
	}

	// A governor of 0 means 1.
	one := f.worker("one", nil, []string{"telemetry_sync"}, lease.Governor{})
	f.enqueue("telemetry_sync")
	f.leaseOne(one)
	j := f.enqueue("telemetry_sync")
	ex = f.explain(j.ID, nil)
	wantExplained(t, "max_jobs 0", ex, lease.Reason{Code: lease.ReasonMaxJobs,
		Message: "every worker that can run it is at its governor max_jobs (1 busy, 0 banned): it waits for a free slot"})
	if v := verdict(t, ex, one); v.MaxJobs != 1 || v.LiveLeases != 1 {
		t.Errorf("verdict under max_jobs 0: %+v", v)
	}
}

func testExplainBanned(t *testing.T, f *fixture) {
	a := f.worker("a", nil, []string{"status_check"}, lease.Governor{MaxJobs: 1})
	b := f.worker("b", nil, []string{"status_check"}, lease.Governor{MaxJobs: 1})
	other := f.worker("other", nil, []string{"telemetry_sync"}, lease.Governor{MaxJobs: 1})
	bans := map[string]bool{}
	var asked []string
	opts := &lease.ExplainOptions{AllWorkers: true, Banned: func(_ context.Context, id string) (bool, error) {
		asked = append(asked, id)
		return bans[id], nil
	}}
	j := f.enqueue("status_check")
	bans[a.ID], bans[b.ID] = true, true
	ex := f.explain(j.ID, opts)
	wantExplained(t, "all banned", ex, lease.Reason{Code: lease.ReasonBanned, Message: "every worker that can run it is banned (2)"})
	for _, w := range []*lease.Worker{a, b} {
		v := verdict(t, ex, w)
		if !v.Banned || !v.Checked || v.Available || v.Slot {
			t.Errorf("verdict on banned %s: %+v", w.NodeID, v)
		}
		wantVerdictReasons(t, v, lease.Reason{Code: lease.ReasonBanned, Message: "the worker is banned"})
	}
	for _, id := range asked {
		if id == other.ID {
			t.Errorf("Banned was asked about a worker that does not match the job")
		}
	}
	// Without the option, no worker is banned.
	wantExplained(t, "no ban option", f.explain(j.ID, nil))

	// One banned, one busy.
	bans[b.ID] = false
	f.leaseOne(b)
	waiting := f.enqueue("status_check")
	wantExplained(t, "banned and busy", f.explain(waiting.ID, opts), lease.Reason{Code: lease.ReasonMaxJobs,
		Message: "every worker that can run it is at its governor max_jobs (1 busy, 1 banned): it waits for a free slot"})

	// An error from Banned is returned.
	boom := errors.New("boom")
	_, err := f.m.Explain(f.ctx, waiting.ID, &lease.ExplainOptions{Banned: func(context.Context, string) (bool, error) { return false, boom }})
	if !errors.Is(err, boom) {
		t.Errorf("Explain with a failing Banned: %v", err)
	}
}

func testExplainLeaseTypes(t *testing.T, f *fixture) {
	w := f.worker("w", []lease.GPU{{SKU: "rtx-4090", VRAMMB: 24576}}, []string{"status_check", "lora_train", "telemetry_sync"}, lease.Governor{MaxJobs: 4})
	none := f.worker("none", nil, nil, lease.Governor{})
	ex := f.explainLease(lease.LeaseRequest{WorkerID: none.ID}, nil)
	if d := cmp.Diff([]lease.Reason{{Code: lease.ReasonNoJobTypes, Message: "the worker offers no job type"}}, ex.Reasons, cmpopts.EquateEmpty()); d != "" || ex.Leasable {
		t.Errorf("no job types: leasable %v, reasons (-want +got):\n%s", ex.Leasable, d)
	}

	later := f.now().Add(time.Hour)
	f.enqueue("lora_train", func(nj *lease.NewJob) { nj.ScheduledAt = later })
	f.enqueue("lora_train", func(nj *lease.NewJob) { nj.ScheduledAt = later.Add(time.Hour) })
	f.enqueue("telemetry_sync")
	allow := func(typ string) bool { return typ != "telemetry_sync" }
	// The request's types, deduplicated, in its order; the registered
	// ones when it names none.
	for _, req := range []lease.LeaseRequest{
		{WorkerID: w.ID, JobTypes: []string{"status_check", "lora_train", "status_check", "telemetry_sync"}, Allow: allow},
		{WorkerID: w.ID, Allow: allow},
	} {
		ex = f.explainLease(req, nil)
		want := []lease.Reason{
			{Code: lease.ReasonNoQueuedJob, JobType: "status_check", Message: "no status_check job is queued"},
			{Code: lease.ReasonScheduled, JobType: "lora_train",
				Message: "the next lora_train job that fits is scheduled for " + later.Format(time.RFC3339Nano) + ": not leasable before then"},
			{Code: lease.ReasonTypeNotAllowed, JobType: "telemetry_sync", Message: `job type "telemetry_sync" is not allowed`},
		}
		if d := cmp.Diff(want, ex.Reasons, cmpopts.EquateEmpty()); d != "" || ex.Leasable {
			t.Errorf("types %v: leasable %v, reasons (-want +got):\n%s", req.JobTypes, ex.Leasable, d)
		}
		if len(ex.Types) != 3 || ex.Types[1].Type != "lora_train" || ex.Types[1].Queued != 2 || ex.Types[1].Fitting != 2 ||
			ex.Types[1].Due != 0 || !ex.Types[1].NextAt.Equal(later) || ex.Types[2].Allowed || ex.Types[2].Queued != 0 {
			t.Errorf("type verdicts: %+v", ex.Types)
		}
		if gs, err := f.m.Lease(f.ctx, req); err != nil || len(gs) != 0 {
			t.Fatalf("Lease granted %d (%v) where the explanation found nothing", len(gs), err)
		}
	}
	// Once due, and allowed, the request leases.
	f.clock.Advance(time.Hour)
	ex = f.explainLease(lease.LeaseRequest{WorkerID: w.ID, JobTypes: []string{"lora_train"}}, nil)
	if len(ex.Reasons) != 0 || !ex.Leasable || ex.Types[0].Due != 1 || !ex.Types[0].NextAt.Equal(later.Add(time.Hour)) {
		t.Errorf("a due job: leasable %v, reasons %v, types %+v", ex.Leasable, ex.Reasons, ex.Types)
	}
	ex = f.explainLease(lease.LeaseRequest{WorkerID: w.ID, JobTypes: []string{"telemetry_sync"}}, nil)
	if len(ex.Reasons) != 0 || !ex.Leasable {
		t.Errorf("an allowed type: leasable %v, reasons %v", ex.Leasable, ex.Reasons)
	}

	_, err := f.m.ExplainLease(f.ctx, lease.LeaseRequest{WorkerID: "wrk_nobody"}, nil)
	wantErr(t, "ExplainLease of an unknown worker", err, lease.ErrNotFound)
}

func testExplainLeaseFit(t *testing.T, f *fixture) {
	w := f.worker("w", []lease.GPU{{SKU: "h100", VRAMMB: 81920}, {SKU: "rtx-4090", VRAMMB: 24576}}, []string{"lora_train"},
		lease.Governor{MaxJobs: 4, MaxVRAMMB: 40000})
	f.enqueue("lora_train", func(nj *lease.NewJob) { nj.Requirements = lease.Requirements{GPUSKU: "a100"} })
	f.enqueue("lora_train", func(nj *lease.NewJob) { nj.Requirements = lease.Requirements{GPUSKU: "a100"} })
	f.enqueue("lora_train", func(nj *lease.NewJob) { nj.Requirements = lease.Requirements{GPUSKU: "h100"} })
	f.enqueue("lora_train", func(nj *lease.NewJob) { nj.Requirements = lease.Requirements{GPUCount: 2} })
	f.enqueue("lora_train", func(nj *lease.NewJob) { nj.Requirements = lease.Requirements{GPUSKU: "rtx-4090", MinVRAMMB: 30000} })
	req := lease.LeaseRequest{WorkerID: w.ID, GPUSKUs: []string{"rtx-4090"}}
	ex := f.explainLease(req, nil)
	want := []lease.Reason{{Code: lease.ReasonNoFittingJob, JobType: "lora_train",
		Message: "no queued lora_train job fits the worker (2 need a GPU SKU it does not have, 1 needs a GPU SKU it did not offer, 1 needs more GPUs than it offers, 1 needs more VRAM per GPU than it has)"}}
	if d := cmp.Diff(want, ex.Reasons, cmpopts.EquateEmpty()); d != "" || ex.Leasable {
		t.Errorf("nothing fits: leasable %v, reasons (-want +got):\n%s", ex.Leasable, d)
	}
	wantShort := map[lease.ReasonCode]int{lease.ReasonGPUSKU: 2, lease.ReasonSKUNotOffered: 1, lease.ReasonGPUCount: 1, lease.ReasonVRAM: 1}
	if tv := ex.Types[0]; tv.Queued != 5 || tv.Fitting != 0 || !cmp.Equal(wantShort, tv.Shortfalls) {
		t.Errorf("type verdict: %+v", tv)
	}
	if gs, err := f.m.Lease(f.ctx, req); err != nil || len(gs) != 0 {
		t.Fatalf("Lease granted %d (%v) where the explanation found no fitting job", len(gs), err)
	}

	// Offering h100: the one h100 job without a VRAM floor fits; one over
	// the governor's max_vram_mb does not.
	f.enqueue("lora_train", func(nj *lease.NewJob) { nj.Requirements = lease.Requirements{GPUSKU: "h100", MinVRAMMB: 50000} })
	h100 := lease.LeaseRequest{WorkerID: w.ID, GPUSKUs: []string{"h100"}, MaxJobs: 5}
	ex = f.explainLease(h100, nil)
	if tv := ex.Types[0]; len(ex.Reasons) != 0 || !ex.Leasable || tv.Queued != 6 || tv.Fitting != 1 || tv.Due != 1 {
		t.Errorf("offering h100: leasable %v, reasons %v, types %+v", ex.Leasable, ex.Reasons, ex.Types)
	}
	gs, err := f.m.Lease(f.ctx, h100)
	if err != nil || len(gs) != 1 || gs[0].Job.Requirements.GPUSKU != "h100" || gs[0].Job.Requirements.MinVRAMMB != 0 {
		t.Fatalf("Lease offering h100 = %v, %v; want the one h100 job without a VRAM floor", gs, err)
	}
	ex = f.explainLease(h100, nil)
	want = []lease.Reason{{Code: lease.ReasonNoFittingJob, JobType: "lora_train",
		Message: "no queued lora_train job fits the worker (2 need a GPU SKU it does not have, 1 needs a GPU SKU it did not offer, 1 needs more GPUs than it offers, 1 needs more VRAM per GPU than its governor max_vram_mb allows)"}}
	if d := cmp.Diff(want, ex.Reasons, cmpopts.EquateEmpty()); d != "" || ex.Leasable {
		t.Errorf("offering h100, the fitting job taken: leasable %v, reasons (-want +got):\n%s", ex.Leasable, d)
	}
}

func testExplainLeaseWorker(t *testing.T, f *fixture) {
	w := f.worker("w", nil, []string{"status_check"}, lease.Governor{MaxJobs: 1})
	f.enqueue("status_check")
	f.enqueue("status_check")
	req := lease.LeaseRequest{WorkerID: w.ID}
	ex := f.explainLease(req, nil)
	if !ex.Leasable || len(ex.Reasons) != 0 || !ex.Slot || ex.LiveLeases != 0 || ex.MaxJobs != 1 {
		t.Errorf("a free worker: %+v", ex)
	}
	banned := &lease.ExplainOptions{Banned: func(_ context.Context, id string) (bool, error) { return id == w.ID, nil }}
	ex = f.explainLease(req, banned)
	if d := cmp.Diff([]lease.Reason{{Code: lease.ReasonBanned, Message: "the worker is banned"}}, ex.Reasons, cmpopts.EquateEmpty()); d != "" || ex.Leasable || !ex.Banned {
		t.Errorf("banned: leasable %v, reasons (-want +got):\n%s", ex.Leasable, d)
	}

	f.leaseOne(w)
	ex = f.explainLease(req, nil)
	if d := cmp.Diff([]lease.Reason{{Code: lease.ReasonMaxJobs, Message: "the worker holds 1 live leases, its governor's max_jobs"}}, ex.Reasons, cmpopts.EquateEmpty()); d != "" ||
		ex.Leasable || ex.Slot || ex.LiveLeases != 1 || ex.Types[0].Due != 1 {
		t.Errorf("full: %+v; reasons (-want +got):\n%s", ex, d)
	}
	if gs := f.lease(w, 1); len(gs) != 0 {
		t.Fatalf("Lease granted %d to a worker the explanation calls full", len(gs))
	}
	// Past the accept deadline the lease no longer counts.
	f.clock.Advance(acceptTTL)
	ex = f.explainLease(req, nil)
	if !ex.Leasable || len(ex.Reasons) != 0 || ex.LiveLeases != 0 || ex.ExpiredLeases != 1 {
		t.Errorf("a lease past its deadline: %+v", ex)
	}
	if gs := f.lease(w, 1); len(gs) != 1 {
		t.Fatalf("Lease granted %d where the explanation saw a free slot", len(gs))
	}
}
