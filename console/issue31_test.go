package console_test

import (
	"encoding/json"
	"fmt"
	"net/http"
	"net/url"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/nodelane/nodelane/internal/apitest"
	"github.com/nodelane/nodelane/lease"
	"github.com/nodelane/nodelane/workerapi"
	"github.com/nodelane/nodelane/workerapi/wire"
)

// startJob enqueues a status_check job and has n lease and accept it.
func startJob(t *testing.T, f *fixture, n *apitest.Node, nj lease.NewJob) (id, tok string) {
	t.Helper()
	nj.Type = "status_check"
	id = f.env.Enqueue(t, nj).ID
	l := apitest.Post[wire.LeaseResponse](t, n, "/workers/jobs/lease", wire.LeaseRequest{SupportedJobTypes: []string{"status_check"}, SupportedGPUSKUs: []string{"rtx-4090"}, MaxJobs: 1}, http.StatusOK)
	if l.Job == nil || l.Job.ID != id {
		t.Fatalf("lease = %+v, want job %s", l, id)
	}
	apitest.Post[wire.AcceptResponse](t, n, wire.JobPath(id, wire.ActionAccept), wire.TokenRequest{LeaseToken: *l.LeaseToken}, http.StatusOK)
	return id, *l.LeaseToken
}

// jobCount is how many jobs the control plane holds.
func jobCount(t *testing.T, f *fixture) int {
	t.Helper()
	return len(apiGet[wire.JobListResponse](t, f, "/operator/jobs?limit=1000").Jobs)
}

// TestDispatchKeepsInput: a dispatch that fails shows the form again with
// what was sent, says where the payload stops being JSON, and dispatches
// nothing.
func TestDispatchKeepsInput(t *testing.T) {
	t.Parallel()
	f := newFixture(t, nil)
	b := f.browser(t)
	b.signIn(t, f.env.OperatorToken)
	for _, c := range []struct {
		name  string
		form  url.Values
		code  int
		wants []string
	}{
		{"payload", url.Values{"job_type": {"status_check"}, "payload": {"{\"a\": 1,\r\n \"b\": ]}"}, "gpu_sku": {"rtx-4090"}, "tags": {"lab-a lab-b"}}, http.StatusBadRequest,
			[]string{"the payload is not JSON: invalid character &#39;]&#39; looking for beginning of value at line 2, column 7", `data-error-offset="15"`,
				`aria-invalid="true"`, `value="status_check"`, `value="rtx-4090"`, `value="lab-a lab-b"`, "{&#34;a&#34;: 1,\n &#34;b&#34;: ]}"}},
		{"payload cut short", url.Values{"job_type": {"status_check"}, "payload": {`{"a": [1, 2`}}, http.StatusBadRequest,
			[]string{"it ends before the JSON value does at line 1, column 12", `data-error-offset="11"`}},
		{"count", url.Values{"job_type": {"status_check"}, "payload": {`{"x": "<b>"}`}, "gpu_count": {"two"}}, http.StatusBadRequest,
			[]string{"gpu_count &#34;two&#34; is not a whole number", `value="two"`, "{&#34;x&#34;: &#34;&lt;b&gt;&#34;}"}},
		{"the API refuses", url.Values{"job_type": {"status_check"}, "max_attempts": {"1000"}}, http.StatusBadRequest,
			[]string{"The control plane answered 400", `value="1000"`}},
	} {
		t.Run(c.name, func(t *testing.T) {
			p := b.post(t, "/jobs", c.form)
			if p.code != c.code || !strings.HasSuffix(p.url, "/console/jobs") {
				t.Fatalf("%d at %s, want %d on the job list", p.code, p.url, c.code)
			}
			mustContain(t, c.name, p, c.wants...)
			if n := jobCount(t, f); n != 0 {
				t.Errorf("%d jobs after a refused dispatch", n)
			}
		})
	}
	// The form is empty again on the next visit.
	if p := b.get(t, "/jobs"); strings.Contains(p.body, "is not JSON") || strings.Contains(p.body, `value="rtx-4090"`) {
		t.Errorf("the refused input stayed on the page:\n%s", p.body)
	}
}

