package cmd

// End-to-end tests of the nodelanectl commands that need the operator
// API completions of issue 14 (docs/PROTOCOL.md §13): GET /operator/costs,
// the cost fields of job views, the receipts' kind= and the jobs'
// worker_id= and tag= filters, and POST /operator/workers/{id}/retire.

import (
	"encoding/json"
	"sort"
	"strings"
	"testing"

	"github.com/nodelane/nodelane/receipts"
	"github.com/nodelane/nodelane/workerapi/wire"
)

// costReportJSON is GET /operator/costs's answer.
type costReportJSON struct {
	From    string `json:"from"`
	To      string `json:"to"`
	GroupBy string `json:"group_by"`
	Groups  []struct {
		Key          string `json:"key"`
		Jobs         int64  `json:"jobs"`
		ActualMS     int64  `json:"actual_ms"`
		CostMicroUSD int64  `json:"cost_micro_usd"`
		CostUSD      string `json:"cost_usd"`
	} `json:"groups"`
	Total struct {
		Jobs         int64  `json:"jobs"`
		ActualMS     int64  `json:"actual_ms"`
		CostMicroUSD int64  `json:"cost_micro_usd"`
		CostUSD      string `json:"cost_usd"`
	} `json:"total"`
}

// TestNodelanectlSpecCostReport checks that `nodelanectl cost report`
// matches the sum of the job_charged receipts to the micro-USD.
func TestNodelanectlSpecCostReport(t *testing.T) {
	t.Parallel()
	c := newCluster(t)
	c.startWorker("node-a")
	wid := c.workerID("node-a")
	x := newCtl(t, c)

	var ids []string
	for _, typ := range []string{"status_check", "embedding_dry_run", "status_check"} {
		d := c.dispatch(typ, nil)
		c.checkSucceeded(c.waitDone(d.Job.ID, "succeeded"))
		ids = append(ids, d.Job.ID)
	}
	// The sum of the job_charged receipts, and by job type (the
	// receipts carry no job type: the jobs do).
	var want, wantMS int64
	byType := map[string]int64{}
	for _, w := range c.allReceipts() {
		if w.Kind != receipts.KindJobCharged {
			continue
		}
		r, err := receipts.Decode(w.Body)
		if err != nil {
			t.Fatal(err)
		}
		want += r.CostMicros
		wantMS += r.ActualMS
		byType[c.job(r.JobID).Job.JobType] += r.CostMicros
	}
	if want == 0 {
		t.Fatal("the jobs cost nothing: the test would prove nothing")
	}

	for _, by := range []string{"sku", "worker", "job_type"} {
		r := x.fail(0, nil, "-server", c.base(), "-token-file", x.tokFile, "cost", "report", "-by", by, "-o", "json")
		var rep costReportJSON
		if err := json.Unmarshal([]byte(r.stdout), &rep); err != nil {
			t.Fatalf("cost report -by %s -o json: %v\n%s", by, err, r.stdout)
		}
		if rep.GroupBy != by || rep.Total.CostMicroUSD != want || rep.Total.CostUSD != receipts.FormatMicros(want) || rep.Total.ActualMS != wantMS || rep.Total.Jobs != 3 {
			t.Errorf("cost report -by %s: total %+v, want %d micro-USD over %d ms in 3 jobs", by, rep.Total, want, wantMS)
		}
		mustContain(t, "the check", r.stderr, "check: the 3 job_charged receipts of the window sum to "+receipts.FormatMicros(want)+" USD")
		var sum int64
		keys := []string{}
		for _, g := range rep.Groups {
			sum += g.CostMicroUSD
			keys = append(keys, g.Key)
		}
		if sum != want || !sort.StringsAreSorted(keys) {
			t.Errorf("cost report -by %s: groups %v sum to %d, want %d, sorted by key", by, keys, sum, want)
		}
		switch by {
		case "sku":
			if len(rep.Groups) != 1 || rep.Groups[0].Key != "rtx-4090" {
				t.Errorf("by sku: %+v", rep.Groups)
			}
		case "worker":
			if len(rep.Groups) != 1 || rep.Groups[0].Key != wid {
				t.Errorf("by worker: %+v", rep.Groups)
			}
		case "job_type":
			for _, g := range rep.Groups {
				if g.CostMicroUSD != byType[g.Key] {
					t.Errorf("by job_type: %s costs %d, its receipts %d", g.Key, g.CostMicroUSD, byType[g.Key])
				}
			}
		}
	}
	out := x.run("cost", "report", "-by", "worker")
	mustContain(t, "cost report", out, "WORKER", wid, "TOTAL", receipts.FormatMicros(want))
	// A window with nothing in it.
	var rep costReportJSON
	x.runJSON(&rep, "cost", "report", "-from", "2020-01-01T00:00:00Z", "-to", "2020-02-01T00:00:00Z")
	if rep.Total.CostMicroUSD != 0 || rep.Total.Jobs != 0 {
		t.Errorf("an empty window: %+v", rep.Total)
	}

	// The jobs' cost fields.
	var jd struct {
		Job struct {
			ActualCostUSD      *string `json:"actual_cost_usd"`
			ActualCostMicroUSD *int64  `json:"actual_cost_micro_usd"`
		} `json:"job"`
	}
	var perJob int64
	for _, id := range ids {
		x.runJSON(&jd, "jobs", "show", id)
		if jd.Job.ActualCostMicroUSD == nil || jd.Job.ActualCostUSD == nil || *jd.Job.ActualCostUSD != receipts.FormatMicros(*jd.Job.ActualCostMicroUSD) {
			t.Fatalf("job %s cost fields: %+v", id, jd.Job)
		}
		perJob += *jd.Job.ActualCostMicroUSD
		mustContain(t, "jobs show", x.run("jobs", "show", id), "cost_usd", *jd.Job.ActualCostUSD)
	}
	if perJob != want {
		t.Errorf("the jobs cost %d micro-USD, their receipts %d", perJob, want)
	}
}

