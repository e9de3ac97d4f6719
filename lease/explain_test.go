package lease_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/nodelane/nodelane/lease"
)

type explainEnv struct {
	t   *testing.T
	ctx context.Context
	now time.Time
	m   *lease.Manager
}

func newExplainEnv(t *testing.T) *explainEnv {
	e := &explainEnv{t: t, ctx: context.Background(), now: time.Date(2026, 11, 30, 9, 0, 0, 0, time.UTC)}
	e.m = lease.NewManager(lease.NewMemoryStore(), &lease.Config{Now: func() time.Time { return e.now }})
	return e
}

func (e *explainEnv) worker(node string, gpus []lease.GPU, types []string, gov lease.Governor) *lease.Worker {
	e.t.Helper()
	w, err := e.m.RegisterWorker(e.ctx, &lease.Worker{NodeID: node, Capabilities: lease.Capabilities{GPUs: gpus, JobTypes: types}, Governor: gov})
	if err != nil {
		e.t.Fatal(err)
	}
	return w
}

func (e *explainEnv) enqueue(nj lease.NewJob) *lease.Job {
	e.t.Helper()
	j, err := e.m.Enqueue(e.ctx, nj)
	if err != nil {
		e.t.Fatal(err)
	}
	return j
}

func (e *explainEnv) explain(id string, opts *lease.ExplainOptions) *lease.Explanation {
	e.t.Helper()
	ex, err := e.m.Explain(e.ctx, id, opts)
	if err != nil {
		e.t.Fatal(err)
	}
	return ex
}

// The reasons workerapi renders today for the operator's leasability
// (TestOperatorDispatchLeasability), word for word.
func TestExplainOperatorMessages(t *testing.T) {
	t.Parallel()
	e := newExplainEnv(t)
	lora := func(r lease.Requirements) lease.NewJob { return lease.NewJob{Type: "lora_train", Requirements: r} }
	first := e.enqueue(lora(lease.Requirements{GPUSKU: "rtx-4090", GPUCount: 1, MinVRAMMB: 16000}))
	if got := e.explain(first.ID, nil).Reasons; len(got) != 1 || got[0].Message != "no worker is registered" {
		t.Errorf("no worker: %v", got)
	}
	w := e.worker("studio-gpu-1", []lease.GPU{{SKU: "rtx-4090", VRAMMB: 24576}}, []string{"status_check", "lora_train"},
		lease.Governor{MaxJobs: 1, MaxVRAMMB: 24576})
	if ex := e.explain(first.ID, nil); !ex.Leasable || len(ex.Reasons) != 0 {
		t.Errorf("a capable worker: %+v", ex)
	}
	for _, tc := range []struct {
		name string
		nj   lease.NewJob
		want string
	}{
		{"unknown SKU", lora(lease.Requirements{GPUSKU: "h100"}),
			`no registered worker that supports lora_train has a GPU of SKU "h100"`},
		{"too many GPUs", lora(lease.Requirements{GPUSKU: "rtx-4090", GPUCount: 2}),
			`no registered worker that supports lora_train has 2 GPUs of SKU "rtx-4090" (the most is 1)`},
		{"too little VRAM", lora(lease.Requirements{GPUCount: 1, MinVRAMMB: 40000}),
			"no registered worker that supports lora_train has 1 GPUs with 40000 MiB of VRAM each, within its governor max_vram_mb (the most is 24576 MiB)"},
		{"unsupported type", lease.NewJob{Type: "embedding_dry_run"},
			`no registered worker supports job type "embedding_dry_run"`},
		{"just fits", lora(lease.Requirements{GPUSKU: "rtx-4090", MinVRAMMB: 24576}), ""},
		{"scheduled", lease.NewJob{Type: "status_check", ScheduledAt: e.now.Add(time.Hour)},
			"scheduled for 2026-11-30T10:00:00Z: not leasable before then"},
	} {
		ex := e.explain(e.enqueue(tc.nj).ID, nil)
		got := ""
		if len(ex.Reasons) > 0 {
			got = ex.Reasons[0].Message
		}
		if got != tc.want || ex.Leasable != (tc.want == "") {
			t.Errorf("%s: leasable %v, reason %q; want %q", tc.name, ex.Leasable, got, tc.want)
		}
	}
	if _, err := e.m.Lease(e.ctx, lease.LeaseRequest{WorkerID: w.ID}); err != nil {
		t.Fatal(err)
	}
	waiting := e.enqueue(lease.NewJob{Type: "status_check"})
	if got := e.explain(waiting.ID, nil).Reasons; len(got) != 1 ||
		got[0].Message != "every worker that can run it is at its governor max_jobs (1 busy, 0 banned): it waits for a free slot" {
		t.Errorf("worker full: %v", got)
	}
	banned := &lease.ExplainOptions{Banned: func(context.Context, string) (bool, error) { return true, nil }}
	if got := e.explain(waiting.ID, banned).Reasons; len(got) != 1 || got[0].Message != "every worker that can run it is banned (1)" {
		t.Errorf("worker banned: %v", got)
	}
}

