// Package prommetrics exports a workerapi.Server's metrics to Prometheus
// (client_golang), so that workerapi and the cores stay free of any
// metrics library.
//
// Metrics is a workerapi.Metrics, a workerapi.EventMetrics and a
// workerapi.JobMetrics: set it as workerapi.Config.Metrics and it counts
// what the Server observes as it happens, in memory. The gauges of the
// queue and the fleet are read when scraped: register
// m.StatsCollector(server, log) beside it (or NewStatsCollector, which
// bounds job types on its own).
//
// The families, all prefixed nodelane_:
//
//	http_request_duration_seconds{method,route,status,code}  histogram
//	leases_total{outcome}          counter: granted, expired, lost
//	receipts_sequenced_total       counter
//	receipt_sequencer_lag_seconds  histogram: minting to checkpoint, oldest of each batch
//	nonce_rejections_total{reason} counter: replayed_nonce, stale_timestamp, bad_signature, ...
//	job_dispatch_to_lease_seconds{type}    histogram: one observation per lease granted
//	jobs_finished_total{type,outcome}      counter: succeeded, failed, canceled
//	job_runtime_seconds{type,outcome}      histogram: accept to end of a finished job's last attempt
//	charged_micro_usd_total{type}          counter: what completions charged
//	build_info{version,revision,go_version} gauge, 1
//	queue_jobs{state,type}         gauge: jobs queued, leased, running (read when scraped)
//	queue_oldest_job_age_seconds{type}     gauge: age of the oldest queued job of each type
//	queue_unleasable_jobs{reason}  gauge: queued jobs no registered worker could lease now
//	queue_unleasable_truncated     gauge: 1 when a bound cut the count above short
//	envelope_active                gauge: 1 while the envelope's runtime is active
//	workers{liveness}              gauge: online, stale, offline
//	fleet_workers{approval,banned,liveness}  gauge: workers examined by approval, ban and liveness
//	fleet_workers_truncated        gauge: 1 when more workers are registered than examined
//	stats_up                       gauge: 1 if the last read of the gauges above succeeded
//
// Job type labels are bounded: a type keeps its name if it is one of the
// envelope's canonical types (envelope.SafeTypes, envelope.BlockedTypes)
// or configured (Config.JobTypes), or once it is learned: declared by a
// registered worker (read when scraped) or granted in a lease (only a
// worker that registered a type is granted it), up to Config.MaxJobTypes
// learned types (default DefaultMaxJobTypes). Every other type is
// "other". A known type stays known for the life of the Metrics, so that
// a series never changes name.
package prommetrics

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"runtime/debug"
	"strconv"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/nodelane/nodelane/envelope"
	"github.com/nodelane/nodelane/lease"
	"github.com/nodelane/nodelane/workerapi"
	"github.com/nodelane/nodelane/workerapi/wire"
)

// namespace prefixes every family.
const namespace = "nodelane"

// OtherType is the type label of every job type that is not known (see
// the package doc).
const OtherType = "other"

// DefaultMaxJobTypes is Config.MaxJobTypes's default.
const DefaultMaxJobTypes = 50

// Config holds Metrics' optional settings. A nil *Config means all
// defaults.
type Config struct {
	// JobTypes are job types known from the start, beside the
	// envelope's canonical ones, whose label is their name even before a
	// worker declares them (a host's own types). Defaults to none.
	JobTypes []string
	// MaxJobTypes caps how many job types are learned (see the package
	// doc) beyond the canonical and configured ones; the types past it
	// are OtherType. Defaults to DefaultMaxJobTypes; a negative value is
	// an error.
	MaxJobTypes int
}

// ErrConfig is wrapped by the error of NewWithConfig for an invalid
// Config.
var ErrConfig = errors.New("prommetrics: invalid config")

// Metrics counts what a workerapi.Server observes. It is safe for
// concurrent use.
type Metrics struct {
	types *typeSet

	requests  *prometheus.HistogramVec
	leases    *prometheus.CounterVec
	sequenced prometheus.Counter
	lag       prometheus.Histogram
	nonces    *prometheus.CounterVec
	wait      *prometheus.HistogramVec
	finished  *prometheus.CounterVec
	runtime   *prometheus.HistogramVec
	charged   *prometheus.CounterVec
	build     *prometheus.GaugeVec
}

