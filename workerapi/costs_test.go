package workerapi_test

import (
	"context"
	"fmt"
	"net/http"
	"net/url"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/nodelane/nodelane/internal/apitest"
	"github.com/nodelane/nodelane/receipts"
	"github.com/nodelane/nodelane/workerapi"
	"github.com/nodelane/nodelane/workerapi/wire"
)

// costNode registers a node with gpus GPUs of sku (none when sku is "")
// that runs status_check and lora_train.
func costNode(t *testing.T, env *apitest.Env, nodeID, sku string, gpus int) *apitest.Node {
	t.Helper()
	n := env.NewNode(t, nodeID)
	n.Now = env.Clock.Now
	caps := wire.Capabilities{JobTypes: []string{"status_check", "lora_train"}}
	for range gpus {
		caps.GPUs = append(caps.GPUs, wire.GPU{SKU: sku, VRAMMB: 81920})
	}
	n.Register(t, wire.RegisterRequest{
		Name: nodeID, Hostname: nodeID + ".local", Role: "local_gpu_compute", Version: "worker/1.0.0",
		Capabilities: caps, GovernorLimits: wire.GovernorLimits{MaxJobs: 1, MaxVRAMMB: 81920 * gpus},
	})
	return n
}

// charged is a job_charged receipt with the job type of the job_completed
// receipt minted with it.
type charged struct {
	*receipts.Receipt
	jobType string
}

// chargedReceipts reads every job_charged receipt of the log through the
// kind filter, and the job type of each from its job_completed receipt.
func chargedReceipts(t *testing.T, env *apitest.Env) []charged {
	t.Helper()
	// Completions do not wait for their receipts to be sequenced, and
	// the log lists the sequenced ones: sequence what is pending first.
	if _, err := env.Server.Sequence(context.Background()); err != nil {
		t.Fatal(err)
	}
	var out []charged
	after := ""
	for {
		m := mustOp(t, env, http.StatusOK, "GET", "/operator/receipts?kind=job_charged&limit=1000"+after, nil)
		for _, w := range m["receipts"].([]any) {
			r := decodeReceipt(t, w)
			done := logReceipt(t, env, strings.TrimSuffix(r.ID, ".charge"))
			if done.Kind != receipts.KindJobCompleted || done.JobID != r.JobID {
				t.Fatalf("charge %s: completion %+v", r.ID, done)
			}
			out = append(out, charged{r, done.JobType})
		}
		next, ok := m["next"].(float64)
		if !ok {
			return out
		}
		after = fmt.Sprintf("&after=%d", int64(next))
	}
}

// wantCosts sums rs as GET /operator/costs must: those whose server_time
// is in [from, to), by key, in integers.
func wantCosts(rs []charged, from, to time.Time, groupBy string) (groups []wire.CostGroup, total wire.CostSum) {
	type sum struct{ jobs, ms, gpuMS, micros int64 }
	by := map[string]*sum{}
	var all sum
	for _, r := range rs {
		if r.ServerTime.Before(from) || !r.ServerTime.Before(to) {
			continue
		}
		key := map[string]string{"sku": r.GPUSKU, "worker": r.WorkerID, "job_type": r.jobType}[groupBy]
		if by[key] == nil {
			by[key] = &sum{}
		}
		for _, s := range []*sum{by[key], &all} {
			s.jobs++
			s.ms += r.ActualMS
			s.gpuMS += r.ActualMS * r.GPUCount
			s.micros += r.CostMicros
		}
	}
	toWire := func(s sum) wire.CostSum {
		return wire.CostSum{Jobs: s.jobs, ActualMS: s.ms, GPUHours: receipts.Hours(s.gpuMS), CostMicroUSD: s.micros, CostUSD: receipts.FormatMicros(s.micros)}
	}
	groups = []wire.CostGroup{}
	for _, k := range slices.Sorted(func(yield func(string) bool) {
		for k := range by {
			if !yield(k) {
				return
			}
		}
	}) {
		groups = append(groups, wire.CostGroup{Key: k, CostSum: toWire(*by[k])})
	}
	return groups, toWire(all)
}

// getCosts asks GET /operator/costs with query and decodes the report.
func getCosts(t *testing.T, env *apitest.Env, query string) wire.CostReport {
	t.Helper()
	m := mustOp(t, env, http.StatusOK, "GET", "/operator/costs"+query, nil)
	exactKeys(t, "cost report", m, "from", "to", "group_by", "groups", "total", "unbilled")
	exactKeys(t, "cost total", m["total"].(obj), "jobs", "actual_ms", "gpu_hours", "cost_micro_usd", "cost_usd")
	for _, g := range m["groups"].([]any) {
		exactKeys(t, "cost group", g.(obj), "key", "jobs", "actual_ms", "gpu_hours", "cost_micro_usd", "cost_usd")
	}
	u := m["unbilled"].(obj)
	exactKeys(t, "unbilled", u, "groups", "total")
	exactKeys(t, "unbilled total", u["total"].(obj), "attempts", "actual_ms", "gpu_ms", "gpu_hours")
	for _, g := range u["groups"].([]any) {
		exactKeys(t, "unbilled group", g.(obj), "reason", "attempts", "actual_ms", "gpu_ms", "gpu_hours")
	}
	var rep wire.CostReport
	remarshalJSON(t, m, &rep)
	return rep
}