// Explain examines ExplainMaxWorkers workers and says when there were more.
func TestExplainTruncated(t *testing.T) {
	t.Parallel()
	e := newExplainEnv(t)
	for i := range lease.ExplainMaxWorkers {
		e.worker(fmt.Sprintf("cpu-%04d", i), nil, []string{"status_check"}, lease.Governor{})
		e.now = e.now.Add(time.Millisecond) // ids in registration order
	}
	last := e.worker("gpu", []lease.GPU{{SKU: "h100", VRAMMB: 81920}}, []string{"lora_train"}, lease.Governor{})
	j := e.enqueue(lease.NewJob{Type: "lora_train", Requirements: lease.Requirements{GPUSKU: "h100"}})
	ex := e.explain(j.ID, nil)
	want := `no registered worker supports job type "lora_train" (only the first 1000 registered workers were examined)`
	if !ex.Truncated || len(ex.Workers) != lease.ExplainMaxWorkers || ex.Leasable || len(ex.Reasons) != 1 || ex.Reasons[0].Message != want {
		t.Errorf("truncated: %v, %d workers, leasable %v, reasons %v", ex.Truncated, len(ex.Workers), ex.Leasable, ex.Reasons)
	}
	for _, v := range ex.Workers {
		if v.WorkerID == last.ID {
			t.Fatalf("the worker past the cap was examined")
		}
	}
	// The job is leasable all the same: the cap bounds the explanation,
	// not the lease.
	if gs, err := e.m.Lease(e.ctx, lease.LeaseRequest{WorkerID: last.ID}); err != nil || len(gs) != 1 {
		t.Fatalf("Lease = %v, %v", gs, err)
	}
}

// By default Explain stops at the first worker that could take the job;
// AllWorkers checks them all.
func TestExplainAllWorkers(t *testing.T) {
	t.Parallel()
	e := newExplainEnv(t)
	a := e.worker("a", nil, []string{"status_check"}, lease.Governor{})
	e.now = e.now.Add(time.Millisecond)
	b := e.worker("b", nil, []string{"status_check"}, lease.Governor{})
	j := e.enqueue(lease.NewJob{Type: "status_check"})
	var asked []string
	opts := &lease.ExplainOptions{Banned: func(_ context.Context, id string) (bool, error) {
		asked = append(asked, id)
		return false, nil
	}}
	ex := e.explain(j.ID, opts)
	if !ex.Leasable || !ex.Workers[0].Available || ex.Workers[1].Checked || ex.Workers[1].Available || !cmp.Equal(asked, []string{a.ID}) {
		t.Errorf("default: asked %v, verdicts %+v", asked, ex.Workers)
	}
	asked = nil
	opts.AllWorkers = true
	ex = e.explain(j.ID, opts)
	if !ex.Leasable || !ex.Workers[0].Available || !ex.Workers[1].Available || !cmp.Equal(asked, []string{a.ID, b.ID}) {
		t.Errorf("AllWorkers: asked %v, verdicts %+v", asked, ex.Workers)
	}
}