// TestJobPageHints: a failed job is "not charged" (not "yet"); a job held
// by a banned worker says so; the payload reads as JSON with its markup
// escaped once; times are <time> elements with the exact time on hover.
func TestJobPageHints(t *testing.T) {
	t.Parallel()
	f := newFixture(t, nil)
	b := f.browser(t)
	b.signIn(t, f.env.OperatorToken)
	n := registerNode(t, f, "gpu-1")
	failed, tok := startJob(t, f, n, lease.NewJob{MaxAttempts: 1, Payload: json.RawMessage(`{"note":"<script>alert(1)</script>"}`)})
	apitest.Post[wire.FailResponse](t, n, wire.JobPath(failed, wire.ActionFail), wire.FailRequest{LeaseToken: tok, ErrorCode: "oom", Message: "out of memory"}, http.StatusOK)
	p := b.get(t, "/jobs/"+failed)
	mustContain(t, "failed job", p, "Not charged: the job ended failed", `<span id="job-state" class="badge state-failed">failed</span>`,
		`&#34;note&#34;: &#34;&lt;script&gt;alert(1)&lt;/script&gt;&#34;`)
	if strings.Contains(p.body, `\u003c`) || strings.Contains(p.body, "<script>alert") || strings.Contains(p.body, "Not charged yet") {
		t.Errorf("the failed job's page:\n%s", p.body)
	}
	if !regexp.MustCompile(`<time datetime="[0-9T:-]+Z" title="[0-9 :-]+Z">[^<]+</time>`).MatchString(p.body) {
		t.Errorf("no relative <time> on the job page:\n%s", p.body)
	}
	if strings.Contains(p.body, `id="worker-hint"`) {
		t.Error("a hint about the worker of an ended job")
	}

	held, _ := startJob(t, f, n, lease.NewJob{})
	if p := b.get(t, "/jobs/"+held); strings.Contains(p.body, `id="worker-hint"`) {
		t.Errorf("a hint about a worker in good standing:\n%s", p.body)
	}
	if code, body := f.env.Operator(t, http.MethodPost, "/operator/workers/"+n.WorkerID+"/ban", map[string]string{"reason": "flaky fans"}); code != http.StatusOK {
		t.Fatalf("ban: %d %s", code, body)
	}
	p = b.get(t, "/jobs/"+held)
	mustContain(t, "job of a banned worker", p, `id="worker-hint"`, "The worker holding this job is banned (flaky fans)", "Its lease expires ")
}

// TestApproveOnlyWhenPending: the Approve form is offered to a worker
// that awaits approval, not to one that needs none, nor to a banned one.
func TestApproveOnlyWhenPending(t *testing.T) {
	t.Parallel()
	free := newFixture(t, nil)
	b := free.browser(t)
	b.signIn(t, free.env.OperatorToken)
	n := registerNode(t, free, "gpu-1")
	if p := b.get(t, "/workers/"+n.WorkerID); strings.Contains(p.body, "/approve\"") {
		t.Errorf("Approve offered to a worker that needs no approval:\n%s", p.body)
	}

	gated := newFixtureOn(t, "sqlite", func(c *workerapi.Config) { c.ApproveNodes = true }, nil)
	b = gated.browser(t)
	b.signIn(t, gated.env.OperatorToken)
	n = registerNode(t, gated, "gpu-2")
	p := b.get(t, "/workers/"+n.WorkerID)
	mustContain(t, "pending worker", p, `/workers/`+n.WorkerID+`/approve"`, `badge approval-pending`)
	b.post(t, "/workers/"+n.WorkerID+"/ban", url.Values{"reason": {"unknown box"}})
	if p := b.get(t, "/workers/"+n.WorkerID); strings.Contains(p.body, "/approve\"") {
		t.Errorf("Approve offered to a banned worker:\n%s", p.body)
	}
	b.post(t, "/workers/"+n.WorkerID+"/unban", url.Values{"reason": {"known"}})
	p = b.post(t, "/workers/"+n.WorkerID+"/approve", url.Values{"reason": {"checked"}})
	mustContain(t, "approved", p, "approve done", "badge approval-approved")
	if strings.Contains(p.body, "/approve\"") {
		t.Error("Approve still offered once approved")
	}
}