// TestNodelanectlSpecFiltersAndRetire checks the jobs' -worker and -tag
// filters and workers retire.
func TestNodelanectlSpecFiltersAndRetire(t *testing.T) {
	t.Parallel()
	c := newCluster(t)
	c.startWorker("node-a")
	wid := c.workerID("node-a")
	x := newCtl(t, c)

	d := c.dispatch("status_check", nil)
	c.waitDone(d.Job.ID, "succeeded")
	var tagged wire.DispatchResponse
	x.runJSON(&tagged, "jobs", "submit", "-type", "status_check", "-tag", "lab-q")

	var l wire.JobListResponse
	x.runJSON(&l, "jobs", "list", "-worker", wid)
	if len(l.Jobs) != 1 || l.Jobs[0].ID != d.Job.ID {
		t.Errorf("jobs list -worker: %+v", l.Jobs)
	}
	x.runJSON(&l, "jobs", "list", "-tag", "lab-q", "-state", "queued")
	if len(l.Jobs) != 1 || l.Jobs[0].ID != tagged.Job.ID {
		t.Errorf("jobs list -tag: %+v", l.Jobs)
	}
	mustContain(t, "jobs list -worker", x.run("jobs", "list", "-worker", wid), d.Job.ID)
	x.runJSON(&l, "jobs", "list", "-worker", "wrk_nobody")
	if len(l.Jobs) != 0 {
		t.Errorf("jobs list -worker wrk_nobody: %+v", l.Jobs)
	}

	var wr wire.WorkerResponse
	x.runJSON(&wr, "workers", "retire", wid, "-reason", "decommissioned")
	if wr.Worker.Status != "retired" || wr.ReceiptID == nil {
		t.Errorf("retire: %+v", wr)
	}
	out := x.run("workers", "retire", wid, "-reason", "decommissioned")
	mustContain(t, "retire again", out, wid, "retired")
	mustContain(t, "workers list", x.run("workers", "list"), wid, "retired")
	r := x.fail(4, nil, "-server", c.base(), "-token-file", x.tokFile, "workers", "retire", "wrk_nobody")
	mustContain(t, "retire of no worker", r.stderr, "404 not_found")
	if !strings.Contains(x.run("jobs", "show", tagged.Job.ID), "queued") {
		t.Error("the tagged job left the queue")
	}
}