// Explain and ExplainLease agree with Lease on every combination of a
// grid of workers, requirements and offered SKUs: the steps that name a
// mismatch never contradict the matching Lease does.
func TestExplainAgreesWithLease(t *testing.T) {
	t.Parallel()
	gpus := map[string][]lease.GPU{
		"none":  nil,
		"4090":  {{SKU: "rtx-4090", VRAMMB: 24576}},
		"mixed": {{SKU: "h100", VRAMMB: 81920}, {SKU: "h100", VRAMMB: 40960}, {SKU: "rtx-4090", VRAMMB: 24576}},
		"zero":  {{SKU: "cpu-gpu", VRAMMB: 0}},
	}
	govs := []lease.Governor{{MaxJobs: 1}, {MaxJobs: 1, MaxVRAMMB: 30000}}
	offers := [][]string{nil, {"h100"}, {"rtx-4090"}, {"a100"}}
	for name, gs := range gpus {
		for _, gov := range govs {
			for _, sku := range []string{"", "rtx-4090", "h100", "a100"} {
				for _, n := range []int{0, 1, 2, 3} {
					for _, vram := range []int{0, 24576, 30000, 40960, 81920} {
						req := lease.Requirements{GPUSKU: sku, GPUCount: n, MinVRAMMB: vram}
						for _, offered := range offers {
							checkAgreement(t, fmt.Sprintf("%s/%+v/%+v/%v", name, gov, req, offered), gs, gov, req, offered)
						}
					}
				}
			}
		}
	}
}

func checkAgreement(t *testing.T, name string, gpus []lease.GPU, gov lease.Governor, req lease.Requirements, offered []string) {
	t.Helper()
	e := newExplainEnv(t)
	w := e.worker("w", gpus, []string{"t"}, gov)
	j := e.enqueue(lease.NewJob{Type: "t", Requirements: req})
	lr := lease.LeaseRequest{WorkerID: w.ID, GPUSKUs: offered}
	lx, err := e.m.ExplainLease(e.ctx, lr, nil)
	if err != nil {
		t.Fatal(err)
	}
	if len(offered) == 0 {
		ex := e.explain(j.ID, nil)
		if ex.Leasable != lx.Leasable || ex.Workers[0].Matches != ex.Leasable {
			t.Errorf("%s: Explain leasable %v, ExplainLease %v", name, ex.Leasable, lx.Leasable)
		}
	}
	grants, err := e.m.Lease(e.ctx, lr)
	if err != nil {
		t.Fatal(err)
	}
	if lx.Leasable != (len(grants) == 1) {
		t.Errorf("%s: ExplainLease leasable %v (%v), Lease granted %d", name, lx.Leasable, lx.Reasons, len(grants))
	}
	if !lx.Leasable {
		if len(lx.Reasons) != 1 || lx.Reasons[0].Code != lease.ReasonNoFittingJob || lx.Types[0].Queued != 1 {
			t.Errorf("%s: reasons %v", name, lx.Reasons)
		}
		for code := range lx.Types[0].Shortfalls {
			switch code {
			case lease.ReasonGPUSKU, lease.ReasonSKUNotOffered, lease.ReasonGPUCount, lease.ReasonVRAM, lease.ReasonMaxVRAM:
			default:
				t.Errorf("%s: shortfall %q", name, code)
			}
		}
	}
}

