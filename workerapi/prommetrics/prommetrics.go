// Package prommetrics exports a workerapi.Server's metrics to Prometheus
// (client_golang), so that workerapi and the cores stay free of any
// metrics library.
//
// Metrics is a workerapi.Metrics and a workerapi.EventMetrics: set it as
// workerapi.Config.Metrics and it counts what the Server observes as it
// happens, in memory. The gauges of the queue and the fleet are read when
// scraped: register NewStatsCollector(server) beside it.
//
// The families, all prefixed nodelane_:
//
//	http_request_duration_seconds{method,route,status,code}  histogram
//	leases_total{outcome}          counter: granted, expired, lost
//	receipts_sequenced_total       counter
//	receipt_sequencer_lag_seconds  histogram: minting to checkpoint, oldest of each batch
//	nonce_rejections_total{reason} counter: replayed_nonce, stale_timestamp, bad_signature, ...
//	queue_jobs{state,type}         gauge: jobs queued, leased, running (NewStatsCollector)
//	workers{liveness}              gauge: online, stale, offline (NewStatsCollector)
//	stats_up                       gauge: 1 if the last read of the gauges above succeeded
package prommetrics

import (
	"context"
	"log/slog"
	"strconv"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/nodelane/nodelane/lease"
	"github.com/nodelane/nodelane/workerapi"
	"github.com/nodelane/nodelane/workerapi/wire"
)

// namespace prefixes every family.
const namespace = "nodelane"

// Metrics counts what a workerapi.Server observes. It is safe for
// concurrent use.
type Metrics struct {
	requests  *prometheus.HistogramVec
	leases    *prometheus.CounterVec
	sequenced prometheus.Counter
	lag       prometheus.Histogram
	nonces    *prometheus.CounterVec
}

var (
	_ workerapi.Metrics      = (*Metrics)(nil)
	_ workerapi.EventMetrics = (*Metrics)(nil)
)

// New returns Metrics whose collectors are registered with reg. It fails
// if reg already holds a family of the same name.
func New(reg prometheus.Registerer) (*Metrics, error) {
	m := &Metrics{
		requests: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Namespace: namespace, Name: "http_request_duration_seconds",
			Help:    "Time to serve a worker or operator request, by method, route pattern, HTTP status and error code (empty on success; 499 and client_closed_request when the client hung up).",
			Buckets: []float64{.001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30, 60},
		}, []string{"method", "route", "status", "code"}),
		leases: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: namespace, Name: "leases_total",
			Help: "Leases by outcome: granted by a lease request, expired (TTL, accept deadline, cancel grace, max runtime, or worker offline), or lost (a worker answered 409 lease_lost).",
		}, []string{"outcome"}),
		sequenced: prometheus.NewCounter(prometheus.CounterOpts{
			Namespace: namespace, Name: "receipts_sequenced_total",
			Help: "Receipts integrated into the receipt log by this replica's sequencer.",
		}),
		lag: prometheus.NewHistogram(prometheus.HistogramOpts{
			Namespace: namespace, Name: "receipt_sequencer_lag_seconds",
			Help:    "For each sequenced batch, how long its oldest receipt waited from minting to the batch's checkpoint.",
			Buckets: []float64{.01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30, 60, 300},
		}),
		nonces: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: namespace, Name: "nonce_rejections_total",
			Help: "Signed worker requests refused by the signature and replay checks, by the error code answered.",
		}, []string{"reason"}),
	}
	for _, c := range []prometheus.Collector{m.requests, m.leases, m.sequenced, m.lag, m.nonces} {
		if err := reg.Register(c); err != nil {
			return nil, err
		}
	}
	// The lease outcomes exist from the start, at zero, so that a rate
	// over them is defined before the first event.
	for _, o := range []workerapi.LeaseOutcome{workerapi.LeaseGranted, workerapi.LeaseExpired, workerapi.LeaseLost} {
		m.leases.WithLabelValues(string(o))
	}
	for _, r := range NonceReasons {
		m.nonces.WithLabelValues(r)
	}
	return m, nil
}

