package prommetrics_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	dto "github.com/prometheus/client_model/go"

	"github.com/nodelane/nodelane/internal/apitest"
	"github.com/nodelane/nodelane/lease"
	"github.com/nodelane/nodelane/receipts"
	"github.com/nodelane/nodelane/workerapi"
	"github.com/nodelane/nodelane/workerapi/prommetrics"
	"github.com/nodelane/nodelane/workerapi/wire"
)

// series returns the families of reg by name, and fails the test if
// the registry does not gather or lint.
func series(t *testing.T, reg *prometheus.Registry) map[string]*dto.MetricFamily {
	t.Helper()
	if problems, err := testutil.GatherAndLint(reg); err != nil || len(problems) > 0 {
		t.Fatalf("lint: %v %+v", err, problems)
	}
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]*dto.MetricFamily{}
	for _, mf := range mfs {
		out[mf.GetName()] = mf
	}
	return out
}

// find returns the metric of family name whose labels are labels
// ("k=v,k=v" in label name order), or nil.
func find(fams map[string]*dto.MetricFamily, name, labels string) *dto.Metric {
	for _, m := range fams[name].GetMetric() {
		var l []string
		for _, lp := range m.GetLabel() {
			l = append(l, lp.GetName()+"="+lp.GetValue())
		}
		if strings.Join(l, ",") == labels {
			return m
		}
	}
	return nil
}

// value returns the value of a counter or gauge series, or a
// histogram's sample count and sum; it fails the test if the series is
// missing.
func value(t *testing.T, fams map[string]*dto.MetricFamily, name, labels string) (float64, float64) {
	t.Helper()
	m := find(fams, name, labels)
	if m == nil {
		var have []string
		for _, m := range fams[name].GetMetric() {
			have = append(have, fmt.Sprint(m.GetLabel()))
		}
		t.Fatalf("no series %s{%s}; have %v", name, labels, have)
	}
	switch {
	case m.Counter != nil:
		return m.GetCounter().GetValue(), 0
	case m.Gauge != nil:
		return m.GetGauge().GetValue(), 0
	case m.Histogram != nil:
		return float64(m.GetHistogram().GetSampleCount()), m.GetHistogram().GetSampleSum()
	}
	t.Fatalf("series %s{%s} is no counter, gauge or histogram", name, labels)
	return 0, 0
}

