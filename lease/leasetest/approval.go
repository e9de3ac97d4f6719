package leasetest

import (
	"crypto/rand"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"

	"github.com/nodelane/nodelane/lease"
)

// approvalTests check least privilege: a worker is granted only the job
// types it registered (and its approval pins), never more live leases
// than the Manager's cap, and nothing while its approval is pending; and
// that a store keeps an approval as SetApproval wrote it.
var approvalTests = []test{
	{"TypesNarrowed", testTypesNarrowed},
	{"SKUsNarrowed", testSKUsNarrowed},
	{"LeaseCap", testLeaseCap},
	{"Pending", testPending},
	{"PinnedTypes", testPinnedTypes},
	{"ApproveArguments", testApproveArguments},
	{"StoreKeepsApproval", testStoreKeepsApproval},
}

// withConfig returns a fixture for t over a new store whose Manager has
// the suite's settings as edit changes them.
func (f *fixture) withConfig(t *testing.T, edit func(*lease.Config)) *fixture {
	t.Helper()
	g := newFixture(t, f.newStore)
	cfg := lease.Config{
		LeaseTTL: ttl, AcceptTimeout: acceptTTL, RetryBase: retryBase, RetryMax: time.Hour,
		Now: g.clock.Now, Rand: rand.Reader,
	}
	edit(&cfg)
	g.m = lease.NewManager(g.store, &cfg)
	return g
}

func (f *fixture) approve(w *lease.Worker, a lease.Approval) (*lease.Worker, bool) {
	f.t.Helper()
	got, changed, err := f.m.Approve(f.ctx, w.ID, a)
	if err != nil {
		f.t.Fatalf("Approve(%s): %v", w.NodeID, err)
	}
	return got, changed
}

func (f *fixture) pendingWorker(node string, types []string) *lease.Worker {
	f.t.Helper()
	w, err := f.m.RegisterWorker(f.ctx, &lease.Worker{
		NodeID: node, Capabilities: lease.Capabilities{JobTypes: types},
		Governor: lease.Governor{MaxJobs: 4}, Approval: lease.Approval{Pending: true},
	})
	if err != nil {
		f.t.Fatalf("RegisterWorker(%s): %v", node, err)
	}
	return w
}

func wantLeaseReasons(t *testing.T, what string, ex *lease.LeaseExplanation, want ...lease.Reason) {
	t.Helper()
	if d := cmp.Diff(want, ex.Reasons, cmpopts.EquateEmpty()); d != "" {
		t.Errorf("%s: reasons (-want +got):\n%s", what, d)
	}
	if ex.Leasable {
		t.Errorf("%s: leasable with reasons %v", what, ex.Reasons)
	}
}

// A lease request narrows the types the worker registered and never
// widens them: a node registered for status_check that asks for
// telemetry_sync is granted nothing, and the job stays queued.
func testTypesNarrowed(t *testing.T, f *fixture) {
	w := f.worker("w", nil, []string{"status_check"}, lease.Governor{MaxJobs: 4})
	other := f.enqueue("telemetry_sync", func(nj *lease.NewJob) { nj.Priority = 9 })
	for _, asked := range [][]string{{"telemetry_sync"}, {"telemetry_sync", "lora_train"}} {
		gs, err := f.m.Lease(f.ctx, lease.LeaseRequest{WorkerID: w.ID, JobTypes: asked, MaxJobs: 5})
		if err != nil || len(gs) != 0 {
			t.Fatalf("asking for %v, unregistered, leased %d (%v)", asked, len(gs), err)
		}
	}
	f.same(other)
	ex := f.explainLease(lease.LeaseRequest{WorkerID: w.ID, JobTypes: []string{"telemetry_sync", "status_check"}}, nil)
	wantLeaseReasons(t, "an unregistered type", ex,
		lease.Reason{Code: lease.ReasonTypeNotRegistered, JobType: "telemetry_sync",
			Message: `job type "telemetry_sync" is not among the worker's registered types: ignored`},
		lease.Reason{Code: lease.ReasonNoQueuedJob, JobType: "status_check", Message: "no status_check job is queued"})
	if len(ex.Types) != 2 || ex.Types[0].Registered || ex.Types[0].Allowed || ex.Types[0].Queued != 0 || !ex.Types[1].Registered || !ex.Types[1].Approved {
		t.Errorf("type verdicts: %+v", ex.Types)
	}

	// Asking for a registered type and an unregistered one leases only the
	// registered one.
	mine := f.enqueue("status_check")
	gs, err := f.m.Lease(f.ctx, lease.LeaseRequest{WorkerID: w.ID, JobTypes: []string{"telemetry_sync", "status_check"}, MaxJobs: 5})
	if err != nil || len(gs) != 1 || gs[0].Job.ID != mine.ID {
		t.Fatalf("asking for both leased %v (%v), want only %s", gs, err, mine.ID)
	}
	f.same(other)

	// What the worker registers (again, or by a heartbeat's capabilities)
	// is what counts.
	w.Capabilities.JobTypes = []string{"status_check", "telemetry_sync"}
	if _, err := f.m.RegisterWorker(f.ctx, w); err != nil {
		t.Fatal(err)
	}
	gs, err = f.m.Lease(f.ctx, lease.LeaseRequest{WorkerID: w.ID, JobTypes: []string{"telemetry_sync"}})
	if err != nil || len(gs) != 1 || gs[0].Job.ID != other.ID {
		t.Fatalf("after registering telemetry_sync: leased %v (%v)", gs, err)
	}
}

