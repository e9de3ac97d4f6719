// Package oteltrace traces a workerapi.Server's requests with
// OpenTelemetry, so that workerapi and the cores stay free of any
// tracing library.
//
// Tracing starts a server span per request (Middleware) and, set as
// workerapi.Config.Metrics, names it once the Server has routed the
// request and sets its attributes: http.request.method, http.route,
// http.response.status_code, nodelane.error_code, nodelane.worker_id,
// and nodelane.job_id (or nodelane.job_ids for a lease that granted
// several). It passes every observation on to the Metrics it wraps (the
// Prometheus adapter, say), so a host keeps both:
//
//	tr := oteltrace.New(tracerProvider, promMetrics, nil)
//	cfg.Metrics = tr
//	srv, _ := workerapi.New(stores, cfg)
//	handler := tr.Middleware(srv.Handler())
package oteltrace

import (
	"context"
	"net/http"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"

	"github.com/nodelane/nodelane/workerapi"
)

// ScopeName is the instrumentation scope of the spans.
const ScopeName = "github.com/nodelane/nodelane/workerapi/oteltrace"

// The attributes of a request's span beyond OpenTelemetry's HTTP ones.
const (
	AttrErrorCode = attribute.Key("nodelane.error_code")
	AttrWorkerID  = attribute.Key("nodelane.worker_id")
	AttrJobID     = attribute.Key("nodelane.job_id")
	AttrJobIDs    = attribute.Key("nodelane.job_ids")
)

// Options are the optional settings of New.
type Options struct {
	// Propagator extracts a caller's trace context from the request
	// headers, so that the span joins the caller's trace. Defaults to
	// nil: every request starts a trace.
	Propagator propagation.TextMapPropagator
}

// Tracing traces requests; it is a workerapi.Metrics,
// workerapi.ContextMetrics, workerapi.EventMetrics and
// workerapi.JobMetrics. It is safe for concurrent use.
type Tracing struct {
	tracer trace.Tracer
	next   workerapi.Metrics
	events workerapi.EventMetrics
	jobs   workerapi.JobMetrics
	prop   propagation.TextMapPropagator
}

var (
	_ workerapi.Metrics        = (*Tracing)(nil)
	_ workerapi.ContextMetrics = (*Tracing)(nil)
	_ workerapi.EventMetrics   = (*Tracing)(nil)
	_ workerapi.JobMetrics     = (*Tracing)(nil)
)

// New returns a Tracing whose spans tp makes, and which passes every
// observation on to next (nil: none). opts may be nil.
func New(tp trace.TracerProvider, next workerapi.Metrics, opts *Options) *Tracing {
	t := &Tracing{tracer: tp.Tracer(ScopeName), next: next}
	t.events, _ = next.(workerapi.EventMetrics)
	t.jobs, _ = next.(workerapi.JobMetrics)
	if opts != nil {
		t.prop = opts.Propagator
	}
	return t
}

// Middleware returns next wrapped so that each request runs in a server
// span of its own, named by its method until the Server routes it. A
// request that no route matches keeps that name and gets only its
// status.
func (t *Tracing) Middleware(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		ctx := r.Context()
		if t.prop != nil {
			ctx = t.prop.Extract(ctx, propagation.HeaderCarrier(r.Header))
		}
		ctx, span := t.tracer.Start(ctx, r.Method, trace.WithSpanKind(trace.SpanKindServer),
			trace.WithAttributes(attribute.String("http.request.method", r.Method)))
		defer span.End()
		sw := &statusWriter{ResponseWriter: w}
		next.ServeHTTP(sw, r.WithContext(ctx))
		if sw.status == 0 {
			sw.status = http.StatusOK
		}
		span.SetAttributes(attribute.Int("http.response.status_code", sw.status))
		if sw.status >= 500 {
			span.SetStatus(codes.Error, http.StatusText(sw.status))
		}
	})
}

// ObserveRequestContext implements workerapi.ContextMetrics: it names
// the span of ctx after the route and sets its attributes, then passes
// ri on.
func (t *Tracing) ObserveRequestContext(ctx context.Context, ri workerapi.RequestInfo) {
	if span := trace.SpanFromContext(ctx); span.IsRecording() {
		span.SetName(ri.Method + " " + ri.Route)
		attrs := []attribute.KeyValue{attribute.String("http.route", ri.Route)}
		if ri.Code != "" {
			attrs = append(attrs, AttrErrorCode.String(ri.Code))
		}
		if ri.WorkerID != "" {
			attrs = append(attrs, AttrWorkerID.String(ri.WorkerID))
		}
		switch {
		case len(ri.JobIDs) == 1:
			attrs = append(attrs, AttrJobID.String(ri.JobIDs[0]))
		case len(ri.JobIDs) > 1:
			attrs = append(attrs, AttrJobIDs.StringSlice(ri.JobIDs))
		}
		span.SetAttributes(attrs...)
	}
	t.ObserveRequest(ri)
}

// ObserveRequest implements workerapi.Metrics: it passes ri on.
func (t *Tracing) ObserveRequest(ri workerapi.RequestInfo) {
	if t.next != nil {
		t.next.ObserveRequest(ri)
	}
}

// ObserveLeases implements workerapi.EventMetrics: it passes the count on.
func (t *Tracing) ObserveLeases(o workerapi.LeaseOutcome, n int) {
	if t.events != nil {
		t.events.ObserveLeases(o, n)
	}
}

// ObserveSequenced implements workerapi.EventMetrics: it passes the count on.
func (t *Tracing) ObserveSequenced(n int, lag time.Duration) {
	if t.events != nil {
		t.events.ObserveSequenced(n, lag)
	}
}

// ObserveNonceRejected implements workerapi.EventMetrics: it passes the
// count on.
func (t *Tracing) ObserveNonceRejected(reason string) {
	if t.events != nil {
		t.events.ObserveNonceRejected(reason)
	}
}

// ObserveJob implements workerapi.JobMetrics: it passes the change on.
func (t *Tracing) ObserveJob(ch workerapi.JobChange) {
	if t.jobs != nil {
		t.jobs.ObserveJob(ch)
	}
}

// statusWriter records the status a handler writes.
type statusWriter struct {
	http.ResponseWriter
	status int
}

func (w *statusWriter) WriteHeader(code int) {
	if w.status == 0 {
		w.status = code
	}
	w.ResponseWriter.WriteHeader(code)
}

func (w *statusWriter) Write(b []byte) (int, error) {
	if w.status == 0 {
		w.status = http.StatusOK
	}
	return w.ResponseWriter.Write(b)
}

// Unwrap lets http.ResponseController reach the writer's own methods
// (Flush, deadlines).
func (w *statusWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }
