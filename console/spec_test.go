package console_test

// The tests of this file exercise the console against the operator API
// additions of issue 14 (I14_SPEC.md: job costs, GET /operator/costs,
// the worker, job type and tag filters, POST /operator/workers/{id}/retire).
// They pass once those routes are served.

import (
	"context"
	"fmt"
	"net/http"
	"net/url"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/nodelane/nodelane/credential"
	"github.com/nodelane/nodelane/internal/apitest"
	"github.com/nodelane/nodelane/internal/waitfor"
	"github.com/nodelane/nodelane/receipts"
	"github.com/nodelane/nodelane/workerapi/wire"
)

// charged runs one job to success and returns it with its job_charged
// receipt.
func charged(t *testing.T, f *fixture, b *browser) (ranJob, *receipts.Receipt) {
	t.Helper()
	n := registerNode(t, f, "gpu-1", "lab-a")
	job := runJob(t, n, dispatch(t, b, url.Values{"job_type": {"status_check"}, "gpu_sku": {"rtx-4090"}, "gpu_count": {"1"}}))
	var rc *receipts.Receipt
	waitfor.Until(t, "the job_charged receipt of "+job.id, func() bool {
		page := apiGet[wire.ReceiptListResponse](t, f, "/operator/receipts?kind=job_charged&limit=1000")
		for _, w := range page.Receipts {
			if r, err := receipts.Decode(w.Body); err == nil && r.JobID == job.id {
				rc = r
			}
		}
		return rc != nil
	})
	return job, rc
}

func TestSpecSpendOverview(t *testing.T) {
	t.Parallel()
	f := newFixture(t, nil)
	b := f.browser(t)
	b.signIn(t, f.env.OperatorToken)
	_, rc := charged(t, f, b)
	p := b.get(t, "/")
	usd := receipts.FormatMicros(rc.CostMicros)
	hours := receipts.Hours(rc.ActualMS)
	for _, period := range []string{"today", "this month"} {
		row := fmt.Sprintf(`<tr><td>%s</td><td>rtx-4090</td><td class="num">1</td><td class="num">%s</td><td class="num">%s</td></tr>`, period, hours, usd)
		if !strings.Contains(p.body, row) {
			t.Errorf("the overview does not show %s's spend on rtx-4090 (%s USD):\n%s", period, usd, p.body)
		}
	}
	if strings.Contains(p.body, "404") {
		t.Errorf("the overview shows an error:\n%s", p.body)
	}
}

func TestSpecJobCostFromView(t *testing.T) {
	t.Parallel()
	f := newFixture(t, nil)
	b := f.browser(t)
	b.signIn(t, f.env.OperatorToken)
	job, rc := charged(t, f, b)
	want := fmt.Sprintf(`<p id="cost">%s USD for %d ms (%s GPU-hours) on rtx-4090 at 1.800000 USD per GPU-hour, from the job.</p>`, receipts.FormatMicros(rc.CostMicros), rc.ActualMS, receipts.Hours(rc.ActualMS))
	if p := b.get(t, "/jobs/"+job.id); !strings.Contains(p.body, want) {
		t.Errorf("the job page does not show %s", want)
	}
	// The lists show it too.
	if p := b.get(t, "/jobs"); !strings.Contains(p.body, `<td class="num">`+receipts.FormatMicros(rc.CostMicros)+`</td>`) {
		t.Errorf("the jobs list does not show the cost")
	}
	if p := b.get(t, "/workers/"+job.workerID); !strings.Contains(p.body, `<td class="num">`+receipts.FormatMicros(rc.CostMicros)+`</td>`) {
		t.Errorf("the worker's history does not show the job's cost")
	}
}

