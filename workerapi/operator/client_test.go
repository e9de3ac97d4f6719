package operator_test

import (
	"context"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/nodelane/nodelane/internal/apitest"
	"github.com/nodelane/nodelane/receipts"
	"github.com/nodelane/nodelane/workerapi/operator"
	"github.com/nodelane/nodelane/workerapi/wire"
)

// collect runs seq to its end and returns its values, failing the test
// on an error.
func collect[T any](t *testing.T, what string, seq func(func(T, error) bool)) []T {
	t.Helper()
	var out []T
	for v, err := range seq {
		if err != nil {
			t.Fatalf("%s: %v", what, err)
		}
		out = append(out, v)
	}
	return out
}

// TestJobs checks dispatch, a job's view, its events across pages, its
// artifacts, cancel and the cost report against a job a worker ran.
func TestJobs(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	ctx := context.Background()
	n := f.node(t, "gpu-jobs")

	d, err := f.api.Dispatch(ctx, wire.DispatchRequest{JobType: "status_check", Requirements: wire.Requirements{GPUSKU: "rtx-4090", Tags: []string{"lab-a"}}})
	if err != nil {
		t.Fatalf("Dispatch: %v", err)
	}
	if d.Job.State != "queued" || d.Leasable || d.Reason == "" {
		t.Errorf("Dispatch = state %s, leasable %t, reason %q; want queued and not leasable (the worker lacks lab-a)", d.Job.State, d.Leasable, d.Reason)
	}
	if _, err := f.api.CancelJob(ctx, d.Job.ID); err != nil {
		t.Fatalf("CancelJob: %v", err)
	}
	b, err := f.api.DispatchBatch(ctx, wire.DispatchBatchRequest{Jobs: []wire.DispatchRequest{{JobType: "status_check", Priority: -1}, {JobType: "embedding_dry_run", Priority: -1}}})
	if err != nil || len(b.Jobs) != 2 || b.Jobs[0].Job.JobType != "status_check" || b.Jobs[1].Job.JobType != "embedding_dry_run" || b.Jobs[0].Job.ID == b.Jobs[1].Job.ID {
		t.Fatalf("DispatchBatch = %+v, %v; want two jobs in order", b, err)
	}
	for _, j := range b.Jobs {
		if _, err := f.api.CancelJob(ctx, j.Job.ID); err != nil {
			t.Fatalf("CancelJob: %v", err)
		}
	}
	// Newest first: the three jobs in descending id order, one page and
	// one a page.
	want := []string{d.Job.ID, b.Jobs[0].Job.ID, b.Jobs[1].Job.ID}
	slices.Sort(want)
	slices.Reverse(want)
	if l, err := f.api.ListJobs(ctx, operator.JobQuery{Order: wire.OrderDesc, Limit: 3}); err != nil || len(l.Jobs) != 3 ||
		l.Jobs[0].ID != want[0] || l.Jobs[1].ID != want[1] || l.Jobs[2].ID != want[2] {
		t.Fatalf("ListJobs(desc) = %+v, %v; want %v", l, err, want)
	}
	var desc []string
	for j, err := range f.api.Jobs(ctx, operator.JobQuery{Order: wire.OrderDesc, Limit: 1}) {
		if err != nil {
			t.Fatalf("Jobs(desc): %v", err)
		}
		desc = append(desc, j.ID)
	}
	if !slices.Equal(desc, want) {
		t.Fatalf("Jobs(desc), one a page = %v, want %v", desc, want)
	}
	if _, err := f.api.ListJobs(ctx, operator.JobQuery{Order: "newest"}); !wire.IsCode(err, wire.CodeInvalidRequest) {
		t.Fatalf("ListJobs(order newest) = %v, want 400 invalid_request", err)
	}
	// A canceled job retried: queued again, with its receipt.
	r, err := f.api.RetryJob(ctx, d.Job.ID, "again")
	if err != nil || r.Job.State != "queued" || r.ReceiptID == nil {
		t.Fatalf("RetryJob = %+v, %v; want queued with a receipt", r, err)
	}
	if _, err := f.api.RetryJob(ctx, d.Job.ID, ""); !wire.IsCode(err, wire.CodeInvalidTransition) {
		t.Fatalf("RetryJob of a queued job = %v, want 409 invalid_transition", err)
	}
	if _, err := f.api.CancelJob(ctx, d.Job.ID); err != nil {
		t.Fatalf("CancelJob: %v", err)
	}

	d, err = f.api.Dispatch(ctx, wire.DispatchRequest{JobType: "status_check", Requirements: wire.Requirements{GPUSKU: "rtx-4090"}})
	if err != nil {
		t.Fatalf("Dispatch: %v", err)
	}
	if !d.Leasable {
		t.Errorf("Dispatch: not leasable (%s), want leasable by gpu-jobs", d.Reason)
	}
	id := d.Job.ID
	// A status event and 1,200 log lines: two pages of events (1,000 a
	// page).
	f.run(t, n, id, 1200)

	j, err := f.api.Job(ctx, id, 0)
	if err != nil {
		t.Fatalf("Job: %v", err)
	}
	if j.Job.State != "succeeded" || j.Job.ActualCostMicroUSD == nil || *j.Job.ActualCostMicroUSD <= 0 {
		t.Errorf("Job = state %s, cost %v; want succeeded and charged", j.Job.State, j.Job.ActualCostMicroUSD)
	}
	if len(j.Events) != 1000 || j.EventsNext == nil || len(j.Artifacts) != 1 {
		t.Fatalf("Job: %d events, next %v, %d artifacts; want a full page of 1000, a next, 1 artifact", len(j.Events), j.EventsNext, len(j.Artifacts))
	}

	f.rec.requests()
	evs := collect(t, "JobEvents", f.api.JobEvents(ctx, id, 0))
	if len(evs) != 1201 {
		t.Errorf("JobEvents yielded %d events, want 1201", len(evs))
	}
	if !slices.IsSortedFunc(evs, func(a, b wire.JobEventView) int { return int(a.ID - b.ID) }) || evs[0].Kind != "status" {
		t.Errorf("JobEvents: not in id order from the status event (first %+v)", evs[0])
	}
	if reqs := f.rec.requests(); len(reqs) != 2 {
		t.Errorf("JobEvents sent %v, want 2 requests (two pages)", reqs)
	}
	if rest := collect(t, "JobEvents after", f.api.JobEvents(ctx, id, evs[1199].ID)); len(rest) != 1 || rest[0].ID != evs[1200].ID {
		t.Errorf("JobEvents after the 1200th = %+v, want the last event only", rest)
	}

	arts := collect(t, "Artifacts", f.api.Artifacts(ctx, operator.ArtifactQuery{JobID: id}))
	if len(arts) != 1 || arts[0].Status != wire.ArtifactSucceeded || arts[0].JobID != id || arts[0].ArtifactID != j.Artifacts[0].ArtifactID {
		t.Errorf("Artifacts = %+v, want the job's one succeeded artifact", arts)
	}

	if _, err := f.api.CancelJob(ctx, id); !wire.IsCode(err, wire.CodeInvalidTransition) {
		t.Errorf("CancelJob of a succeeded job = %v, want 409 invalid_transition", err)
	}

	for _, by := range []string{wire.CostGroupBySKU, wire.CostGroupByWorker} {
		rep, err := f.api.Costs(ctx, operator.CostQuery{From: time.Now().Add(-time.Hour), To: f.env.Clock.Now().Add(time.Hour), GroupBy: by})
		if err != nil {
			t.Fatalf("Costs by %s: %v", by, err)
		}
		want := map[string]string{wire.CostGroupBySKU: "rtx-4090", wire.CostGroupByWorker: n.WorkerID}[by]
		if rep.GroupBy != by || rep.Total.Jobs != 1 || rep.Total.CostMicroUSD != *j.Job.ActualCostMicroUSD ||
			len(rep.Groups) != 1 || rep.Groups[0].Key != want {
			t.Errorf("Costs by %s = %+v; want one job of %s costing %d", by, rep, want, *j.Job.ActualCostMicroUSD)
		}
	}
}

