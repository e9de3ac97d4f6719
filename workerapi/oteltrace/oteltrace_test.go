package oteltrace_test

import (
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/propagation"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	"github.com/nodelane/nodelane/internal/apitest"
	"github.com/nodelane/nodelane/lease"
	"github.com/nodelane/nodelane/workerapi"
	"github.com/nodelane/nodelane/workerapi/oteltrace"
	"github.com/nodelane/nodelane/workerapi/prommetrics"
	"github.com/nodelane/nodelane/workerapi/wire"
)

// spanAttrs returns a span's attributes by key.
func spanAttrs(s sdktrace.ReadOnlySpan) map[attribute.Key]attribute.Value {
	m := map[attribute.Key]attribute.Value{}
	for _, kv := range s.Attributes() {
		m[kv.Key] = kv.Value
	}
	return m
}

// A real Server on SQLite behind the Middleware: each request is one
// server span, named after its route, with its status and the ids of
// the worker and jobs it concerns; a caller's trace context is joined;
// and the Prometheus adapter it wraps still counts.
func TestSpansFromARealServer(t *testing.T) {
	t.Parallel()
	sr := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(sr))
	t.Cleanup(func() { tp.Shutdown(context.Background()) })
	reg := prometheus.NewRegistry()
	pm, err := prommetrics.New(reg)
	if err != nil {
		t.Fatal(err)
	}
	tr := oteltrace.New(tp, pm, &oteltrace.Options{Propagator: propagation.TraceContext{}})
	env := apitest.New(t, "sqlite", apitest.WithConfig(func(c *workerapi.Config) { c.Metrics = tr }))
	hs := httptest.NewServer(tr.Middleware(env.Server.Handler()))
	t.Cleanup(hs.Close)
	traced := *env
	traced.URL = hs.URL

	n := traced.NewNode(t, "node-1")
	n.Register(t, wire.RegisterRequest{Capabilities: wire.Capabilities{JobTypes: []string{"status_check"}}})
	job := env.Enqueue(t, lease.NewJob{Type: "status_check", Payload: json.RawMessage(`{}`)})

	resp, b := n.Do(t, http.MethodPost, "/workers/jobs/lease", map[string]any{"supported_job_types": []string{"status_check"}, "max_jobs": 1})
	var g wire.LeaseResponse
	if resp.StatusCode != http.StatusOK || json.Unmarshal(b, &g) != nil || g.LeaseToken == nil {
		t.Fatalf("lease: %d %s", resp.StatusCode, b)
	}
	// The accept joins the caller's trace.
	parent := trace.SpanContextConfig{TraceID: trace.TraceID{1, 2, 3}, SpanID: trace.SpanID{4, 5, 6}, TraceFlags: trace.FlagsSampled}
	req := n.Request(t, http.MethodPost, "/workers/jobs/"+job.ID+"/accept", map[string]any{"lease_token": *g.LeaseToken})
	propagation.TraceContext{}.Inject(trace.ContextWithSpanContext(context.Background(), trace.NewSpanContext(parent)), propagation.HeaderCarrier(req.Header))
	if resp, b := n.Raw(t, req); resp.StatusCode != http.StatusOK {
		t.Fatalf("accept: %d %s", resp.StatusCode, b)
	}
	// A lost lease: 409 lease_lost. The token's last character changed
	// (to "y" when it is "x": a token ending in x would stay the same).
	tok := *g.LeaseToken
	last := "x"
	if strings.HasSuffix(tok, last) {
		last = "y"
	}
	if resp, b := n.Do(t, http.MethodPost, "/workers/jobs/"+job.ID+"/accept", map[string]any{"lease_token": tok[:len(tok)-1] + last}); resp.StatusCode != http.StatusConflict && resp.StatusCode != http.StatusBadRequest {
		t.Fatalf("accept with a wrong token: %d %s", resp.StatusCode, b)
	}

	spans := sr.Ended()
	byName := map[string][]sdktrace.ReadOnlySpan{}
	for _, s := range spans {
		byName[s.Name()] = append(byName[s.Name()], s)
		if s.SpanKind() != trace.SpanKindServer || s.InstrumentationScope().Name != oteltrace.ScopeName {
			t.Errorf("span %s: kind %v scope %q", s.Name(), s.SpanKind(), s.InstrumentationScope().Name)
		}
	}
	check := func(name string, i int, want map[attribute.Key]attribute.Value) sdktrace.ReadOnlySpan {
		t.Helper()
		if len(byName[name]) <= i {
			t.Fatalf("no span %q #%d; have %v", name, i, byName)
		}
		s := byName[name][i]
		got := spanAttrs(s)
		for k, v := range want {
			if got[k] != v {
				t.Errorf("span %s: %s = %v, want %v", name, k, got[k].String(), v.String())
			}
		}
		return s
	}
	check("POST /workers/register", 0, map[attribute.Key]attribute.Value{
		"http.route": attribute.StringValue("/workers/register"), "http.response.status_code": attribute.IntValue(201),
	})
	check("POST /workers/jobs/lease", 0, map[attribute.Key]attribute.Value{
		"http.route": attribute.StringValue("/workers/jobs/lease"), "http.request.method": attribute.StringValue("POST"),
		"http.response.status_code": attribute.IntValue(200),
		oteltrace.AttrWorkerID:      attribute.StringValue(n.WorkerID), oteltrace.AttrJobID: attribute.StringValue(job.ID),
	})
	acc := check("POST /workers/jobs/{id}/accept", 0, map[attribute.Key]attribute.Value{
		"http.route":                attribute.StringValue("/workers/jobs/{id}/accept"),
		"http.response.status_code": attribute.IntValue(200),
		oteltrace.AttrWorkerID:      attribute.StringValue(n.WorkerID), oteltrace.AttrJobID: attribute.StringValue(job.ID),
	})
	if acc.Parent().TraceID() != parent.TraceID || acc.SpanContext().TraceID() != parent.TraceID {
		t.Errorf("the accept's span did not join the caller's trace: parent %v", acc.Parent())
	}
	lost := byName["POST /workers/jobs/{id}/accept"]
	if len(lost) != 2 {
		t.Fatalf("%d accept spans, want 2", len(lost))
	}
	if a := spanAttrs(lost[1]); a[oteltrace.AttrErrorCode].AsString() == "" || a[oteltrace.AttrJobID].AsString() != job.ID {
		t.Errorf("the refused accept's span: %v", a)
	}
	// The wrapped Prometheus adapter counted too.
	if err := testutil.GatherAndCompare(reg, strings.NewReader(`
# HELP nodelane_leases_total Leases by outcome: granted by a lease request, expired (TTL, accept deadline, cancel grace, max runtime, or worker offline), or lost (a worker answered 409 lease_lost).
# TYPE nodelane_leases_total counter
nodelane_leases_total{outcome="expired"} 0
nodelane_leases_total{outcome="granted"} 1
nodelane_leases_total{outcome="lost"} 0
`), "nodelane_leases_total"); err != nil {
		t.Error(err)
	}
	// The job's lease reached prommetrics through the Tracing too
	// (workerapi.JobMetrics).
	if n, err := testutil.GatherAndCount(reg, "nodelane_job_dispatch_to_lease_seconds"); err != nil || n != 1 {
		t.Errorf("dispatch-to-lease series through the Tracing: %d, %v; want 1", n, err)
	}
}