// GPU SKUs offered in a request count only among the worker's registered
// GPUs.
func testSKUsNarrowed(t *testing.T, f *fixture) {
	w := f.worker("w", []lease.GPU{{SKU: "rtx-4090", VRAMMB: 24576}}, []string{"lora_train"}, lease.Governor{MaxJobs: 4})
	h100 := f.enqueue("lora_train", func(nj *lease.NewJob) { nj.Requirements = lease.Requirements{GPUSKU: "h100"} })
	two := f.enqueue("lora_train", func(nj *lease.NewJob) { nj.Requirements = lease.Requirements{GPUCount: 2} })
	gs, err := f.m.Lease(f.ctx, lease.LeaseRequest{WorkerID: w.ID, GPUSKUs: []string{"h100", "rtx-4090"}, MaxJobs: 5})
	if err != nil || len(gs) != 0 {
		t.Fatalf("offering an unregistered SKU leased %d (%v)", len(gs), err)
	}
	f.same(h100)
	f.same(two)
}

// The Manager's MaxLeasesPerWorker caps a worker's live leases whatever
// its governor says; a governor may lower the cap, not raise it.
func testLeaseCap(t *testing.T, f *fixture) {
	// The default cap is DefaultMaxLeasesPerWorker.
	greedy := f.worker("greedy", nil, []string{"status_check"}, lease.Governor{MaxJobs: 1 << 30})
	for range lease.DefaultMaxLeasesPerWorker + 10 {
		f.enqueue("status_check")
	}
	total := 0
	for range 5 {
		total += len(f.lease(greedy, 32))
	}
	if total != lease.DefaultMaxLeasesPerWorker {
		t.Fatalf("a governor of 2^30 leased %d jobs, want the default cap of %d", total, lease.DefaultMaxLeasesPerWorker)
	}
	if got := f.m.MaxLeases(greedy); got != lease.DefaultMaxLeasesPerWorker {
		t.Errorf("MaxLeases = %d", got)
	}

	g := f.withConfig(t, func(c *lease.Config) { c.MaxLeasesPerWorker = 3 })
	big := g.worker("big", nil, []string{"status_check"}, lease.Governor{MaxJobs: 1 << 30})
	small := g.worker("small", nil, []string{"status_check"}, lease.Governor{MaxJobs: 2})
	for range 10 {
		g.enqueue("status_check")
	}
	if n := len(g.lease(big, 10)) + len(g.lease(big, 10)); n != 3 {
		t.Fatalf("under a cap of 3, a governor of 2^30 leased %d", n)
	}
	ex := g.explainLease(lease.LeaseRequest{WorkerID: big.ID}, nil)
	wantLeaseReasons(t, "at the cap", ex, lease.Reason{Code: lease.ReasonMaxJobs,
		Message: "the worker holds 3 live leases; the control plane allows any worker 3, below its governor's max_jobs of 1073741824"})
	if ex.MaxJobs != 3 || ex.Slot {
		t.Errorf("explanation at the cap: max_jobs %d, slot %v", ex.MaxJobs, ex.Slot)
	}
	queued := g.list(lease.JobFilter{State: lease.StateQueued})
	if len(queued) != 7 {
		t.Fatalf("%d jobs queued, want 7", len(queued))
	}
	exj := g.explain(queued[0].ID, &lease.ExplainOptions{AllWorkers: true})
	if v := verdict(t, exj, big); v.MaxJobs != 3 || v.Slot || v.Available {
		t.Errorf("verdict on a worker at the cap: %+v", v)
	}
	// A governor below the cap is the limit.
	if n := len(g.lease(small, 10)) + len(g.lease(small, 10)); n != 2 {
		t.Fatalf("a governor of 2 under a cap of 3 leased %d", n)
	}
	if got := g.m.MaxLeases(small); got != 2 {
		t.Errorf("MaxLeases(governor 2) = %d", got)
	}
}