// A real Server on SQLite, driven over HTTP on a clock the test holds:
// every lease granted is one observation of the dispatch-to-lease
// latency (a lease granted and accepted in one request too), each end
// counts once by type and outcome with its runtime, a completion adds
// its charge, and the scrape-time gauges read the queue's age, the jobs
// nothing can lease and why, the envelope and the fleet. A type no
// registered worker declares is "other".
func TestJobSeriesFromARealServer(t *testing.T) {
	t.Parallel()
	reg := prometheus.NewPedanticRegistry()
	m, err := prommetrics.New(reg)
	if err != nil {
		t.Fatal(err)
	}
	const price = 12_000_000 // micro-USD per GPU-hour: 1,000,000 for 5 minutes
	env := apitest.New(t, "sqlite", apitest.WithConfig(func(c *workerapi.Config) {
		c.Metrics = m
		c.Prices = receipts.Prices{BySKU: map[string]int64{"a100": price}}
		c.Lease.HeartbeatInterval = 10 * time.Minute
	}))
	env.Clock.Set(time.Now().UTC().Add(time.Second).Truncate(time.Second))
	reg.MustRegister(m.StatsCollector(env.Server, nil))

	n := env.NewNode(t, "node-1")
	n.Now = env.Clock.Now
	n.Register(t, wire.RegisterRequest{Capabilities: wire.Capabilities{
		JobTypes: []string{"status_check"}, GPUs: []wire.GPU{{SKU: "a100", VRAMMB: 81920}},
	}, GovernorLimits: wire.GovernorLimits{MaxJobs: 4}})
	banned := env.NewNode(t, "node-2")
	banned.Now = env.Clock.Now
	reg2 := banned.Register(t, wire.RegisterRequest{Capabilities: wire.Capabilities{JobTypes: []string{"status_check"}}})
	if code, b := env.Operator(t, http.MethodPost, "/operator/workers/"+reg2.WorkerID+"/ban", obj{"reason": "test"}); code != http.StatusOK {
		t.Fatalf("ban: %d %s", code, b)
	}

	gpu := lease.Requirements{GPUSKU: "a100", GPUCount: 1}
	done := env.Enqueue(t, lease.NewJob{Type: "status_check", Payload: json.RawMessage(`{}`), Requirements: gpu})
	lreq := obj{"supported_job_types": []string{"status_check"}, "max_jobs": 1}

	// Waits 30 s queued, then runs 5 minutes and succeeds: charged a
	// twelfth of the price (within the lease TTL and the heartbeat
	// window, so that nothing expires).
	env.Clock.Advance(30 * time.Second)
	g := call(t, n, http.StatusOK, "/workers/jobs/lease", lreq)
	tok := g["lease_token"].(string)
	call(t, n, http.StatusOK, "/workers/jobs/"+done.ID+"/accept", obj{"lease_token": tok})
	env.Clock.Advance(5 * time.Minute)
	call(t, n, http.StatusOK, "/workers/jobs/"+done.ID+"/complete", obj{"lease_token": tok})

	// Leased and accepted in one request, runs 10 s and fails for good.
	failed := env.Enqueue(t, lease.NewJob{Type: "status_check", Payload: json.RawMessage(`{}`), MaxAttempts: 1})
	env.Clock.Advance(5 * time.Second)
	g = call(t, n, http.StatusOK, "/workers/jobs/lease", obj{"supported_job_types": []string{"status_check"}, "max_jobs": 1, "accept": true})
	tok = g["lease_token"].(string)
	env.Clock.Advance(10 * time.Second)
	call(t, n, http.StatusOK, "/workers/jobs/"+failed.ID+"/fail", obj{"lease_token": tok, "error_code": "boom", "message": "boom"})

	// Canceled while queued: finished, never run.
	canceled := env.Enqueue(t, lease.NewJob{Type: "status_check", Payload: json.RawMessage(`{}`)})
	if code, b := env.Operator(t, http.MethodPost, "/operator/jobs/"+canceled.ID+"/cancel", nil); code != http.StatusOK {
		t.Fatalf("cancel: %d %s", code, b)
	}

	// Left queued: a type the envelope blocks and no worker declares, and
	// a status_check on a SKU no worker has.
	env.Enqueue(t, lease.NewJob{Type: "raw_training", Payload: json.RawMessage(`{}`)})
	env.Enqueue(t, lease.NewJob{Type: "mystery_type", Payload: json.RawMessage(`{}`)})
	env.Clock.Advance(20 * time.Second)
	env.Enqueue(t, lease.NewJob{Type: "status_check", Payload: json.RawMessage(`{}`), Requirements: lease.Requirements{GPUSKU: "h100", GPUCount: 1}})
	env.Clock.Advance(40 * time.Second)

	fams := series(t, reg)
	// One observation per lease granted, 2, however it was granted.
	granted, _ := value(t, fams, "nodelane_leases_total", "outcome=granted")
	waits, waited := value(t, fams, "nodelane_job_dispatch_to_lease_seconds", "type=status_check")
	if granted != 2 || waits != granted || waited != 35 {
		t.Errorf("leases granted %v; dispatch-to-lease observations %v summing %vs, want 2 summing 35s", granted, waits, waited)
	}
	for _, c := range []struct {
		outcome       string
		n, runs, secs float64
	}{
		{"succeeded", 1, 1, 300},
		{"failed", 1, 1, 10},
		{"canceled", 1, 0, 0},
	} {
		if got, _ := value(t, fams, "nodelane_jobs_finished_total", "outcome="+c.outcome+",type=status_check"); got != c.n {
			t.Errorf("jobs finished %s: %v, want %v", c.outcome, got, c.n)
		}
		if c.runs == 0 {
			if find(fams, "nodelane_job_runtime_seconds", "outcome="+c.outcome+",type=status_check") != nil {
				t.Errorf("a runtime for a job %s before it ran", c.outcome)
			}
			continue
		}
		if runs, secs := value(t, fams, "nodelane_job_runtime_seconds", "outcome="+c.outcome+",type=status_check"); runs != c.runs || secs != c.secs {
			t.Errorf("runtime of jobs %s: %v observations summing %vs, want %v summing %vs", c.outcome, runs, secs, c.runs, c.secs)
		}
	}
	if got, _ := value(t, fams, "nodelane_charged_micro_usd_total", "type=status_check"); got != price/12 {
		t.Errorf("charged %v micro-USD, want %d", got, price/12)
	}

	// The gauges, read from the database when scraped.
	for _, c := range []struct {
		name, labels string
		want         float64
	}{
		{"nodelane_queue_jobs", "state=queued,type=other", 1},
		{"nodelane_queue_jobs", "state=queued,type=raw_training", 1},
		{"nodelane_queue_jobs", "state=queued,type=status_check", 1},
		{"nodelane_queue_oldest_job_age_seconds", "type=other", 60},
		{"nodelane_queue_oldest_job_age_seconds", "type=raw_training", 60},
		{"nodelane_queue_oldest_job_age_seconds", "type=status_check", 40},
		{"nodelane_queue_unleasable_jobs", "reason=type_not_allowed", 2},
		{"nodelane_queue_unleasable_jobs", "reason=gpu_sku", 1},
		{"nodelane_queue_unleasable_jobs", "reason=max_jobs", 0},
		{"nodelane_queue_unleasable_truncated", "", 0},
		{"nodelane_envelope_active", "", 0},
		{"nodelane_fleet_workers", "approval=approved,banned=false,liveness=online", 1},
		{"nodelane_fleet_workers", "approval=approved,banned=true,liveness=online", 1},
		{"nodelane_fleet_workers", "approval=pending,banned=false,liveness=online", 0},
		{"nodelane_fleet_workers_truncated", "", 0},
	} {
		if got, _ := value(t, fams, c.name, c.labels); got != c.want {
			t.Errorf("%s{%s} = %v, want %v", c.name, c.labels, got, c.want)
		}
	}
	if find(fams, "nodelane_queue_jobs", "state=queued,type=mystery_type") != nil {
		t.Error("a job type no worker declares has a series of its own")
	}
	if b := fams["nodelane_build_info"].GetMetric(); len(b) != 1 || b[0].GetGauge().GetValue() != 1 ||
		b[0].GetLabel()[0].GetName() != "go_version" || b[0].GetLabel()[0].GetValue() != runtime.Version() {
		t.Errorf("build_info %v, want one series at 1 with go_version %s", b, runtime.Version())
	}

	// A lease that runs past its TTL on the last attempt: the
	// maintainer's expiry ends the job failed, counted once with its
	// runtime; the lease was one more observation.
	expiring := env.Enqueue(t, lease.NewJob{Type: "status_check", Payload: json.RawMessage(`{}`), MaxAttempts: 1})
	g = call(t, n, http.StatusOK, "/workers/jobs/lease", obj{"supported_job_types": []string{"status_check"}, "max_jobs": 1, "accept": true})
	if id := g["job"].(map[string]any)["id"]; id != expiring.ID {
		t.Fatalf("leased %v, want %s", id, expiring.ID)
	}
	env.Clock.Advance(workerapi.DefaultLeaseTTL + time.Second)
	if err := env.Server.MaintainOnce(context.Background()); err != nil {
		t.Fatal(err)
	}
	fams = series(t, reg)
	granted, _ = value(t, fams, "nodelane_leases_total", "outcome=granted")
	waits, _ = value(t, fams, "nodelane_job_dispatch_to_lease_seconds", "type=status_check")
	expired, _ := value(t, fams, "nodelane_leases_total", "outcome=expired")
	finished, _ := value(t, fams, "nodelane_jobs_finished_total", "outcome=failed,type=status_check")
	runs, _ := value(t, fams, "nodelane_job_runtime_seconds", "outcome=failed,type=status_check")
	if granted != 3 || waits != 3 || expired != 1 || finished != 2 || runs != 2 {
		t.Errorf("after an expiry: granted %v, dispatch-to-lease observations %v, expired %v, failed %v, failed runtimes %v; want 3 3 1 2 2",
			granted, waits, expired, finished, runs)
	}

	// The envelope activated: the gauge follows.
	if code, b := env.Operator(t, http.MethodPost, "/operator/envelope/activate", obj{"reason": "test"}); code != http.StatusOK {
		t.Fatalf("activate: %d %s", code, b)
	}
	if got, _ := value(t, series(t, reg), "nodelane_envelope_active", ""); got != 1 {
		t.Errorf("envelope_active after an activation: %v, want 1", got)
	}
}