// ExplainLease examines at most ExplainMaxTypes types and
// ExplainMaxJobsPerType jobs of each.
func TestExplainLeaseBounds(t *testing.T) {
	t.Parallel()
	e := newExplainEnv(t)
	var types []string
	for i := range lease.ExplainMaxTypes + 1 {
		types = append(types, fmt.Sprintf("type-%02d", i))
	}
	w := e.worker("w", nil, types, lease.Governor{})
	ex, err := e.m.ExplainLease(e.ctx, lease.LeaseRequest{WorkerID: w.ID}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if !ex.Truncated || len(ex.Types) != lease.ExplainMaxTypes || len(ex.Reasons) != lease.ExplainMaxTypes {
		t.Errorf("%d types: truncated %v, %d verdicts, %d reasons", len(types), ex.Truncated, len(ex.Types), len(ex.Reasons))
	}

	for range lease.ExplainMaxJobsPerType + 1 {
		e.enqueue(lease.NewJob{Type: "type-00", Requirements: lease.Requirements{GPUCount: 1}})
	}
	ex, err = e.m.ExplainLease(e.ctx, lease.LeaseRequest{WorkerID: w.ID, JobTypes: []string{"type-00"}}, nil)
	if err != nil {
		t.Fatal(err)
	}
	want := "no queued type-00 job fits the worker among the first 100 queued (100 need more GPUs than it offers)"
	if tv := ex.Types[0]; !ex.Truncated || !tv.Truncated || tv.Queued != lease.ExplainMaxJobsPerType || len(ex.Reasons) != 1 || ex.Reasons[0].Message != want {
		t.Errorf("%d jobs: truncated %v, type %+v, reasons %v", lease.ExplainMaxJobsPerType+1, ex.Truncated, tv, ex.Reasons)
	}
}

// The codes are part of the API: renaming one breaks callers that switch
// on them or send them over the wire.
func TestExplainReasonCodes(t *testing.T) {
	t.Parallel()
	got := []lease.ReasonCode{
		lease.ReasonJobLeased, lease.ReasonJobFinished, lease.ReasonCancelRequested, lease.ReasonScheduled,
		lease.ReasonNoWorker, lease.ReasonJobType, lease.ReasonGPUSKU, lease.ReasonSKUNotOffered, lease.ReasonGPUCount,
		lease.ReasonVRAM, lease.ReasonMaxVRAM, lease.ReasonBanned, lease.ReasonMaxJobs,
		lease.ReasonNoJobTypes, lease.ReasonTypeNotAllowed, lease.ReasonNoQueuedJob, lease.ReasonNoFittingJob,
	}
	want := "job_leased job_finished cancel_requested job_scheduled no_worker job_type gpu_sku gpu_sku_not_offered gpu_count " +
		"vram max_vram banned max_jobs no_job_types type_not_allowed no_queued_job no_fitting_job"
	var s []string
	for _, c := range got {
		s = append(s, string(c))
	}
	if strings.Join(s, " ") != want {
		t.Errorf("codes = %s", strings.Join(s, " "))
	}
}

func TestExplainNotFound(t *testing.T) {
	t.Parallel()
	e := newExplainEnv(t)
	if _, err := e.m.Explain(e.ctx, "job_nobody", nil); !errors.Is(err, lease.ErrNotFound) {
		t.Errorf("Explain of an unknown job: %v", err)
	}
	if _, err := e.m.ExplainLease(e.ctx, lease.LeaseRequest{WorkerID: "wrk_nobody"}, nil); !errors.Is(err, lease.ErrNotFound) {
		t.Errorf("ExplainLease of an unknown worker: %v", err)
	}
}

// noGetJob is a Store that cannot read a job by id.
type noGetJob struct{ lease.Store }

var errNoGetJob = errors.New("GetJob called")

func (noGetJob) GetJob(context.Context, string) (*lease.Job, error) { return nil, errNoGetJob }

// Explain judges the job ExplainOptions.Job gives, without reading it.
func TestExplainGivenJob(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	m := lease.NewManager(noGetJob{lease.NewMemoryStore()}, nil)
	if _, err := m.RegisterWorker(ctx, &lease.Worker{NodeID: "n", Capabilities: lease.Capabilities{JobTypes: []string{"status_check"}}}); err != nil {
		t.Fatal(err)
	}
	j, err := m.Enqueue(ctx, lease.NewJob{Type: "status_check"})
	if err != nil {
		t.Fatal(err)
	}
	ex, err := m.Explain(ctx, j.ID, &lease.ExplainOptions{Job: j})
	if err != nil || !ex.Leasable || ex.Job.ID != j.ID {
		t.Fatalf("Explain with the job = %+v, %v; want leasable", ex, err)
	}
	if _, err := m.Explain(ctx, j.ID, nil); !errors.Is(err, errNoGetJob) {
		t.Fatalf("Explain without the job: %v; want it to read the job", err)
	}
	if _, err := m.Explain(ctx, "job_other", &lease.ExplainOptions{Job: j}); !errors.Is(err, lease.ErrInvalidArgument) {
		t.Fatalf("Explain of another id with the job: %v; want ErrInvalidArgument", err)
	}
}

// countingStore is a MemoryStore that counts ListWorkers calls.
type countingStore struct {
	*lease.MemoryStore
	lists int
}

func (s *countingStore) ListWorkers(ctx context.Context, f lease.WorkerFilter) ([]*lease.Worker, error) {
	s.lists++
	return s.MemoryStore.ListWorkers(ctx, f)
}

// TestExplainReusesWorkers checks that Explain reads the workers once per
// ExplainWorkersTTL; a worker registered or approved through the Manager
// is seen at once, one written elsewhere (another replica's Manager) once
// the list is older than the TTL; a negative TTL reads every time.
func TestExplainReusesWorkers(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	now := time.Date(2026, 11, 30, 9, 0, 0, 0, time.UTC)
	clock := func() time.Time { return now }
	s := &countingStore{MemoryStore: lease.NewMemoryStore()}
	m := lease.NewManager(s, &lease.Config{Now: clock, ExplainWorkersTTL: time.Second})
	other := lease.NewManager(s, &lease.Config{Now: clock}) // another replica
	j, err := m.Enqueue(ctx, lease.NewJob{Type: "render"})
	if err != nil {
		t.Fatal(err)
	}
	explain := func(m *lease.Manager) []string {
		t.Helper()
		ex, err := m.Explain(ctx, j.ID, nil)
		if err != nil {
			t.Fatal(err)
		}
		var nodes []string
		for _, v := range ex.Workers {
			nodes = append(nodes, v.NodeID)
		}
		slices.Sort(nodes) // ids made at one instant are in no order
		return nodes
	}
	register := func(m *lease.Manager, node string) *lease.Worker {
		t.Helper()
		w, err := m.RegisterWorker(ctx, &lease.Worker{NodeID: node, Capabilities: lease.Capabilities{JobTypes: []string{"render"}}})
		if err != nil {
			t.Fatal(err)
		}
		return w
	}
	check := func(step string, got []string, lists int, want ...string) {
		t.Helper()
		if diff := cmp.Diff(want, got); diff != "" || s.lists != lists {
			t.Errorf("%s: workers (-want +got):\n%s; %d lists of workers, want %d", step, diff, s.lists, lists)
		}
	}

	a := register(m, "a")
	check("first explain", explain(m), 1, "a")
	check("again within the TTL", explain(m), 1, "a")
	register(m, "b")
	check("after a registration through m", explain(m), 2, "a", "b")
	register(other, "c")
	now = now.Add(999 * time.Millisecond)
	check("another replica's registration, within the TTL", explain(m), 2, "a", "b")
	now = now.Add(time.Millisecond)
	check("once the TTL passed", explain(m), 3, "a", "b", "c")
	if _, _, err := m.Approve(ctx, a.ID, lease.Approval{By: "op"}); err != nil {
		t.Fatal(err)
	}
	check("after an approval through m", explain(m), 4, "a", "b", "c")

	off := lease.NewManager(s, &lease.Config{Now: clock, ExplainWorkersTTL: -1})
	explain(off)
	check("without reuse", explain(off), 6, "a", "b", "c")
}