// TestNewestFirst: the job and worker lists and the receipts show the
// newest first and page toward older ones.
func TestNewestFirst(t *testing.T) {
	t.Parallel()
	f := newFixture(t, nil)
	b := f.browser(t)
	b.signIn(t, f.env.OperatorToken)
	registerNode(t, f, "gpu-1")
	last := registerNode(t, f, "gpu-2")
	var ids []string
	for range 3 {
		ids = append(ids, f.env.Enqueue(t, lease.NewJob{Type: "status_check"}).ID)
	}
	// Newest first is descending id order: an id begins with its
	// millisecond, and jobs of one millisecond follow their random rest.
	slices.Sort(ids)
	slices.Reverse(ids)
	p := b.get(t, "/jobs")
	rows := regexp.MustCompile(`<tr><td><a href="/console/jobs/([^"]+)">`).FindAllStringSubmatch(p.body, -1)
	if len(rows) != 3 || rows[0][1] != ids[0] || rows[1][1] != ids[1] || rows[2][1] != ids[2] {
		t.Errorf("the job list: %v, want %v", rows, ids)
	}
	if p := b.get(t, "/workers"); !regexp.MustCompile(`<tbody>\s*<tr><td><a href="/console/workers/` + last.WorkerID).MatchString(p.body) {
		t.Errorf("the worker list does not start with the newest worker:\n%s", p.body)
	}

	settled(t, f)
	p = b.get(t, "/receipts")
	idx := regexp.MustCompile(`<tr><td>(\d+)</td><td><a href="/console/receipts/`).FindAllStringSubmatch(p.body, -1)
	if len(idx) < 2 || idx[0][1] <= idx[len(idx)-1][1] {
		t.Errorf("receipt indexes %v: not newest first", idx)
	}
	// before= pages toward the older ones.
	p = b.get(t, "/receipts?before=1")
	if idx := regexp.MustCompile(`<tr><td>(\d+)</td>`).FindAllStringSubmatch(p.body, -1); len(idx) != 1 || idx[0][1] != "0" {
		t.Errorf("before=1: %v, want receipt 0 only", idx)
	}
	mustContain(t, "before=1", p, `href="/console/receipts">Newest</a>`)
	for _, bad := range []string{"x", "-1"} {
		if p := b.get(t, "/receipts?before="+bad); p.code != http.StatusBadRequest || !strings.Contains(p.body, "is not a whole number") {
			t.Errorf("before=%s: %d", bad, p.code)
		}
	}
}

// TestEventsAnswerHoldsPages: one answer of the log viewer's route holds
// up to console.MaxEventsAnswer events, read over several pages of the
// API (1,000 each).
func TestEventsAnswerHoldsPages(t *testing.T) {
	t.Parallel()
	f := newFixture(t, nil)
	b := f.browser(t)
	b.signIn(t, f.env.OperatorToken)
	n := registerNode(t, f, "gpu-1")
	id, tok := startJob(t, f, n, lease.NewJob{})
	const lines = 2500
	for seq := 1; seq <= lines; seq += wire.MaxLogEntries {
		var es []wire.LogEntry
		for i := seq; i < seq+wire.MaxLogEntries && i <= lines; i++ {
			es = append(es, wire.LogEntry{Seq: int64(i), Message: fmt.Sprintf("line %d", i)})
		}
		apitest.Post[wire.LogsResponse](t, n, wire.JobPath(id, wire.ActionLogs), wire.LogsRequest{LeaseToken: tok, Entries: es}, http.StatusOK)
	}
	var ans struct {
		State  string              `json:"state"`
		Ended  bool                `json:"ended"`
		Events []wire.JobEventView `json:"events"`
		Next   *int64              `json:"next"`
	}
	p := b.get(t, "/jobs/"+id+"/events?after=0")
	if err := json.Unmarshal([]byte(p.body), &ans); err != nil {
		t.Fatalf("%d %v: %s", p.code, err, p.body)
	}
	if len(ans.Events) != lines || ans.Next != nil || ans.Ended || ans.State != "running" ||
		ans.Events[0].Message != "line 1" || ans.Events[lines-1].Message != fmt.Sprintf("line %d", lines) {
		t.Errorf("events answer: %d events, next %v, state %s ended %t", len(ans.Events), ans.Next, ans.State, ans.Ended)
	}
	if p := b.get(t, "/jobs/"+id+"/events?after=-1"); p.code != http.StatusBadRequest {
		t.Errorf("after=-1: %d", p.code)
	}
}