// NonceReasons are the reasons of nonce_rejections_total, each exported
// from the start at zero: the error codes of workerapi's replay refusals.
var NonceReasons = []string{
	wire.CodeMissingSignature, wire.CodeMalformedSignature, wire.CodeBadDigest, wire.CodeBadSignature,
	wire.CodeStaleTimestamp, wire.CodeReplayedNonce, wire.CodeRateLimited,
}

// ObserveRequest implements workerapi.Metrics.
func (m *Metrics) ObserveRequest(ri workerapi.RequestInfo) {
	m.requests.WithLabelValues(ri.Method, ri.Route, strconv.Itoa(ri.Status), ri.Code).Observe(ri.Duration.Seconds())
}

// ObserveLeases implements workerapi.EventMetrics.
func (m *Metrics) ObserveLeases(outcome workerapi.LeaseOutcome, n int) {
	m.leases.WithLabelValues(string(outcome)).Add(float64(n))
}

// ObserveSequenced implements workerapi.EventMetrics.
func (m *Metrics) ObserveSequenced(n int, lag time.Duration) {
	m.sequenced.Add(float64(n))
	m.lag.Observe(lag.Seconds())
}

// ObserveNonceRejected implements workerapi.EventMetrics.
func (m *Metrics) ObserveNonceRejected(reason string) {
	m.nonces.WithLabelValues(reason).Inc()
}

// StatsSource reads the counts of the queue and the fleet;
// *workerapi.Server is one.
type StatsSource interface {
	Stats(ctx context.Context) (*lease.Stats, error)
}

// StatsCollector is a prometheus.Collector that reads a StatsSource on
// each scrape: the gauges queue_jobs{state,type}, workers{liveness} and
// stats_up.
type StatsCollector struct {
	src     StatsSource
	log     *slog.Logger
	timeout time.Duration

	jobs, workers, up *prometheus.Desc
}

// StatsTimeout bounds one scrape's read of the StatsSource.
const StatsTimeout = 5 * time.Second

// NewStatsCollector returns a StatsCollector over src. A failed read is
// logged to log (nil: discarded) at WARN and reported as stats_up 0,
// without the other gauges, so that the rest of the scrape goes on.
func NewStatsCollector(src StatsSource, log *slog.Logger) *StatsCollector {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &StatsCollector{
		src: src, log: log, timeout: StatsTimeout,
		jobs: prometheus.NewDesc(namespace+"_queue_jobs",
			"Jobs queued, leased and running, by state and job type, read from the database when scraped.", []string{"state", "type"}, nil),
		workers: prometheus.NewDesc(namespace+"_workers",
			"Registered workers by liveness (online, stale, offline), read from the database when scraped.", []string{"liveness"}, nil),
		up: prometheus.NewDesc(namespace+"_stats_up",
			"1 if this scrape read the queue and worker counts, 0 if the database did not answer.", nil, nil),
	}
}

// Describe implements prometheus.Collector.
func (c *StatsCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- c.jobs
	ch <- c.workers
	ch <- c.up
}

// Collect implements prometheus.Collector.
func (c *StatsCollector) Collect(ch chan<- prometheus.Metric) {
	ctx, cancel := context.WithTimeout(context.Background(), c.timeout)
	defer cancel()
	st, err := c.src.Stats(ctx)
	if err != nil {
		c.log.Warn("reading the queue and worker counts for metrics", "err", err)
		ch <- prometheus.MustNewConstMetric(c.up, prometheus.GaugeValue, 0)
		return
	}
	ch <- prometheus.MustNewConstMetric(c.up, prometheus.GaugeValue, 1)
	for _, j := range st.Jobs {
		ch <- prometheus.MustNewConstMetric(c.jobs, prometheus.GaugeValue, float64(j.N), string(j.State), j.Type)
	}
	for _, l := range []lease.Liveness{lease.LivenessOnline, lease.LivenessStale, lease.LivenessOffline} {
		ch <- prometheus.MustNewConstMetric(c.workers, prometheus.GaugeValue, float64(st.Workers[l]), string(l))
	}
}