// Config.MaxJobTypes caps the types learned: the others, past the cap,
// are "other", in the counters and the scrape-time gauges alike; the
// envelope's canonical types (status_check) and the configured ones
// (type_z) keep their name without counting. An invalid Config is an
// error wrapping ErrConfig.
func TestJobTypeCap(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		name string
		cfg  prommetrics.Config
	}{
		{"negative", prommetrics.Config{MaxJobTypes: -1}},
	} {
		if _, err := prommetrics.NewWithConfig(prometheus.NewRegistry(), &c.cfg); !errors.Is(err, prommetrics.ErrConfig) {
			t.Errorf("%s: %v, want ErrConfig", c.name, err)
		}
	}

	reg := prometheus.NewPedanticRegistry()
	m, err := prommetrics.NewWithConfig(reg, &prommetrics.Config{JobTypes: []string{"type_z"}, MaxJobTypes: 1})
	if err != nil {
		t.Fatal(err)
	}
	env := apitest.New(t, "sqlite", apitest.WithConfig(func(c *workerapi.Config) {
		c.Metrics = m
		c.EnvelopeSafe = []string{"type_a", "type_b", "type_z"}
	}))
	reg.MustRegister(m.StatsCollector(env.Server, nil))
	n := env.NewNode(t, "node-1")
	n.Register(t, wire.RegisterRequest{Capabilities: wire.Capabilities{JobTypes: []string{"status_check", "type_a", "type_b", "type_z"}}})
	for _, typ := range []string{"status_check", "type_a", "type_b", "type_z"} {
		env.Enqueue(t, lease.NewJob{Type: typ, Payload: json.RawMessage(`{}`)})
	}
	// The scrape learns the declared types in order, up to the cap of
	// one: type_a; type_b is past it.
	fams := series(t, reg)
	for _, c := range []struct {
		labels string
		want   bool
	}{
		{"state=queued,type=status_check", true},
		{"state=queued,type=type_a", true},
		{"state=queued,type=type_b", false},
		{"state=queued,type=type_z", true},
		{"state=queued,type=other", true},
	} {
		if got := find(fams, "nodelane_queue_jobs", c.labels) != nil; got != c.want {
			t.Errorf("queue_jobs{%s}: present %v, want %v", c.labels, got, c.want)
		}
	}
	for range 4 {
		g := call(t, n, http.StatusOK, "/workers/jobs/lease", obj{"max_jobs": 1})
		id := g["job"].(map[string]any)["id"].(string)
		tok := g["lease_token"].(string)
		call(t, n, http.StatusOK, "/workers/jobs/"+id+"/accept", obj{"lease_token": tok})
		call(t, n, http.StatusOK, "/workers/jobs/"+id+"/complete", obj{"lease_token": tok})
	}
	fams = series(t, reg)
	for _, typ := range []string{"status_check", "type_a", "type_z", "other"} {
		if got, _ := value(t, fams, "nodelane_jobs_finished_total", "outcome=succeeded,type="+typ); got != 1 {
			t.Errorf("jobs finished of type %s: %v, want 1", typ, got)
		}
	}
	if find(fams, "nodelane_jobs_finished_total", "outcome=succeeded,type=type_b") != nil {
		t.Error("a type past the cap has a series of its own")
	}
	if got := m.JobTypeLabel("type_b"); got != prommetrics.OtherType {
		t.Errorf("JobTypeLabel(type_b) = %q, want %q", got, prommetrics.OtherType)
	}
}