// A pending worker is granted nothing, keeps its pending state through
// registrations, and leases once approved.
func testPending(t *testing.T, f *fixture) {
	w := f.pendingWorker("p", []string{"status_check"})
	if !w.Approval.Pending || w.Approval.At != nil {
		t.Fatalf("registered approval = %+v", w.Approval)
	}
	j := f.enqueue("status_check")
	if gs := f.lease(w, 5); len(gs) != 0 {
		t.Fatalf("a pending worker leased %d", len(gs))
	}
	f.same(j)
	ex := f.explainLease(lease.LeaseRequest{WorkerID: w.ID}, nil)
	wantLeaseReasons(t, "pending", ex, lease.Reason{Code: lease.ReasonPendingApproval, Message: "the worker awaits an operator's approval"})
	if !ex.Pending || len(ex.Types) != 0 {
		t.Errorf("pending explanation: %+v", ex)
	}
	exj := f.explain(j.ID, nil)
	wantExplained(t, "the only worker pending", exj, lease.Reason{Code: lease.ReasonPendingApproval,
		Message: "every worker that can run it awaits an operator's approval (1 pending, 0 banned)"})
	if v := verdict(t, exj, w); !v.Matches || !v.Checked || !v.Pending || v.Available {
		t.Errorf("verdict on a pending worker: %+v", v)
	}

	// Registering again, or a heartbeat, cannot approve it.
	again := *w
	again.Approval = lease.Approval{}
	if got, err := f.m.RegisterWorker(f.ctx, &again); err != nil || !got.Approval.Pending {
		t.Fatalf("registering again: approval %+v, %v", got.Approval, err)
	}
	if _, err := f.m.Heartbeat(f.ctx, w.ID, "idle", nil); err != nil {
		t.Fatal(err)
	}
	if got, err := f.m.Worker(f.ctx, w.ID); err != nil || !got.Approval.Pending {
		t.Fatalf("after a heartbeat: approval %+v, %v", got.Approval, err)
	}
	if gs := f.lease(w, 5); len(gs) != 0 {
		t.Fatalf("a pending worker leased %d after registering again", len(gs))
	}

	// Approved, it leases.
	aw, changed := f.approve(w, lease.Approval{By: "operator", Reason: "checked", Pending: true})
	if !changed || aw.Approval.Pending || aw.Approval.At == nil || !aw.Approval.At.Equal(f.now()) || aw.Approval.By != "operator" ||
		aw.Approval.Reason != "checked" || !aw.Approval.Approved() {
		t.Fatalf("approval = %+v, changed %v", aw.Approval, changed)
	}
	stored, err := f.m.Worker(f.ctx, w.ID)
	if err != nil {
		t.Fatal(err)
	}
	if d := cmp.Diff(aw.Approval, stored.Approval, cmpopts.EquateEmpty()); d != "" {
		t.Errorf("stored approval (-returned +stored):\n%s", d)
	}
	wantExplained(t, "approved", f.explain(j.ID, nil))
	if gs := f.lease(w, 5); len(gs) != 1 || gs[0].Job.ID != j.ID {
		t.Fatalf("the approved worker leased %v", gs)
	}

	// Approving again with the same pins changes nothing.
	f.clock.Advance(time.Second)
	same, changed := f.approve(w, lease.Approval{By: "other", Reason: "again"})
	if changed || same.Approval.By != "operator" || !same.Approval.At.Equal(*aw.Approval.At) {
		t.Fatalf("approving again: changed %v, approval %+v", changed, same.Approval)
	}

	// A pending worker among others: the summary counts it.
	for range 3 {
		f.enqueue("status_check")
		f.leaseOne(w) // w ends holding 4, its governor's max_jobs
	}
	busy := f.worker("busy", nil, []string{"status_check"}, lease.Governor{MaxJobs: 1})
	f.enqueue("status_check")
	f.leaseOne(busy)
	p2 := f.pendingWorker("p2", []string{"status_check"})
	waiting := f.enqueue("status_check")
	wantExplained(t, "busy and pending", f.explain(waiting.ID, nil), lease.Reason{Code: lease.ReasonMaxJobs,
		Message: "every worker that can run it is at its governor max_jobs (2 busy, 0 banned, 1 awaiting approval): it waits for a free slot"})
	if gs := f.lease(p2, 1); len(gs) != 0 {
		t.Fatal("the second pending worker leased")
	}
}