func TestSpecRetire(t *testing.T) {
	t.Parallel()
	f := newFixture(t, nil)
	b := f.browser(t)
	b.signIn(t, f.env.OperatorToken)
	n := registerNode(t, f, "gpu-1")
	wp := "/workers/" + n.WorkerID

	// Refused without operator:workers, and nothing changes.
	tok, _, err := f.env.Server.Issuer().Mint(context.Background(), apitest.OperatorID, []credential.Scope{credential.ScopeOperatorJobs}, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	weak := f.browser(t)
	weak.signIn(t, tok)
	before := settled(t, f)
	p := weak.post(t, wp+"/retire", url.Values{"reason": {"x"}})
	mustContain(t, "retire refused", p, "Refused (403): this page needs operator:workers")
	if strings.Contains(p.body, "answered 404") {
		t.Fatalf("the control plane does not serve retire:\n%s", p.body)
	}
	if after := f.env.Dump(t); fmt.Sprint(before) != fmt.Sprint(after) {
		t.Fatal("a refused retire changed the state")
	}

	p = b.post(t, wp+"/retire", url.Values{"reason": {"decommissioned"}})
	mustContain(t, "retire", p, "Worker "+n.WorkerID+": retire done. Receipt ", `id="worker-status">retired`)
	if strings.Contains(p.body, `/retire"`) {
		t.Error("a retired worker still offers Retire")
	}
	if w := apiGet[wire.WorkerDetailResponse](t, f, "/operator/workers/"+n.WorkerID); w.Worker.Status != "retired" {
		t.Fatalf("worker status %q", w.Worker.Status)
	}
	// Twice is the first answer.
	p = b.post(t, wp+"/retire", url.Values{"reason": {"decommissioned"}})
	mustContain(t, "retire again", p, "retire done")
}

func TestSpecFilters(t *testing.T) {
	t.Parallel()
	f := newFixture(t, nil)
	b := f.browser(t)
	b.signIn(t, f.env.OperatorToken)
	a := registerNode(t, f, "gpu-a", "lab-a")
	c := registerNode(t, f, "gpu-c", "lab-c")
	ja := runJob(t, a, dispatch(t, b, url.Values{"job_type": {"status_check"}, "tags": {"lab-a"}}))
	jc := runJob(t, c, dispatch(t, b, url.Values{"job_type": {"status_check"}, "tags": {"lab-c"}}))
	other := dispatch(t, b, url.Values{"job_type": {"lora_train"}})
	for _, tc := range []struct {
		query     string
		want, not []string
	}{
		{"worker_id=" + a.WorkerID, []string{ja.id}, []string{jc.id, other}},
		{"tag=lab-c", []string{jc.id}, []string{ja.id, other}},
		{"job_type=lora_train&state=queued", []string{other}, []string{ja.id, jc.id}},
		{"worker_id=" + c.WorkerID + "&tag=lab-c&state=succeeded", []string{jc.id}, []string{ja.id, other}},
	} {
		p := b.get(t, "/jobs?"+tc.query)
		if p.code != http.StatusOK {
			t.Fatalf("%s: %d\n%s", tc.query, p.code, p.body)
		}
		ids := regexp.MustCompile(`<tr><td><a href="/console/jobs/(job_[0-9a-f]+)">`).FindAllStringSubmatch(p.body, -1)
		got := map[string]bool{}
		for _, m := range ids {
			got[m[1]] = true
		}
		for _, w := range tc.want {
			if !got[w] {
				t.Errorf("%s: %s is not listed", tc.query, w)
			}
		}
		for _, w := range tc.not {
			if got[w] {
				t.Errorf("%s: %s is listed", tc.query, w)
			}
		}
	}
}

// The overview shows, beside the spend, the GPU time no one was charged
// for, by reason, from GET /operator/costs.
func TestSpecUnbilledOverview(t *testing.T) {
	t.Parallel()
	f := newFixture(t, nil)
	b := f.browser(t)
	b.signIn(t, f.env.OperatorToken)
	n := registerNode(t, f, "gpu-1", "lab-a")
	id := dispatch(t, b, url.Values{"job_type": {"status_check"}, "gpu_sku": {"rtx-4090"}, "gpu_count": {"1"}})
	poll := wire.LeaseRequest{SupportedJobTypes: []string{"status_check"}, SupportedGPUSKUs: []string{"rtx-4090"}, MaxJobs: 1}
	l := apitest.Post[wire.LeaseResponse](t, n, "/workers/jobs/lease", poll, http.StatusOK)
	if l.Job == nil || l.Job.ID != id {
		t.Fatalf("lease = %+v, want job %s", l, id)
	}
	p := "/workers/jobs/" + id
	apitest.Post[wire.AcceptResponse](t, n, p+"/accept", wire.TokenRequest{LeaseToken: *l.LeaseToken}, http.StatusOK)
	apitest.Post[wire.FailResponse](t, n, p+"/fail", wire.FailRequest{LeaseToken: *l.LeaseToken, ErrorCode: "cuda_oom"}, http.StatusOK)
	rep := apiGet[wire.CostReport](t, f, "/operator/costs") // the failure committed before its answer
	if len(rep.Unbilled.Groups) != 1 || rep.Unbilled.Groups[0].Reason != "cuda_oom" {
		t.Fatalf("unbilled: %+v", rep.Unbilled)
	}
	g := rep.Unbilled.Groups[0]
	page := b.get(t, "/")
	row := fmt.Sprintf(`<tr><td>this month</td><td>cuda_oom</td><td class="num">1</td><td class="num">%d</td><td class="num">%s</td></tr>`, g.GPUMS, g.GPUHours)
	if !strings.Contains(page.body, row) {
		t.Errorf("the overview does not show the unbilled GPU time of cuda_oom (%s):\n%s", row, page.body)
	}
}