// TestPages checks that the iterators follow the API's cursor page after
// page, honour the filters and the page size, start at the cursor given,
// and read no page beyond the one where the caller stops.
func TestPages(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	ctx := context.Background()
	var ids []string
	for i := range 7 {
		d, err := f.api.Dispatch(ctx, wire.DispatchRequest{JobType: "status_check", Priority: i})
		if err != nil {
			t.Fatalf("Dispatch: %v", err)
		}
		ids = append(ids, d.Job.ID)
	}
	// The API lists in id order: time-ordered, but two jobs of one
	// millisecond in either order.
	slices.Sort(ids)
	for _, id := range ids[:3] {
		if _, err := f.api.CancelJob(ctx, id); err != nil {
			t.Fatalf("CancelJob: %v", err)
		}
	}
	jobIDs := func(js []wire.OperatorJob) []string {
		var out []string
		for _, j := range js {
			out = append(out, j.ID)
		}
		return out
	}

	t.Run("all", func(t *testing.T) {
		f.rec.requests()
		got := jobIDs(collect(t, "Jobs", f.api.Jobs(ctx, operator.JobQuery{Limit: 2})))
		if !slices.Equal(got, ids) {
			t.Errorf("Jobs = %v, want %v", got, ids)
		}
		// 2+2+2+1: the short page is the last.
		if reqs := f.rec.requests(); len(reqs) != 4 {
			t.Errorf("Jobs sent %d requests (%v), want 4", len(reqs), reqs)
		}
	})
	t.Run("filtered from a cursor", func(t *testing.T) {
		got := jobIDs(collect(t, "Jobs", f.api.Jobs(ctx, operator.JobQuery{State: "canceled", After: ids[0], Limit: 1})))
		if !slices.Equal(got, ids[1:3]) {
			t.Errorf("canceled jobs after the first = %v, want %v", got, ids[1:3])
		}
	})
	t.Run("stop early", func(t *testing.T) {
		f.rec.requests()
		var got []string
		for j, err := range f.api.Jobs(ctx, operator.JobQuery{Limit: 2}) {
			if err != nil {
				t.Fatal(err)
			}
			if got = append(got, j.ID); len(got) == 3 {
				break
			}
		}
		if !slices.Equal(got, ids[:3]) {
			t.Errorf("the first three jobs = %v, want %v", got, ids[:3])
		}
		if reqs := f.rec.requests(); len(reqs) != 2 {
			t.Errorf("stopping at the third job sent %v, want 2 requests", reqs)
		}
	})
	t.Run("one page", func(t *testing.T) {
		p, err := f.api.ListJobs(ctx, operator.JobQuery{Limit: 3})
		if err != nil {
			t.Fatal(err)
		}
		if got := jobIDs(p.Jobs); !slices.Equal(got, ids[:3]) || p.Next == nil || *p.Next != ids[2] {
			t.Errorf("ListJobs = %v next %v, want %v next %s", got, p.Next, ids[:3], ids[2])
		}
	})

	t.Run("workers", func(t *testing.T) {
		var want []string
		for _, name := range []string{"gpu-a", "gpu-b", "gpu-c"} {
			want = append(want, f.node(t, name).WorkerID)
		}
		slices.Sort(want)
		var got []string
		for _, w := range collect(t, "Workers", f.api.Workers(ctx, operator.WorkerQuery{Limit: 1})) {
			got = append(got, w.WorkerID)
		}
		if !slices.Equal(got, want) {
			t.Errorf("Workers = %v, want %v", got, want)
		}
	})

	t.Run("credentials and receipts", func(t *testing.T) {
		if _, err := f.api.CreatePrincipal(ctx, wire.CreatePrincipalRequest{ID: "ci-bot"}); err != nil {
			t.Fatal(err)
		}
		var minted []string
		var last string
		for range 3 {
			m, err := f.api.MintCredential(ctx, wire.MintCredentialRequest{Principal: "ci-bot", Scopes: []string{"operator:jobs"}})
			if err != nil {
				t.Fatal(err)
			}
			minted, last = append(minted, m.CredentialID), m.ReceiptID
		}
		slices.Sort(minted)
		var got []string
		for _, c := range collect(t, "Credentials", f.api.Credentials(ctx, operator.CredentialQuery{Principal: "ci-bot", Limit: 2})) {
			got = append(got, c.CredentialID)
		}
		if !slices.Equal(got, minted) {
			t.Errorf("Credentials of ci-bot = %v, want %v", got, minted)
		}

		// Receipt waits until the last receipt is sequenced: every one
		// before it is too.
		rr, err := f.api.Receipt(ctx, last)
		if err != nil || rr.Receipt.Index == nil {
			t.Fatalf("Receipt = %+v, %v; want it sequenced", rr, err)
		}
		all := collect(t, "Receipts", f.api.Receipts(ctx, operator.ReceiptQuery{Limit: 2}))
		if int64(len(all)) < *rr.Receipt.Index+1 {
			t.Fatalf("Receipts yielded %d, want at least %d", len(all), *rr.Receipt.Index+1)
		}
		for i, w := range all {
			if w.Index == nil || *w.Index != int64(i) {
				t.Fatalf("Receipts: the %dth has index %v", i, w.Index)
			}
		}
		from := collect(t, "Receipts from 2", f.api.Receipts(ctx, operator.ReceiptQuery{From: 2, Limit: 2}))
		if len(from) != len(all)-2 || from[0].ID != all[2].ID {
			t.Errorf("Receipts from index 2: %d, first %s; want %d, first %s", len(from), from[0].ID, len(all)-2, all[2].ID)
		}
		kind := collect(t, "Receipts of a kind", f.api.Receipts(ctx, operator.ReceiptQuery{Kind: receipts.KindCredentialMinted, Limit: 1}))
		if len(kind) < 3 || slices.ContainsFunc(kind, func(w receipts.WireReceipt) bool { return w.Kind != receipts.KindCredentialMinted }) ||
			kind[len(kind)-1].ID != last {
			t.Errorf("credential_minted receipts = %d, last %s; want at least 3, all of that kind, ending with %s", len(kind), kind[len(kind)-1].ID, last)
		}
		p, err := f.api.ListReceipts(ctx, operator.ReceiptQuery{From: 1, Limit: 1})
		if err != nil || len(p.Receipts) != 1 || p.Receipts[0].ID != all[1].ID || p.Next == nil || *p.Next != 1 {
			t.Errorf("ListReceipts from 1 = %+v, %v; want receipt %s and next 1", p, err, all[1].ID)
		}
	})
}