// Pinned job types narrow the registered ones; approving with other pins
// re-pins, and approving without pins lifts them.
func testPinnedTypes(t *testing.T, f *fixture) {
	w := f.worker("w", nil, []string{"status_check", "telemetry_sync"}, lease.Governor{MaxJobs: 4})
	tel := f.enqueue("telemetry_sync", func(nj *lease.NewJob) { nj.Priority = 9 })
	aw, changed := f.approve(w, lease.Approval{By: "operator", JobTypes: []string{"status_check", "lora_train", "status_check"}, Tags: []string{"lab", "eu", "lab"}})
	if !changed || !cmp.Equal(aw.Approval.JobTypes, []string{"lora_train", "status_check"}) || !cmp.Equal(aw.Approval.Tags, []string{"eu", "lab"}) {
		t.Fatalf("pinned approval = %+v, changed %v", aw.Approval, changed)
	}
	// A pinned type the worker did not register stays out of reach.
	f.enqueue("lora_train", func(nj *lease.NewJob) { nj.Priority = 8 })
	sc := f.enqueue("status_check")
	for _, asked := range [][]string{nil, {"telemetry_sync", "lora_train", "status_check"}} {
		gs, err := f.m.Lease(f.ctx, lease.LeaseRequest{WorkerID: w.ID, JobTypes: asked, MaxJobs: 5})
		if err != nil || len(gs) != 1 || gs[0].Job.ID != sc.ID {
			t.Fatalf("asking for %v under pins: leased %v (%v), want only %s", asked, gs, err, sc.ID)
		}
		f.release(lease.Ref{JobID: sc.ID, WorkerID: w.ID, Token: gs[0].Token}, "test")
	}
	f.same(tel)
	ex := f.explainLease(lease.LeaseRequest{WorkerID: w.ID, JobTypes: []string{"telemetry_sync", "lora_train"}}, nil)
	wantLeaseReasons(t, "pinned", ex,
		lease.Reason{Code: lease.ReasonTypeNotApproved, JobType: "telemetry_sync",
			Message: `job type "telemetry_sync" is not among the types the worker's approval pins: ignored`},
		lease.Reason{Code: lease.ReasonTypeNotRegistered, JobType: "lora_train",
			Message: `job type "lora_train" is not among the worker's registered types: ignored`})
	if !ex.Types[0].Registered || ex.Types[0].Approved || ex.Types[0].Allowed {
		t.Errorf("type verdict of a registered type the approval leaves out: %+v", ex.Types[0])
	}
	exj := f.explain(tel.ID, nil)
	wantExplained(t, "not approved", exj, lease.Reason{Code: lease.ReasonTypeNotApproved,
		Message: `no registered worker that supports job type "telemetry_sync" is approved for it: an operator approves the worker again to allow it`})
	wantVerdictReasons(t, verdict(t, exj, w), lease.Reason{Code: lease.ReasonTypeNotApproved,
		Message: `the worker's approval does not include job type "telemetry_sync" (pending until an operator approves the worker again)`})

	// Re-pinning to telemetry_sync lets it lease that and nothing else.
	if _, changed := f.approve(w, lease.Approval{JobTypes: []string{"telemetry_sync"}}); !changed {
		t.Fatal("re-pinning changed nothing")
	}
	gs := f.lease(w, 5)
	if len(gs) != 1 || gs[0].Job.ID != tel.ID {
		t.Fatalf("after re-pinning to telemetry_sync: leased %v", gs)
	}
	// Approving without pins lifts them.
	if a, changed := f.approve(w, lease.Approval{}); !changed || len(a.Approval.JobTypes) != 0 || len(a.Approval.Tags) != 0 {
		t.Fatalf("lifting the pins: %+v, changed %v", a.Approval, changed)
	}
	if gs := f.lease(w, 5); len(gs) != 1 || gs[0].Job.ID != sc.ID {
		t.Fatalf("without pins: leased %v", gs)
	}
}