var (
	_ workerapi.Metrics      = (*Metrics)(nil)
	_ workerapi.EventMetrics = (*Metrics)(nil)
	_ workerapi.JobMetrics   = (*Metrics)(nil)
)

// Outcomes are the outcome labels of jobs_finished_total and
// job_runtime_seconds, each exported from the start at zero.
var Outcomes = []lease.State{lease.StateSucceeded, lease.StateFailed, lease.StateCanceled}

// New is NewWithConfig with the default Config.
func New(reg prometheus.Registerer) (*Metrics, error) { return NewWithConfig(reg, nil) }

// NewWithConfig returns Metrics whose collectors are registered with
// reg. It fails if reg already holds a family of the same name, or with
// an error wrapping ErrConfig if cfg is invalid.
func NewWithConfig(reg prometheus.Registerer, cfg *Config) (*Metrics, error) {
	var c Config
	if cfg != nil {
		c = *cfg
	}
	if c.MaxJobTypes < 0 {
		return nil, fmt.Errorf("%w: MaxJobTypes %d is negative", ErrConfig, c.MaxJobTypes)
	}
	if c.MaxJobTypes == 0 {
		c.MaxJobTypes = DefaultMaxJobTypes
	}
	m := &Metrics{
		types: newTypeSet(c.MaxJobTypes, c.JobTypes...),
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
		wait: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Namespace: namespace, Name: "job_dispatch_to_lease_seconds",
			Help:    "For each lease granted, how long its job waited queued: from its dispatch, requeue or scheduled time, whichever is latest, to the lease; by job type (\"other\" for a type not known).",
			Buckets: []float64{.005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30, 60, 300, 900, 3600, 14400, 86400},
		}, []string{"type"}),
		finished: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: namespace, Name: "jobs_finished_total",
			Help: "Jobs that reached a terminal state, by job type (\"other\" for a type not known) and outcome: succeeded, failed or canceled. A job retried by an operator and finished again counts again.",
		}, []string{"type", "outcome"}),
		runtime: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Namespace: namespace, Name: "job_runtime_seconds",
			Help:    "For each finished job that was accepted, from the accept of its last attempt to its end, by job type and outcome.",
			Buckets: []float64{.1, .5, 1, 5, 10, 30, 60, 300, 600, 1800, 3600, 7200, 14400, 43200, 86400},
		}, []string{"type", "outcome"}),
		charged: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: namespace, Name: "charged_micro_usd_total",
			Help: "Micro-USD charged by completions (the job_charged receipts' costs), by job type.",
		}, []string{"type"}),
		build: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Namespace: namespace, Name: "build_info",
			Help: "1, labelled with the nodelane module's version, the binary's VCS revision and the Go version it was built with (unknown when the binary does not say).",
		}, []string{"version", "revision", "go_version"}),
	}
	for _, c := range []prometheus.Collector{m.requests, m.leases, m.sequenced, m.lag, m.nonces, m.wait, m.finished, m.runtime, m.charged, m.build} {
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
	v, rev, gov := buildInfo()
	m.build.WithLabelValues(v, rev, gov).Set(1)
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

// ObserveJob implements workerapi.JobMetrics: a lease granted (queued to
// leased, or to running) is one observation of
// job_dispatch_to_lease_seconds and makes its type known; a terminal
// state counts in jobs_finished_total and, if the job was accepted, in
// job_runtime_seconds; a charge adds to charged_micro_usd_total.
func (m *Metrics) ObserveJob(ch workerapi.JobChange) {
	j := &ch.Job
	if ch.From == lease.StateQueued && (j.State == lease.StateLeased || j.State == lease.StateRunning) && j.LeasedAt != nil {
		m.types.learn(j.Type)
		due := j.CreatedAt
		if j.ScheduledAt.After(due) {
			due = j.ScheduledAt
		}
		m.wait.WithLabelValues(m.types.label(j.Type)).Observe(max(j.LeasedAt.Sub(due), 0).Seconds())
	}
	if j.State.Terminal() {
		t := m.types.label(j.Type)
		m.finished.WithLabelValues(t, string(j.State)).Inc()
		if j.AcceptedAt != nil && j.FinishedAt != nil {
			m.runtime.WithLabelValues(t, string(j.State)).Observe(max(j.FinishedAt.Sub(*j.AcceptedAt), 0).Seconds())
		}
	}
	if ch.ChargedMicroUSD > 0 {
		m.charged.WithLabelValues(m.types.label(j.Type)).Add(float64(ch.ChargedMicroUSD))
	}
}

// JobTypeLabel returns the label job type t has now: its name if it is
// known, else OtherType.
func (m *Metrics) JobTypeLabel(t string) string { return m.types.label(t) }

// typeSet is the job types known: the envelope's canonical ones, those
// configured, and at most max learned.
type typeSet struct {
	max     int
	mu      sync.Mutex
	known   map[string]bool
	learned int
}

func newTypeSet(maxTypes int, types ...string) *typeSet {
	ts := &typeSet{max: maxTypes, known: map[string]bool{}}
	for _, list := range [][]string{envelope.SafeTypes(), envelope.BlockedTypes(), types} {
		for _, t := range list {
			ts.known[t] = true
		}
	}
	return ts
}

// learn makes t known, if fewer than max types were learned.
func (ts *typeSet) learn(t string) {
	ts.mu.Lock()
	defer ts.mu.Unlock()
	if !ts.known[t] && ts.learned < ts.max {
		ts.known[t] = true
		ts.learned++
	}
}

// label returns t if it is known, else OtherType.
func (ts *typeSet) label(t string) string {
	ts.mu.Lock()
	defer ts.mu.Unlock()
	if ts.known[t] {
		return t
	}
	return OtherType
}

// modulePath is the nodelane module, whose version build_info reports.
const modulePath = "github.com/nodelane/nodelane"

// buildInfo returns the nodelane module's version, the binary's VCS
// revision (with "-dirty" when it was built from modified files) and the
// Go version, from debug.ReadBuildInfo; "unknown" for what the binary
// does not say.
func buildInfo() (version, revision, goVersion string) {
	version, revision, goVersion = "unknown", "unknown", "unknown"
	bi, ok := debug.ReadBuildInfo()
	if !ok {
		return
	}
	goVersion = bi.GoVersion
	mods := append([]*debug.Module{&bi.Main}, bi.Deps...)
	for _, mod := range mods {
		if mod.Path != modulePath {
			continue
		}
		if mod.Replace != nil && mod.Replace.Version != "" {
			mod = mod.Replace
		}
		if mod.Version != "" {
			version = mod.Version
		}
		break
	}
	dirty := false
	for _, s := range bi.Settings {
		switch s.Key {
		case "vcs.revision":
			revision = s.Value
		case "vcs.modified":
			dirty = s.Value == "true"
		}
	}
	if dirty && revision != "unknown" {
		revision += "-dirty"
	}
	return
}

// StatsSource reads the counts of the queue and the fleet;
// *workerapi.Server is one.
type StatsSource interface {
	Stats(ctx context.Context) (*lease.Stats, error)
}

// GaugesSource is an optional extension of StatsSource: a
// StatsCollector over one reads Gauges, whose Stats it uses, instead of
// Stats on each scrape; *workerapi.Server is one.
type GaugesSource interface {
	Gauges(ctx context.Context) (*workerapi.Gauges, error)
}

// UnleasableReasons are the reasons of queue_unleasable_jobs, each
// exported on every scrape (at zero when no job has it): the codes
// lease.Manager.Explain gives first for a queued job, and
// type_not_allowed for a type the envelope blocks. Any other code is
// counted as "other".
var UnleasableReasons = []lease.ReasonCode{
	lease.ReasonNoWorker, lease.ReasonJobType, lease.ReasonTypeNotApproved, lease.ReasonGPUSKU,
	lease.ReasonGPUCount, lease.ReasonVRAM, lease.ReasonMaxVRAM, lease.ReasonTagsMismatch,
	lease.ReasonScheduled, lease.ReasonBanned, lease.ReasonPendingApproval, lease.ReasonDraining,
	lease.ReasonWorkerOffline, lease.ReasonMaxJobs, lease.ReasonTypeNotAllowed,
}

// StatsCollector is a prometheus.Collector that reads a StatsSource on
// each scrape: the gauges queue_jobs{state,type}, workers{liveness} and
// stats_up and, when the source is a GaugesSource too,
// queue_oldest_job_age_seconds{type}, queue_unleasable_jobs{reason},
// queue_unleasable_truncated, envelope_active,
// fleet_workers{approval,banned,liveness} and fleet_workers_truncated.
type StatsCollector struct {
	src     StatsSource
	log     *slog.Logger
	timeout time.Duration
	types   *typeSet

	jobs, workers, up                                            *prometheus.Desc
	oldest, unleasable, unleasableCut, envelope, fleet, fleetCut *prometheus.Desc
}

// StatsTimeout bounds one scrape's read of the StatsSource.
const StatsTimeout = 5 * time.Second

// NewStatsCollector returns a StatsCollector over src, which bounds job
// type labels on its own (as Metrics does with the default Config, from
// the types registered workers declare). A failed read is logged to log
// (nil: discarded) at WARN and reported as stats_up 0, without the other
// gauges, so that the rest of the scrape goes on.
func NewStatsCollector(src StatsSource, log *slog.Logger) *StatsCollector {
	return newStatsCollector(src, log, newTypeSet(DefaultMaxJobTypes))
}

// StatsCollector is NewStatsCollector sharing m's known job types, so
// that its type labels are the counters' (see the package doc).
func (m *Metrics) StatsCollector(src StatsSource, log *slog.Logger) *StatsCollector {
	return newStatsCollector(src, log, m.types)
}

func newStatsCollector(src StatsSource, log *slog.Logger, types *typeSet) *StatsCollector {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &StatsCollector{
		src: src, log: log, timeout: StatsTimeout, types: types,
		jobs: prometheus.NewDesc(namespace+"_queue_jobs",
			"Jobs queued, leased and running, by state and job type (\"other\" for a type not known), read from the database when scraped.", []string{"state", "type"}, nil),
		workers: prometheus.NewDesc(namespace+"_workers",
			"Registered workers by liveness (online, stale, offline), read from the database when scraped.", []string{"liveness"}, nil),
		up: prometheus.NewDesc(namespace+"_stats_up",
			"1 if this scrape read the queue and worker counts, 0 if the database did not answer.", nil, nil),
		oldest: prometheus.NewDesc(namespace+"_queue_oldest_job_age_seconds",
			fmt.Sprintf("By job type (\"other\": the oldest of the types not known), how long ago the oldest queued job was dispatched, for at most %d types; a type with no queued job is missing.", workerapi.GaugesMaxTypes), []string{"type"}, nil),
		unleasable: prometheus.NewDesc(namespace+"_queue_unleasable_jobs",
			fmt.Sprintf("Queued jobs no registered worker could lease now, by the first reason (lease.Explain's codes, type_not_allowed for a type the envelope blocks), among the first %d queued jobs; max_jobs (every matching worker busy) and job_scheduled (backoff) are ordinary waits.", workerapi.GaugesMaxJobs), []string{"reason"}, nil),
		unleasableCut: prometheus.NewDesc(namespace+"_queue_unleasable_truncated",
			fmt.Sprintf("1 if more jobs were queued, or of more kinds, than one scrape judges (%d jobs, %d kinds): queue_unleasable_jobs is then a lower bound.", workerapi.GaugesMaxJobs, workerapi.GaugesMaxKinds), nil, nil),
		envelope: prometheus.NewDesc(namespace+"_envelope_active",
			"1 while the envelope's runtime is active (blocked job types may run), else 0.", nil, nil),
		fleet: prometheus.NewDesc(namespace+"_fleet_workers",
			fmt.Sprintf("Registered workers (the first %d in id order) by approval (approved, pending), ban (true, false) and liveness (online, stale, offline).", workerapi.GaugesMaxWorkers), []string{"approval", "banned", "liveness"}, nil),
		fleetCut: prometheus.NewDesc(namespace+"_fleet_workers_truncated",
			fmt.Sprintf("1 if more workers are registered than fleet_workers examines (%d).", workerapi.GaugesMaxWorkers), nil, nil),
	}
}

// Describe implements prometheus.Collector.
func (c *StatsCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{c.jobs, c.workers, c.up, c.oldest, c.unleasable, c.unleasableCut, c.envelope, c.fleet, c.fleetCut} {
		ch <- d
	}
}

// Collect implements prometheus.Collector.
func (c *StatsCollector) Collect(ch chan<- prometheus.Metric) {
	ctx, cancel := context.WithTimeout(context.Background(), c.timeout)
	defer cancel()
	var (
		st  *lease.Stats
		g   *workerapi.Gauges
		err error
	)
	if gs, ok := c.src.(GaugesSource); ok {
		if g, err = gs.Gauges(ctx); err == nil {
			st = g.Stats
		}
	} else {
		st, err = c.src.Stats(ctx)
	}
	if err != nil {
		c.log.Warn("reading the queue and worker counts for metrics", "err", err)
		ch <- prometheus.MustNewConstMetric(c.up, prometheus.GaugeValue, 0)
		return
	}
	ch <- prometheus.MustNewConstMetric(c.up, prometheus.GaugeValue, 1)
	if g != nil {
		// The types the workers declare are known before the counts
		// are labelled.
		for _, t := range g.JobTypes {
			c.types.learn(t)
		}
	}
	jobs := map[[2]string]int{}
	var order [][2]string
	for _, j := range st.Jobs {
		k := [2]string{string(j.State), c.types.label(j.Type)}
		if _, ok := jobs[k]; !ok {
			order = append(order, k)
		}
		jobs[k] += j.N
	}
	for _, k := range order {
		ch <- prometheus.MustNewConstMetric(c.jobs, prometheus.GaugeValue, float64(jobs[k]), k[0], k[1])
	}
	for _, l := range []lease.Liveness{lease.LivenessOnline, lease.LivenessStale, lease.LivenessOffline} {
		ch <- prometheus.MustNewConstMetric(c.workers, prometheus.GaugeValue, float64(st.Workers[l]), string(l))
	}
	if g != nil {
		c.collectGauges(ch, g)
	}
}

// collectGauges sends the gauges of a GaugesSource.
func (c *StatsCollector) collectGauges(ch chan<- prometheus.Metric, g *workerapi.Gauges) {
	oldest := map[string]time.Time{}
	for t, at := range g.OldestQueued {
		l := c.types.label(t)
		if cur, ok := oldest[l]; !ok || at.Before(cur) {
			oldest[l] = at
		}
	}
	for l, at := range oldest {
		ch <- prometheus.MustNewConstMetric(c.oldest, prometheus.GaugeValue, max(g.At.Sub(at), 0).Seconds(), l)
	}
	reasons := map[string]int{}
	for _, r := range UnleasableReasons {
		reasons[string(r)] = 0
	}
	for r, n := range g.Unleasable {
		if _, ok := reasons[string(r)]; ok {
			reasons[string(r)] += n
		} else {
			reasons[OtherType] += n
		}
	}
	for r, n := range reasons {
		ch <- prometheus.MustNewConstMetric(c.unleasable, prometheus.GaugeValue, float64(n), r)
	}
	ch <- prometheus.MustNewConstMetric(c.unleasableCut, prometheus.GaugeValue, b2f(g.UnleasableTruncated))
	ch <- prometheus.MustNewConstMetric(c.envelope, prometheus.GaugeValue, b2f(g.EnvelopeActive))
	fleet := map[workerapi.WorkerCount]int{}
	for _, pending := range []bool{false, true} {
		for _, banned := range []bool{false, true} {
			for _, l := range []lease.Liveness{lease.LivenessOnline, lease.LivenessStale, lease.LivenessOffline} {
				fleet[workerapi.WorkerCount{Pending: pending, Banned: banned, Liveness: l}] = 0
			}
		}
	}
	for _, w := range g.Workers {
		n := w.N
		w.N = 0
		fleet[w] += n
	}
	for k, n := range fleet {
		approval := "approved"
		if k.Pending {
			approval = "pending"
		}
		ch <- prometheus.MustNewConstMetric(c.fleet, prometheus.GaugeValue, float64(n), approval, strconv.FormatBool(k.Banned), string(k.Liveness))
	}
	ch <- prometheus.MustNewConstMetric(c.fleetCut, prometheus.GaugeValue, b2f(g.WorkersTruncated))
}

func b2f(b bool) float64 {
	if b {
		return 1
	}
	return 0
}