// TestWorkers checks the worker routes' methods against a registered
// worker: its view, drain and resume, ban and unban, approve, retire.
func TestWorkers(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	ctx := context.Background()
	id := f.node(t, "gpu-w").WorkerID

	d, err := f.api.Worker(ctx, id)
	if err != nil || d.Worker.WorkerID != id || d.Worker.Name != "gpu-w" || d.Worker.Liveness != wire.LivenessOnline {
		t.Fatalf("Worker = %+v, %v", d, err)
	}
	w, err := f.api.DrainWorker(ctx, id)
	if err != nil || !w.Worker.Drain || w.Worker.DrainRequestedBy == nil || *w.Worker.DrainRequestedBy != apitest.OperatorID || w.ReceiptID != nil {
		t.Errorf("DrainWorker = %+v, %v; want drain requested by %s, no receipt", w, err, apitest.OperatorID)
	}
	if w, err = f.api.ResumeWorker(ctx, id); err != nil || w.Worker.Drain {
		t.Errorf("ResumeWorker = %+v, %v; want no drain", w, err)
	}
	if w, err = f.api.BanWorker(ctx, id, "suspicious"); err != nil || !w.Worker.Banned || w.ReceiptID == nil {
		t.Errorf("BanWorker = %+v, %v; want banned with a receipt", w, err)
	}
	if w, err = f.api.BanWorker(ctx, id, "suspicious"); err != nil || w.ReceiptID != nil {
		t.Errorf("BanWorker again = %+v, %v; want no receipt", w, err)
	}
	if w, err = f.api.UnbanWorker(ctx, id, ""); err != nil || w.Worker.Banned {
		t.Errorf("UnbanWorker = %+v, %v; want not banned", w, err)
	}
	types := []string{"status_check"}
	if w, err = f.api.ApproveWorker(ctx, id, wire.ApproveRequest{JobTypes: &types, Reason: "checked"}); err != nil ||
		w.Worker.Approval != wire.ApprovalApproved || !slices.Equal(w.Worker.ApprovedJobTypes, types) {
		t.Errorf("ApproveWorker = %+v, %v; want approved, pinning status_check", w, err)
	}
	if w, err = f.api.RetireWorker(ctx, id, "decommissioned"); err != nil || w.Worker.Status != "retired" || w.ReceiptID == nil {
		t.Errorf("RetireWorker = %+v, %v; want retired with a receipt", w, err)
	}
	if _, err = f.api.UnbanWorker(ctx, id, ""); !wire.IsCode(err, wire.CodeInvalidTransition) {
		t.Errorf("UnbanWorker of a retired worker = %v, want 409 invalid_transition", err)
	}
}

// TestCredentials checks principals and credentials, and a Client copy
// WithToken acting with a credential it minted: within its scope, beyond
// it, and once revoked.
func TestCredentials(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	ctx := context.Background()
	p, err := f.api.CreatePrincipal(ctx, wire.CreatePrincipalRequest{ID: "ci-bot", Name: "CI"})
	if err != nil || p.Kind != "operator" || p.ReceiptID == "" {
		t.Fatalf("CreatePrincipal = %+v, %v", p, err)
	}
	if _, err := f.api.CreatePrincipal(ctx, wire.CreatePrincipalRequest{ID: "ci-bot"}); !wire.IsCode(err, wire.CodePrincipalExists) {
		t.Errorf("CreatePrincipal again = %v, want 409 principal_exists", err)
	}
	m, err := f.api.MintCredential(ctx, wire.MintCredentialRequest{Principal: "ci-bot", Scopes: []string{"operator:jobs"}, TTLSeconds: 3600})
	if err != nil || m.Token == "" || !slices.Equal(m.Scopes, []string{"operator:jobs"}) {
		t.Fatalf("MintCredential = %+v, %v", m, err)
	}
	bot := f.api.WithToken(m.Token)
	if _, err := bot.ListJobs(ctx, operator.JobQuery{}); err != nil {
		t.Errorf("ListJobs with the minted token: %v", err)
	}
	if _, err := bot.ListWorkers(ctx, operator.WorkerQuery{}); !wire.IsCode(err, wire.CodeInsufficientScope) {
		t.Errorf("ListWorkers with an operator:jobs token = %v, want 403 insufficient_scope", err)
	}
	// The copy changed nothing of the Client it was made from.
	if _, err := f.api.ListWorkers(ctx, operator.WorkerQuery{}); err != nil {
		t.Errorf("ListWorkers with the operator token after WithToken: %v", err)
	}
	cs, err := f.api.ListCredentials(ctx, operator.CredentialQuery{Principal: "ci-bot"})
	if err != nil || len(cs.Credentials) != 1 || cs.Credentials[0].CredentialID != m.CredentialID || cs.Credentials[0].RevokedAt != nil {
		t.Errorf("ListCredentials of ci-bot = %+v, %v", cs, err)
	}
	r, err := f.api.RevokeCredential(ctx, m.CredentialID, "rotated")
	if err != nil || r.ReceiptID == nil || r.Principal != "ci-bot" {
		t.Errorf("RevokeCredential = %+v, %v", r, err)
	}
	if r, err = f.api.RevokeCredential(ctx, m.CredentialID, "rotated"); err != nil || r.ReceiptID != nil {
		t.Errorf("RevokeCredential again = %+v, %v; want no receipt", r, err)
	}
	if _, err := bot.ListJobs(ctx, operator.JobQuery{}); !wire.IsCode(err, wire.CodeTokenRevoked) {
		t.Errorf("ListJobs with the revoked token = %v, want 401 token_revoked", err)
	}
}