func testApproveArguments(t *testing.T, f *fixture) {
	w := f.pendingWorker("p", []string{"status_check"})
	long := strings.Repeat("a", lease.MaxPinLen+1)
	many := make([]string, lease.MaxPins+1)
	for i := range many {
		many[i] = string(rune('a'+i%26)) + string(rune('a'+i/26))
	}
	for name, a := range map[string]lease.Approval{
		"empty type":      {JobTypes: []string{""}},
		"type with space": {JobTypes: []string{"status check"}},
		"tag with tab":    {Tags: []string{"a\tb"}},
		"control":         {Tags: []string{"a\x00"}},
		"invalid UTF-8":   {JobTypes: []string{"\xff"}},
		"too long":        {JobTypes: []string{long}},
		"too many":        {Tags: many},
		"long reason":     {Reason: strings.Repeat("r", lease.MaxApprovalReason+1)},
	} {
		_, _, err := f.m.Approve(f.ctx, w.ID, a)
		wantErr(t, name, err, lease.ErrInvalidArgument)
	}
	if got, err := f.m.Worker(f.ctx, w.ID); err != nil || !got.Approval.Pending {
		t.Fatalf("after refused approvals: %+v, %v", got.Approval, err)
	}
	_, _, err := f.m.Approve(f.ctx, "wrk_nobody", lease.Approval{})
	wantErr(t, "Approve of an unknown worker", err, lease.ErrNotFound)
	err = f.store.SetApproval(f.ctx, "wrk_nobody", nil, lease.Approval{})
	wantErr(t, "SetApproval of an unknown worker", err, lease.ErrNotFound)
}

// PutWorker keeps the stored approval: a record read before an approval
// and written after it (a heartbeat, a registration) does not undo it.
func testStoreKeepsApproval(t *testing.T, f *fixture) {
	w := f.pendingWorker("p", []string{"status_check"})
	stale, err := f.store.GetWorker(f.ctx, w.ID)
	if err != nil {
		t.Fatal(err)
	}
	at := f.now()
	want := lease.Approval{At: &at, By: "Operator ☃", Reason: "line\none", JobTypes: []string{"status_check"}, Tags: []string{"lab"}}
	if err := f.store.SetApproval(f.ctx, w.ID, nil, want); err != nil {
		t.Fatal(err)
	}
	// A second write over the approval it read before the first is
	// refused, and changes nothing.
	at0 := at.Add(-time.Second)
	for _, prev := range []*time.Time{nil, &at0} {
		err := f.store.SetApproval(f.ctx, w.ID, prev, lease.Approval{At: &at0, By: "late"})
		wantErr(t, "SetApproval over a stale approval", err, lease.ErrConflict)
	}
	stale.Status = "busy"
	if err := f.store.PutWorker(f.ctx, stale); err != nil {
		t.Fatal(err)
	}
	got, err := f.store.GetWorker(f.ctx, w.ID)
	if err != nil {
		t.Fatal(err)
	}
	if got.Status != "busy" {
		t.Errorf("PutWorker did not write the status: %q", got.Status)
	}
	if d := cmp.Diff(want, got.Approval); d != "" {
		t.Errorf("approval after a stale PutWorker (-set +stored):\n%s", d)
	}
	// SetApproval changes the approval and nothing else.
	before := *got
	if err := f.store.SetApproval(f.ctx, w.ID, &at, lease.Approval{Pending: true}); err != nil {
		t.Fatal(err)
	}
	after, err := f.store.GetWorker(f.ctx, w.ID)
	if err != nil {
		t.Fatal(err)
	}
	before.Approval = lease.Approval{Pending: true}
	if d := cmp.Diff(&before, after, cmpopts.EquateEmpty()); d != "" {
		t.Errorf("worker after SetApproval (-want +got):\n%s", d)
	}
	// A new worker is stored with the approval it is put with.
	at2 := at.Add(time.Second)
	fresh := &lease.Worker{ID: "wrk_fresh", NodeID: "fresh", RegisteredAt: at, LastSeenAt: at,
		Approval: lease.Approval{At: &at2, By: "host", JobTypes: []string{"a", "b"}}}
	if err := f.store.PutWorker(f.ctx, fresh); err != nil {
		t.Fatal(err)
	}
	if got, err := f.store.GetWorker(f.ctx, fresh.ID); err != nil || !cmp.Equal(fresh.Approval, got.Approval) {
		t.Errorf("a new worker's approval = %+v (%v), want %+v", got.Approval, err, fresh.Approval)
	}
	ws, err := f.store.ListWorkers(f.ctx, lease.WorkerFilter{Limit: 10})
	if err != nil {
		t.Fatal(err)
	}
	for _, lw := range ws {
		if lw.ID == fresh.ID && !cmp.Equal(fresh.Approval, lw.Approval) {
			t.Errorf("ListWorkers: approval %+v, want %+v", lw.Approval, fresh.Approval)
		}
	}
}