// Job views carry the charge of their job_charged receipt, and GET
// /operator/costs sums the job_charged receipts of a range, for each
// group_by, to the micro-USD.
func TestOperatorCosts(t *testing.T) {
	t.Parallel()
	onDialects(t, func(t *testing.T, d string) {
		env := newOpEnv(t, d, apitest.WithConfig(func(c *workerapi.Config) {
			c.Prices = receipts.Prices{BySKU: map[string]int64{"rtx-4090": 1_802_000, "a100": 3_333_333}, Default: 777_777}
		}))
		activateEnvelope(t, env)
		a := costNode(t, env, "node-a", "rtx-4090", 1)
		b := costNode(t, env, "node-b", "a100", 2)
		cpu := costNode(t, env, "node-cpu", "", 0)

		// run dispatches a job, has n run it for d, and returns its id.
		run := func(n *apitest.Node, typ string, req obj, d time.Duration) string {
			t.Helper()
			body := obj{"job_type": typ}
			if req != nil {
				body["requirements"] = req
			}
			want := dispatchJob(t, env, body)["job"].(obj)["id"].(string)
			id, tok := runOne(t, n, typ)
			if id != want {
				t.Fatalf("%s ran %s, want %s", n.NodeID, id, want)
			}
			env.Clock.Advance(d)
			completeJob(t, n, id, tok)
			return id
		}
		// Three phases a minute apart; the window is the second.
		var jobs []string
		phase := func(k int) {
			jobs = append(jobs,
				run(a, "status_check", obj{"gpu_sku": "rtx-4090"}, time.Duration(1234+k)*time.Millisecond),
				run(b, "lora_train", obj{"gpu_sku": "a100", "gpu_count": 2}, time.Duration(4321+k)*time.Millisecond),
				run(b, "status_check", obj{"gpu_sku": "a100"}, 999*time.Millisecond),
				run(cpu, "status_check", nil, 1500*time.Millisecond),
				run(a, "lora_train", nil, time.Duration(2000+7*k)*time.Millisecond),
			)
			env.Clock.Advance(time.Minute)
		}
		phase(1)
		phase(2)
		phase(3)
		// A job that failed, and one still queued, are not charged.
		failed := dispatchJob(t, env, obj{"job_type": "status_check", "max_attempts": 1})["job"].(obj)["id"].(string)
		id, tok := runOne(t, cpu, "status_check")
		signedCall(t, cpu, http.StatusOK, "/workers/jobs/"+id+"/fail", obj{"lease_token": tok, "error_code": "bad_input", "retryable": false})
		queued := dispatchJob(t, env, obj{"job_type": "status_check", "requirements": obj{"gpu_sku": "h100"}})["job"].(obj)["id"].(string)

		rs := chargedReceipts(t, env)
		if len(rs) != len(jobs) {
			t.Fatalf("%d job_charged receipts, want %d", len(rs), len(jobs))
		}
		// Job views: the charge of the job's receipt, in both views.
		byJob := map[string]charged{}
		for _, r := range rs {
			byJob[r.JobID] = r
		}
		listed := map[string]obj{}
		for _, j := range mustOp(t, env, http.StatusOK, "GET", "/operator/jobs?limit=1000", nil)["jobs"].([]any) {
			listed[j.(obj)["id"].(string)] = j.(obj)
		}
		for _, id := range jobs {
			r := byJob[id]
			want := obj{"actual_ms": float64(r.ActualMS), "actual_hours": receipts.Hours(r.ActualMS),
				"actual_cost_usd": receipts.FormatMicros(r.CostMicros), "actual_cost_micro_usd": float64(r.CostMicros)}
			detail := mustOp(t, env, http.StatusOK, "GET", "/operator/jobs/"+id, nil)["job"].(obj)
			for name, view := range map[string]obj{"detail": detail, "list": listed[id]} {
				got := obj{}
				for k := range want {
					got[k] = view[k]
				}
				if d := cmp.Diff(want, got); d != "" {
					t.Errorf("job %s %s view charge (-receipt +view):\n%s", id, name, d)
				}
			}
		}
		for _, id := range []string{failed, queued} {
			for _, view := range []obj{mustOp(t, env, http.StatusOK, "GET", "/operator/jobs/"+id, nil)["job"].(obj), listed[id]} {
				for _, k := range []string{"actual_ms", "actual_hours", "actual_cost_usd", "actual_cost_micro_usd"} {
					if v, ok := view[k]; !ok || v != nil {
						t.Errorf("job %s (%s): %s = %v, want null", id, view["state"], k, v)
					}
				}
			}
		}

		// The window: from the first charge of phase 2 (included) to the
		// first of phase 3 (excluded).
		from, to := byJob[jobs[5]].ServerTime, byJob[jobs[10]].ServerTime
		q := "?from=" + url.QueryEscape(from.Format(time.RFC3339Nano)) + "&to=" + url.QueryEscape(to.Format(time.RFC3339Nano))
		for _, groupBy := range []string{"sku", "worker", "job_type"} {
			rep := getCosts(t, env, q+"&group_by="+groupBy)
			groups, total := wantCosts(rs, from, to, groupBy)
			if total.Jobs != 5 {
				t.Fatalf("the window holds %d charges, want 5", total.Jobs)
			}
			if len(groups) < 2 {
				t.Fatalf("group_by %s: %d groups, want several", groupBy, len(groups))
			}
			// Nothing failed in the window: nothing is unbilled.
			want := wire.CostReport{From: from, To: to, GroupBy: groupBy, Groups: groups, Total: total,
				Unbilled: wire.Unbilled{Groups: []wire.UnbilledGroup{}, Total: wire.UnbilledSum{GPUHours: "0.000000"}}}
			if d := cmp.Diff(want, rep); d != "" {
				t.Errorf("group_by %s (-want +got):\n%s", groupBy, d)
			}
			var sum int64
			for _, g := range rep.Groups {
				sum += g.CostMicroUSD
			}
			if sum != rep.Total.CostMicroUSD {
				t.Errorf("group_by %s: groups sum to %d, total %d", groupBy, sum, rep.Total.CostMicroUSD)
			}
		}
		// The whole history; and group_by defaults to sku.
		all := "?from=" + url.QueryEscape(byJob[jobs[0]].ServerTime.Format(time.RFC3339Nano)) + "&to=" + url.QueryEscape(env.Clock.Now().Add(time.Second).Format(time.RFC3339Nano))
		rep := getCosts(t, env, all)
		groups, total := wantCosts(rs, rep.From, rep.To, "sku")
		if rep.GroupBy != "sku" || total.Jobs != int64(len(jobs)) || !cmp.Equal(groups, rep.Groups) || rep.Total != total {
			t.Errorf("the whole history: %+v, want groups %+v total %+v", rep, groups, total)
		}
		// Defaults: from the start of the current UTC month to now.
		t0 := env.Clock.Now().UTC().Truncate(time.Microsecond)
		rep = getCosts(t, env, "")
		t1 := env.Clock.Now().UTC()
		if want := time.Date(rep.To.Year(), rep.To.Month(), 1, 0, 0, 0, 0, time.UTC); !rep.From.Equal(want) || rep.To.Before(t0) || rep.To.After(t1) {
			t.Errorf("default range %s .. %s, want %s .. now (%s to %s)", rep.From, rep.To, want, t0, t1)
		}
		if groups, total := wantCosts(rs, rep.From, rep.To, "sku"); !cmp.Equal(groups, rep.Groups) || rep.Total != total {
			t.Errorf("default range: %+v, want groups %+v total %+v", rep, groups, total)
		}
		// Relative: an age before the server's now, and a date.
		t0 = env.Clock.Now().UTC()
		rep = getCosts(t, env, "?from=2d")
		t1 = env.Clock.Now().UTC()
		if rep.From.Before(t0.Add(-48*time.Hour).Truncate(time.Microsecond)) || rep.From.After(t1.Add(-48*time.Hour)) {
			t.Errorf("from=2d: %s, want 48h before now (%s to %s)", rep.From, t0, t1)
		}
		if groups, total := wantCosts(rs, rep.From, rep.To, "sku"); !cmp.Equal(groups, rep.Groups) || rep.Total != total {
			t.Errorf("from=2d: %+v, want groups %+v total %+v", rep, groups, total)
		}
		rep = getCosts(t, env, "?from=2020-01-01&to=2020-02-01")
		if !rep.From.Equal(time.Date(2020, 1, 1, 0, 0, 0, 0, time.UTC)) || !rep.To.Equal(time.Date(2020, 2, 1, 0, 0, 0, 0, time.UTC)) {
			t.Errorf("dates: %s .. %s", rep.From, rep.To)
		}
		// An empty window.
		rep = getCosts(t, env, "?from=2020-01-01T00:00:00Z&to=2020-02-01T00:00:00Z&group_by=worker")
		if len(rep.Groups) != 0 || rep.Total != (wire.CostSum{GPUHours: "0.000000", CostUSD: "0.000000"}) {
			t.Errorf("an empty window: %+v", rep)
		}

		// Bad requests.
		before := env.Dump(t)
		for _, bad := range []string{
			"?from=yesterday", "?to=2026-13-01T00:00:00Z", "?from=2026-11-01x", "?from=", "?to=",
			"?from=-24h", "?from=7x", "?from=100001d", "?to=1.5d", "?from=2d&to=3d",
			"?from=2026-11-02T00:00:00Z&to=2026-11-01T00:00:00Z",
			"?from=2026-11-01T00:00:00Z&to=2026-11-01T00:00:00Z",
			"?from=2025-01-01T00:00:00Z&to=2026-01-02T00:00:01Z",
			"?group_by=gpu", "?group_by=", "?group_by=SKU", "?group_by=sku&group_by=worker",
			"?from=2026-11-01T00:00:00Z&from=2026-11-02T00:00:00Z", "?kind=job_charged",
		} {
			st, m := op(t, env, "GET", "/operator/costs"+bad, nil)
			wantOpError(t, bad, st, m, http.StatusBadRequest, wire.CodeInvalidRequest)
		}
		// 366 days is the longest range.
		getCosts(t, env, "?from=2025-01-01T00:00:00Z&to=2026-01-02T00:00:00Z")
		stateUnchanged(t, env, "bad cost reports", before)
	})
}