// TestEnvelope checks the envelope's state, activation until a deadline
// and deactivation, each bumping the policy version with a receipt.
func TestEnvelope(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	ctx := context.Background()
	e, err := f.api.Envelope(ctx)
	if err != nil || e.Active || !slices.Contains(e.BlockedTypes, "lora_train") {
		t.Fatalf("Envelope = %+v, %v; want inactive, lora_train blocked", e, err)
	}
	until := f.env.Clock.Now().Add(time.Hour).UTC().Truncate(time.Second)
	a, err := f.api.ActivateEnvelope(ctx, wire.ActivateRequest{Reason: "training window", Until: &until})
	if err != nil || !a.Active || a.Until == nil || !a.Until.Equal(until) || a.PolicyVersion != e.PolicyVersion+1 || a.ReceiptID == "" {
		t.Errorf("ActivateEnvelope = %+v, %v; want active until %v, policy version %d", a, err, until, e.PolicyVersion+1)
	}
	if _, err := f.api.DeactivateEnvelope(ctx, ""); !wire.IsCode(err, wire.CodeInvalidRequest) {
		t.Errorf("DeactivateEnvelope without a reason = %v, want 400 invalid_request", err)
	}
	d, err := f.api.DeactivateEnvelope(ctx, "window over")
	if err != nil || d.Active || d.PolicyVersion != e.PolicyVersion+2 || d.ReceiptID == "" {
		t.Errorf("DeactivateEnvelope = %+v, %v", d, err)
	}
}

