package main

import (
	"fmt"
	"io"
	"log/slog"
	"maps"
	"net/http"
	"net/http/pprof"
	"strings"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/nodelane/nodelane/credential"
	"github.com/nodelane/nodelane/workerapi"
	"github.com/nodelane/nodelane/workerapi/prommetrics"
)

// newLogger returns the server's logger: text (logfmt) or JSON lines on
// w, from level on.
func newLogger(w io.Writer, level, format string) (*slog.Logger, error) {
	var l slog.Level
	if err := l.UnmarshalText([]byte(level)); err != nil {
		return nil, fmt.Errorf("-log-level %q: want debug, info, warn or error", level)
	}
	opts := &slog.HandlerOptions{Level: l}
	switch strings.ToLower(format) {
	case "text":
		return slog.New(slog.NewTextHandler(w, opts)), nil
	case "json":
		return slog.New(slog.NewJSONHandler(w, opts)), nil
	}
	return nil, fmt.Errorf("-log-format %q: want text or json", format)
}

// metrics is the server's Prometheus registry: the Go runtime's and the
// process's collectors, and the Server's (prommetrics).
type metrics struct {
	reg *prometheus.Registry
	m   *prommetrics.Metrics
}

// newMetrics returns the server's metrics. The envelope's canonical job
// types keep their name in labels from the start; any other type keeps
// it once a registered worker declares it (prommetrics' package doc).
func newMetrics() (*metrics, error) {
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	m, err := prommetrics.New(reg)
	if err != nil {
		return nil, err
	}
	return &metrics{reg: reg, m: m}, nil
}

// MetricsScope is the operator scope GET /metrics needs on -addr: the
// one whose routes only read, so that a scraper's token can change
// nothing. -metrics-addr serves it without a credential.
const MetricsScope = credential.ScopeOperatorReceipts

// opsHandlers returns the handlers the server serves beside the API, by
// path: /readyz (workerapi.Server.ReadyHandler), /healthz (200 while the
// process serves) and /metrics (Prometheus, with the queue, envelope and
// worker gauges read from the database on each scrape, within
// workerapi.Server.Gauges' bounds). None asks for a
// credential: see guardMetrics.
func opsHandlers(s *workerapi.Server, m *metrics, log *slog.Logger) map[string]http.Handler {
	m.reg.MustRegister(m.m.StatsCollector(s, log))
	return map[string]http.Handler{
		"/readyz": s.ReadyHandler(),
		"/healthz": http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if r.Method != http.MethodGet && r.Method != http.MethodHead {
				w.Header().Set("Allow", "GET, HEAD")
				http.Error(w, "method not allowed", http.StatusMethodNotAllowed)
				return
			}
			w.Header().Set("Content-Type", "text/plain; charset=utf-8")
			w.Header().Set("Cache-Control", "no-store")
			io.WriteString(w, "ok\n")
		}),
		"/metrics": promhttp.HandlerFor(m.reg, promhttp.HandlerOpts{
			ErrorLog: slog.NewLogLogger(log.Handler(), slog.LevelWarn), ErrorHandling: promhttp.ContinueOnError,
		}),
	}
}

// guardMetrics returns ops as -addr serves them: /metrics needs a bearer
// credential with MetricsScope (401 or 403 otherwise, as on the operator
// routes); the probes need none.
func guardMetrics(s *workerapi.Server, ops map[string]http.Handler) map[string]http.Handler {
	guarded := maps.Clone(ops)
	guarded["/metrics"] = s.RequireScope(MetricsScope, ops["/metrics"])
	return guarded
}

// opsOnly serves ops by path, 404 for any other (-metrics-addr).
func opsOnly(ops map[string]http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if h, ok := ops[r.URL.Path]; ok {
			h.ServeHTTP(w, r)
			return
		}
		http.NotFound(w, r)
	})
}

// pprofHandler serves Go's profiles under /debug/pprof/ (-pprof-addr), on
// a mux of its own: importing net/http/pprof registers them on
// http.DefaultServeMux too, which the server never serves.
func pprofHandler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("/debug/pprof/", pprof.Index)
	mux.HandleFunc("/debug/pprof/cmdline", pprof.Cmdline)
	mux.HandleFunc("/debug/pprof/profile", pprof.Profile)
	mux.HandleFunc("/debug/pprof/symbol", pprof.Symbol)
	mux.HandleFunc("/debug/pprof/trace", pprof.Trace)
	return mux
}