// GET /operator/costs shows, beside the charges, the GPU time no one was
// charged for, by reason: the actual_ms × gpu_count of every job_failed
// receipt of the window, exactly, and in hours.
func TestOperatorCostsUnbilled(t *testing.T) {
	t.Parallel()
	onDialects(t, func(t *testing.T, d string) {
		env, n := boundsEnv(t, d)
		env.Clock.Set(time.Now().UTC().Truncate(time.Millisecond))
		from := env.Clock.Now().UTC()
		runFor := func(t *testing.T, dur time.Duration) (string, string) {
			t.Helper()
			beat(t, n)
			want := gpuJob(t, env, nil)
			id, tok := runOne(t, n, "status_check")
			if id != want {
				t.Fatalf("ran %s, want %s", id, want)
			}
			env.Clock.Advance(dur)
			return id, tok
		}
		// Two failures with the worker's own code, 2 s and 3.5 s.
		for _, dur := range []time.Duration{2 * time.Second, 3500 * time.Millisecond} {
			id, tok := runFor(t, dur)
			signedCall(t, n, http.StatusOK, "/workers/jobs/"+id+"/fail", obj{"lease_token": tok, "error_code": "oom"})
		}
		// A TTL expiry after accept: the whole lease.
		id, _ := runFor(t, workerapi.DefaultLeaseTTL)
		if err := env.Server.MaintainOnce(context.Background()); err != nil {
			t.Fatal(err)
		}
		mustOp(t, env, http.StatusOK, "POST", "/operator/jobs/"+id+"/cancel", nil)
		// A completion is charged, not unbilled.
		id, tok := runFor(t, time.Second)
		completeJob(t, n, id, tok)

		rep := getCosts(t, env, "?from="+url.QueryEscape(from.Format(time.RFC3339Nano))+"&to="+url.QueryEscape(env.Clock.Now().Add(time.Second).Format(time.RFC3339Nano)))
		ttl := workerapi.DefaultLeaseTTL.Milliseconds()
		want := wire.Unbilled{
			Groups: []wire.UnbilledGroup{
				{Reason: "lease_expired", UnbilledSum: wire.UnbilledSum{Attempts: 1, ActualMS: ttl, GPUMS: ttl, GPUHours: receipts.Hours(ttl)}},
				{Reason: "oom", UnbilledSum: wire.UnbilledSum{Attempts: 2, ActualMS: 5500, GPUMS: 5500, GPUHours: "0.001528"}},
			},
			Total: wire.UnbilledSum{Attempts: 3, ActualMS: ttl + 5500, GPUMS: ttl + 5500, GPUHours: receipts.Hours(ttl + 5500)},
		}
		if d := cmp.Diff(want, rep.Unbilled); d != "" {
			t.Fatalf("unbilled (-want +got):\n%s", d)
		}
		if rep.Total.Jobs != 1 || rep.Total.ActualMS != 1000 {
			t.Fatalf("charges: %+v", rep.Total)
		}
		// An empty window has nothing unbilled.
		rep = getCosts(t, env, "?from=2020-01-01T00:00:00Z&to=2020-02-01T00:00:00Z")
		if d := cmp.Diff(wire.Unbilled{Groups: []wire.UnbilledGroup{}, Total: wire.UnbilledSum{GPUHours: "0.000000"}}, rep.Unbilled); d != "" {
			t.Fatalf("an empty window's unbilled (-want +got):\n%s", d)
		}
	})
}