// TestRetry: a failed job offers Retry, which queues it again with a
// receipt; a job in another state offers none, and a retry of it is
// refused (409) and changes nothing; an unknown job is 404.
func TestRetry(t *testing.T) {
	t.Parallel()
	f := newFixture(t, nil)
	b := f.browser(t)
	b.signIn(t, f.env.OperatorToken)
	n := registerNode(t, f, "gpu-1")
	failed, tok := startJob(t, f, n, lease.NewJob{MaxAttempts: 1})
	apitest.Post[wire.FailResponse](t, n, wire.JobPath(failed, wire.ActionFail), wire.FailRequest{LeaseToken: tok, ErrorCode: "oom", Message: "out of memory"}, http.StatusOK)
	running, _ := startJob(t, f, n, lease.NewJob{})

	if p := b.get(t, "/jobs/"+running); strings.Contains(p.body, "/retry\"") {
		t.Errorf("Retry offered for a running job:\n%s", p.body)
	}
	p := b.post(t, "/jobs/"+running+"/retry", url.Values{"reason": {"again"}})
	mustContain(t, "retry of a running job", p, "The control plane answered 409 invalid_transition")
	if j := apiGet[wire.JobDetailResponse](t, f, "/operator/jobs/"+running); j.Job.State != "running" {
		t.Errorf("the refused retry left the job %s", j.Job.State)
	}
	p = b.post(t, "/jobs/job_nope/retry", nil)
	mustContain(t, "retry of no job", p, "The control plane answered 404 not_found")

	p = b.get(t, "/jobs/"+failed)
	mustContain(t, "failed job", p, `action="/console/jobs/`+failed+`/retry"`)
	p = b.post(t, "/jobs/"+failed+"/retry", url.Values{"reason": {"fixed the driver"}})
	mustContain(t, "retry", p, "Job "+failed+" is queued again. Receipt ", `class="badge state-queued"`)
	if j := apiGet[wire.JobDetailResponse](t, f, "/operator/jobs/"+failed); j.Job.State != "queued" {
		t.Errorf("after Retry the job is %s", j.Job.State)
	}
	if strings.Contains(p.body, "/retry\"") {
		t.Error("Retry still offered for the queued job")
	}
}

// TestSafeTypes: the envelope page changes the safe types through the
// API; a canonical blocked type is refused and nothing changes.
func TestSafeTypes(t *testing.T) {
	t.Parallel()
	f := newFixture(t, nil)
	b := f.browser(t)
	b.signIn(t, f.env.OperatorToken)
	before := apiGet[wire.EnvelopeResponse](t, f, "/operator/envelope")
	p := b.post(t, "/envelope/safe-types", url.Values{"add": {"raw_training"}, "reason": {"no"}})
	mustContain(t, "blocked type", p, "The control plane answered 400", "raw_training")
	if after := apiGet[wire.EnvelopeResponse](t, f, "/operator/envelope"); after.PolicyVersion != before.PolicyVersion {
		t.Errorf("a refused change moved the policy version %d → %d", before.PolicyVersion, after.PolicyVersion)
	}
	p = b.post(t, "/envelope/safe-types", url.Values{"add": {"my_eval"}, "reason": {"our own type"}})
	mustContain(t, "safe type", p, "Safe types now ", "my_eval")
	if after := apiGet[wire.EnvelopeResponse](t, f, "/operator/envelope"); !slices.Contains(after.SafeTypes, "my_eval") || after.PolicyVersion != before.PolicyVersion+1 {
		t.Errorf("after the change: %+v", after)
	}
}
