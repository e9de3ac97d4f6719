package prommetrics_test

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/nodelane/nodelane/internal/apitest"
	"github.com/nodelane/nodelane/lease"
	"github.com/nodelane/nodelane/workerapi"
	"github.com/nodelane/nodelane/workerapi/prommetrics"
	"github.com/nodelane/nodelane/workerapi/wire"
)

type obj = map[string]any

// call sends a signed request and fails the test unless it is answered
// with want.
func call(t *testing.T, n *apitest.Node, want int, path string, body any) obj {
	t.Helper()
	resp, b := n.Do(t, http.MethodPost, path, body)
	if resp.StatusCode != want {
		t.Fatalf("POST %s: %d, want %d: %s", path, resp.StatusCode, want, b)
	}
	var m obj
	if err := json.Unmarshal(b, &m); err != nil {
		t.Fatalf("POST %s: not JSON: %s", path, b)
	}
	return m
}

// A real Server on SQLite, driven over HTTP, feeds every family the
// adapter exports, with the names, types and labels documented; the
// gauges are read from the database at scrape time, and a database that
// does not answer turns stats_up to 0 without failing the scrape.
func TestMetricsFromARealServer(t *testing.T) {
	t.Parallel()
	reg := prometheus.NewPedanticRegistry()
	m, err := prommetrics.New(reg)
	if err != nil {
		t.Fatal(err)
	}
	env := apitest.New(t, "sqlite", apitest.WithConfig(func(c *workerapi.Config) {
		c.Metrics = m
		// Every worker stays online while the test moves the clock.
		c.Lease.HeartbeatInterval = 10 * time.Minute
	}))
	reg.MustRegister(prommetrics.NewStatsCollector(env.Server, nil))
	ctx := context.Background()

	n := env.NewNode(t, "node-1")
	n.Now = env.Clock.Now
	n.Register(t, wire.RegisterRequest{Capabilities: wire.Capabilities{JobTypes: []string{"status_check"}}})
	var jobs []string
	for range 3 {
		jobs = append(jobs, env.Enqueue(t, lease.NewJob{Type: "status_check", Payload: json.RawMessage(`{}`)}).ID)
	}
	lreq := obj{"supported_job_types": []string{"status_check"}, "max_jobs": 1}

	// Granted, accepted, completed.
	g := call(t, n, http.StatusOK, "/workers/jobs/lease", lreq)
	tok := g["lease_token"].(string)
	call(t, n, http.StatusOK, "/workers/jobs/"+jobs[0]+"/accept", obj{"lease_token": tok})
	call(t, n, http.StatusOK, "/workers/jobs/"+jobs[0]+"/complete", obj{"lease_token": tok})

	// Granted, never accepted: expired by the maintainer, and its token
	// is then lost.
	g = call(t, n, http.StatusOK, "/workers/jobs/lease", lreq)
	tok = g["lease_token"].(string)
	env.Clock.Advance(workerapi.DefaultAcceptTimeout + time.Second)
	if err := env.Server.MaintainOnce(ctx); err != nil {
		t.Fatal(err)
	}
	call(t, n, http.StatusConflict, "/workers/jobs/"+jobs[1]+"/accept", obj{"lease_token": tok})

	// A request sent twice: the copy is refused as a replay.
	req := n.Request(t, http.MethodPost, "/workers/jobs/lease", lreq)
	if resp, b := n.Raw(t, req); resp.StatusCode != http.StatusOK {
		t.Fatalf("lease: %d %s", resp.StatusCode, b)
	}
	if resp, b := n.Raw(t, req); resp.StatusCode != http.StatusUnauthorized || !strings.Contains(string(b), wire.CodeReplayedNonce) {
		t.Fatalf("a replayed lease: %d %s", resp.StatusCode, b)
	}
	if _, err := env.Server.Sequence(ctx); err != nil {
		t.Fatal(err)
	}

	const want = `
# HELP nodelane_leases_total Leases by outcome: granted by a lease request, expired (TTL, accept deadline, cancel grace, max runtime, or worker offline), or lost (a worker answered 409 lease_lost).
# TYPE nodelane_leases_total counter
nodelane_leases_total{outcome="expired"} 1
nodelane_leases_total{outcome="granted"} 3
nodelane_leases_total{outcome="lost"} 1
# HELP nodelane_nonce_rejections_total Signed worker requests refused by the signature and replay checks, by the error code answered.
# TYPE nodelane_nonce_rejections_total counter
nodelane_nonce_rejections_total{reason="bad_digest"} 0
nodelane_nonce_rejections_total{reason="bad_signature"} 0
nodelane_nonce_rejections_total{reason="malformed_signature"} 0
nodelane_nonce_rejections_total{reason="missing_signature"} 0
nodelane_nonce_rejections_total{reason="rate_limited"} 0
nodelane_nonce_rejections_total{reason="replayed_nonce"} 1
nodelane_nonce_rejections_total{reason="stale_timestamp"} 0
# HELP nodelane_queue_jobs Jobs queued, leased and running, by state and job type ("other" for a type not known), read from the database when scraped.
# TYPE nodelane_queue_jobs gauge
nodelane_queue_jobs{state="leased",type="status_check"} 1
nodelane_queue_jobs{state="queued",type="status_check"} 1
# HELP nodelane_stats_up 1 if this scrape read the queue and worker counts, 0 if the database did not answer.
# TYPE nodelane_stats_up gauge
nodelane_stats_up 1
# HELP nodelane_workers Registered workers by liveness (online, stale, offline), read from the database when scraped.
# TYPE nodelane_workers gauge
nodelane_workers{liveness="offline"} 0
nodelane_workers{liveness="online"} 1
nodelane_workers{liveness="stale"} 0
`
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want),
		"nodelane_leases_total", "nodelane_nonce_rejections_total", "nodelane_queue_jobs", "nodelane_stats_up", "nodelane_workers"); err != nil {
		t.Fatal(err)
	}
	if problems, err := testutil.GatherAndLint(reg); err != nil || len(problems) > 0 {
		t.Fatalf("lint: %v %+v", err, problems)
	}

	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	fams := map[string]string{}
	var sequenced, lagCount float64
	requests := map[string]bool{}
	for _, mf := range mfs {
		fams[mf.GetName()] = mf.GetType().String()
		for _, mt := range mf.GetMetric() {
			switch mf.GetName() {
			case "nodelane_receipts_sequenced_total":
				sequenced = mt.GetCounter().GetValue()
			case "nodelane_receipt_sequencer_lag_seconds":
				lagCount = float64(mt.GetHistogram().GetSampleCount())
			case "nodelane_http_request_duration_seconds":
				var l []string
				for _, lp := range mt.GetLabel() {
					l = append(l, lp.GetName()+"="+lp.GetValue())
				}
				requests[strings.Join(l, ",")] = true
			}
		}
	}
	for name, typ := range map[string]string{
		"nodelane_http_request_duration_seconds": "HISTOGRAM",
		"nodelane_leases_total":                  "COUNTER",
		"nodelane_receipts_sequenced_total":      "COUNTER",
		"nodelane_receipt_sequencer_lag_seconds": "HISTOGRAM",
		"nodelane_nonce_rejections_total":        "COUNTER",
		"nodelane_queue_jobs":                    "GAUGE",
		"nodelane_workers":                       "GAUGE",
		"nodelane_stats_up":                      "GAUGE",
	} {
		if fams[name] != typ {
			t.Errorf("family %s: type %q, want %s", name, fams[name], typ)
		}
	}
	// The registration and the completion minted receipts at least.
	if sequenced < 2 || lagCount < 1 {
		t.Errorf("receipts sequenced %v, lag observations %v; want at least 2 and 1", sequenced, lagCount)
	}
	for _, series := range []string{
		"code=,method=POST,route=/workers/jobs/{id}/complete,status=200",
		"code=lease_lost,method=POST,route=/workers/jobs/{id}/accept,status=409",
		"code=replayed_nonce,method=POST,route=/workers/jobs/lease,status=401",
	} {
		if !requests[series] {
			t.Errorf("no request latency series %s; have %v", series, requests)
		}
	}

	// The database gone: the scrape still answers, with stats_up 0.
	env.DB.Close()
	if err := testutil.GatherAndCompare(reg, strings.NewReader(`
# HELP nodelane_stats_up 1 if this scrape read the queue and worker counts, 0 if the database did not answer.
# TYPE nodelane_stats_up gauge
nodelane_stats_up 0
`), "nodelane_stats_up", "nodelane_queue_jobs"); err != nil {
		t.Fatal(err)
	}
}

// New refuses a registry that already holds its families.
func TestNewTwice(t *testing.T) {
	t.Parallel()
	reg := prometheus.NewRegistry()
	if _, err := prommetrics.New(reg); err != nil {
		t.Fatal(err)
	}
	var are prometheus.AlreadyRegisteredError
	if _, err := prommetrics.New(reg); err == nil || !errors.As(err, &are) {
		t.Fatalf("New on the same registry: %v, want AlreadyRegisteredError", err)
	}
}