// TestReceipts checks that a receipt, its proof and the checkpoints read
// through the Client verify offline, and that a consistency proof links
// two checkpoints.
func TestReceipts(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	ctx := context.Background()
	key, origin := f.env.Server.ReceiptVerifierKey(), f.env.Config.Origin
	p, err := f.api.CreatePrincipal(ctx, wire.CreatePrincipalRequest{ID: "ci-bot"})
	if err != nil {
		t.Fatal(err)
	}
	rr, err := f.api.Receipt(ctx, p.ReceiptID)
	if err != nil || rr.Proof == nil || rr.Checkpoint == nil {
		t.Fatalf("Receipt = %+v, %v; want it sequenced, with its proof", rr, err)
	}
	if rc, err := receipts.Verify(key, origin, rr.Receipt.Body, *rr.Proof, []byte(*rr.Checkpoint)); err != nil || rc.ID != p.ReceiptID {
		t.Errorf("receipts.Verify = %+v, %v", rc, err)
	}
	older, err := f.api.VerifiedCheckpoint(ctx, key, origin)
	if err != nil {
		t.Fatal(err)
	}
	m, err := f.api.MintCredential(ctx, wire.MintCredentialRequest{Principal: "ci-bot", Scopes: []string{"operator:jobs"}})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.api.Receipt(ctx, m.ReceiptID); err != nil {
		t.Fatal(err)
	}
	note, err := f.api.Checkpoint(ctx)
	if err != nil {
		t.Fatal(err)
	}
	newer, err := receipts.OpenCheckpoint(note, key, origin)
	if err != nil || newer.Size <= older.Size {
		t.Fatalf("the newer checkpoint = %+v, %v; want one larger than %d", newer, err, older.Size)
	}
	cons, err := f.api.Consistency(ctx, older.Size, newer.Size)
	if err != nil {
		t.Fatal(err)
	}
	if err := receipts.CheckConsistency(older.Tree(), newer.Tree(), cons.Hashes); err != nil {
		t.Errorf("the consistency proof from %d to %d: %v", older.Size, newer.Size, err)
	}
	if _, err := f.api.VerifiedCheckpoint(ctx, key, "another.origin/log"); err == nil {
		t.Error("VerifiedCheckpoint with another origin verified")
	}
	if _, err := f.api.Consistency(ctx, newer.Size, older.Size); !wire.IsCode(err, wire.CodeInvalidRequest) {
		t.Errorf("Consistency backwards = %v, want 400 invalid_request", err)
	}
}

// TestCall checks the raw call: the body of a 2xx answer as it came, a
// query passed on, and an error answer as a *wire.Error.
func TestCall(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	ctx := context.Background()
	b, err := f.api.Call(ctx, http.MethodPost, "/operator/jobs", wire.DispatchRequest{JobType: "status_check"})
	if err != nil || !strings.Contains(string(b), `"state":"queued"`) {
		t.Fatalf("Call dispatch = %s, %v", b, err)
	}
	b, err = f.api.Call(ctx, http.MethodGet, "/operator/jobs?state=queued&limit=1", nil)
	if err != nil || !strings.Contains(string(b), `"jobs":[{`) {
		t.Errorf("Call list = %s, %v", b, err)
	}
	if _, err := f.api.Call(ctx, http.MethodGet, "/operator/jobs?stat=queued", nil); !wire.IsCode(err, wire.CodeInvalidRequest) {
		t.Errorf("Call with an unknown parameter = %v, want 400 invalid_request", err)
	}
}