// A scrape explains at most GaugesMaxKinds kinds of queued job: the jobs
// of the others are left out of queue_unleasable_jobs, and
// queue_unleasable_truncated says that it is a lower bound.
func TestUnleasableBound(t *testing.T) {
	t.Parallel()
	reg := prometheus.NewPedanticRegistry()
	m, err := prommetrics.New(reg)
	if err != nil {
		t.Fatal(err)
	}
	env := apitest.New(t, "sqlite", apitest.WithConfig(func(c *workerapi.Config) { c.Metrics = m }))
	reg.MustRegister(m.StatsCollector(env.Server, nil))
	enqueue := func(vram int) {
		env.Enqueue(t, lease.NewJob{Type: "status_check", Payload: json.RawMessage(`{}`),
			Requirements: lease.Requirements{GPUCount: 1, MinVRAMMB: vram}})
	}
	for i := range workerapi.GaugesMaxKinds {
		enqueue(1024 * (i + 1))
	}
	check := func(noWorker, truncated float64) {
		t.Helper()
		fams := series(t, reg)
		if got, _ := value(t, fams, "nodelane_queue_unleasable_jobs", "reason=no_worker"); got != noWorker {
			t.Errorf("unleasable, no worker: %v, want %v", got, noWorker)
		}
		if got, _ := value(t, fams, "nodelane_queue_unleasable_truncated", ""); got != truncated {
			t.Errorf("unleasable truncated: %v, want %v", got, truncated)
		}
	}
	check(workerapi.GaugesMaxKinds, 0)
	enqueue(1) // one kind more: not explained
	check(workerapi.GaugesMaxKinds, 1)
}
