package client

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"slices"
	"sort"
	"sync"
	"time"

	"github.com/nodelane/nodelane/workerapi/wire"
)

// HandlerFunc runs one job. Its ctx is cancelled when the job must stop:
// context.Cause(ctx) then says why (ErrJobCanceled, ErrLeaseLost,
// ErrLeaseExpiring, ErrOffline, ErrDrained). Returning nil completes the job; an
// error fails it, to be retried unless wrapped with Permanent. r reports
// progress, logs and artifacts.
type HandlerFunc func(ctx context.Context, job *wire.Job, r *Reporter) error

// Why a job's context is cancelled (context.Cause).
var (
	// ErrJobCanceled means an operator cancelled the job (announced in a
	// heartbeat, status or accept answer). If the handler then returns an
	// error, the job is failed with error_code "canceled" and ends canceled.
	ErrJobCanceled = errors.New("client: the job was canceled")
	// ErrLeaseLost means the server says this worker no longer holds the job's
	// lease (it expired, or it was released). Nothing more is reported.
	ErrLeaseLost = errors.New("client: the job's lease was lost")
	// ErrLeaseExpiring means the lease could not be extended and is about to
	// expire (RunnerConfig.LeaseMargin before expires_at), so the worker
	// stops the job before the server may hand it to another worker.
	ErrLeaseExpiring = errors.New("client: the job's lease could not be renewed before it expires")
	// ErrOffline means no heartbeat got through before the heartbeat_deadline
	// of the last one answered (less a margin: RunnerConfig.LeaseMargin, at
	// most a fifth of the time the deadline gave), so the control plane
	// may deem the worker offline and give its jobs to another worker: the
	// worker stops every job it runs.
	ErrOffline = errors.New("client: no heartbeat got through before the control plane's heartbeat deadline")
	// ErrDrained means the worker is draining and the job did not finish within
	// RunnerConfig.DrainTimeout (or had not started when the drain began).
	// The job is released (no attempt used).
	ErrDrained = errors.New("client: the worker drained before the job finished")
)

// Permanent marks a handler's error as one that another attempt cannot
// fix: the job fails without a retry. Permanent(nil) is nil.
func Permanent(err error) error {
	if err == nil {
		return nil
	}
	return &permanentError{err}
}

type permanentError struct{ err error }

func (e *permanentError) Error() string { return e.err.Error() }

func (e *permanentError) Unwrap() error { return e.err }

// IsPermanent reports whether err was wrapped with Permanent.
func IsPermanent(err error) bool {
	var p *permanentError
	return errors.As(err, &p)
}

// WithErrorCode gives a handler's error the error_code its failure is
// reported with (by default "handler_error"; "panic" for a panic).
// WithErrorCode(code, nil) is nil.
func WithErrorCode(code string, err error) error {
	if err == nil {
		return nil
	}
	return &codedError{code: code, err: err}
}

type codedError struct {
	code string
	err  error
}

func (e *codedError) Error() string { return e.err.Error() }

func (e *codedError) Unwrap() error { return e.err }

// JobOutcome is how a job ended for this worker.
type JobOutcome string

// Outcomes of JobEnd.
const (
	// JobSucceeded means the job completed.
	JobSucceeded JobOutcome = "succeeded"
	// JobFailed means the job failed (FailResponse.Requeued says if it will be retried).
	JobFailed JobOutcome = "failed"
	// JobCanceled means the job failed with error_code "canceled" after a cancel, or
	// completed after one, which the server answers 409 job_canceled
	// (JobEnd.Err) as it ends the job canceled.
	JobCanceled JobOutcome = "canceled"
	// JobReleased means the job was handed back to the queue (drain, or not runnable here).
	JobReleased JobOutcome = "released"
	// JobLost means the lease was lost or about to expire; nothing reported.
	JobLost JobOutcome = "lost"
	// JobAbandoned means the result could not be reported (the server was out
	// of reach until the lease ran out, or refused it); the lease expires
	// on the server.
	JobAbandoned JobOutcome = "abandoned"
)

// JobEnd says how a job ended, for RunnerConfig.OnJobEnd.
type JobEnd struct {
	Job     wire.Job
	Outcome JobOutcome
	// Err is the handler's error, or why the outcome could not be reported.
	Err error
	// Complete or Fail is the server's answer, when one was given. A
	// completion sent in a batch (RunnerConfig.CompleteWindow) is answered
	// without the job: Complete.Job is then the job as accepted, with its
	// state succeeded and its receipt_id.
	Complete *wire.CompleteResponse
	Fail     *wire.FailResponse
}

// The defaults of RunnerConfig.
const (
	DefaultWaitSeconds = 20
	DefaultIdlePoll    = 5 * time.Second
	DefaultLeaseMargin = 30 * time.Second
	// DefaultSignalsWaitSeconds is the default of
	// RunnerConfig.SignalsWaitSeconds.
	DefaultSignalsWaitSeconds = 25
	DefaultDrainTimeout       = 25 * time.Second
	DefaultDrainGrace         = 3 * time.Second
	DefaultReportPatience     = 10 * time.Minute
	DefaultLogFlushInterval   = 2 * time.Second
	DefaultLogBatchSize       = 200
	DefaultMaxBufferedLogs    = 20000
	DefaultTokenRenewBefore   = 72 * time.Hour
)

// RunnerConfig holds a Runner's settings. A nil *RunnerConfig means all
// defaults (the identity must then hold a worker token). A zero duration
// or count means its default; a negative one is an error from NewRunner.
type RunnerConfig struct {
	// MaxConcurrent is how many jobs run at once. Defaults to the
	// registration's governor max_jobs, or 1.
	MaxConcurrent int
	// ProvisioningToken (node:register) lets the worker register when its
	// identity has no worker token, and register again if its token expired
	// or was revoked before it could be renewed. A registered worker renews
	// its token itself (see TokenRenewBefore) without it, so it is needed
	// only for the first registration and may then be removed from the
	// node. It is held in memory only.
	ProvisioningToken string
	// Registered, when set, is called after each registration whose
	// worker token the identity saved: the provisioning token is then no
	// longer needed on the node (cmd/worker deletes its file). It runs
	// before the Runner goes on, and must not block.
	Registered func(wire.RegisterResponse)
	// Registration is what the worker registers with; each registration
	// replaces the worker's record, capabilities included, so a node with
	// GPUs must describe them here. Defaults to the
	// identity's node id (or the host name) with the registered handlers'
	// job types and MaxConcurrent as governor max_jobs, and no GPU; when
	// given, an empty job_types is filled the same way.
	Registration *wire.RegisterRequest
	// SupportedGPUSKUs go in every lease request. Defaults to the SKUs of
	// Registration's GPUs.
	SupportedGPUSKUs []string
	// WaitSeconds is each lease request's long-poll, at most wire.MaxWaitSeconds. Defaults to
	// DefaultWaitSeconds.
	WaitSeconds int
	// IdlePoll is the pause after an empty lease answer that came back
	// without waiting (a server that does not long-poll). Defaults to
	// DefaultIdlePoll.
	IdlePoll time.Duration
	// HeartbeatInterval overrides the server's next_heartbeat_seconds.
	// Heartbeats also come sooner when a lease is close to its margin.
	HeartbeatInterval time.Duration
	// LeaseMargin is how long before a lease's expires_at a job whose lease
	// could not be extended is stopped (ErrLeaseExpiring); capped at a fifth
	// of the lease's lifetime. It is also how long before a heartbeat
	// deadline every job stops when no heartbeat got through (ErrOffline),
	// capped at a fifth of the time the deadline gave. Defaults to
	// DefaultLeaseMargin.
	LeaseMargin time.Duration
	// SignalsWaitSeconds is the wait_seconds of the control long-poll
	// (POST /workers/signals) the Runner keeps open, so that a cancel, a
	// lost job, an operator's drain request, a ban or a retirement reaches
	// it within seconds, whatever HeartbeatInterval is. Defaults to
	// DefaultSignalsWaitSeconds; at most wire.MaxSignalsWaitSeconds.
	SignalsWaitSeconds int
	// DrainTimeout is how long running jobs may take to finish once the
	// worker drains, before they are cancelled (ErrDrained) and released.
	// Defaults to DefaultDrainTimeout (a spot reclaim or a Kubernetes grace
	// period gives 30 s or more). DrainGrace is how long a cancelled handler
	// then has to return before its job is released anyway. Defaults to
	// DefaultDrainGrace.
	DrainTimeout time.Duration
	DrainGrace   time.Duration
	// CompleteWindow is how long a finished job's completion waits for
	// other jobs' to share one request (POST /workers/jobs/complete, up to
	// wire.MaxBatchComplete jobs): a worker that finishes many short jobs
	// sends far fewer requests. Only a worker with MaxConcurrent above 1
	// batches; a server without the batch route gets each completion
	// alone. Defaults to DefaultCompleteWindow.
	CompleteWindow time.Duration
	// WaitForProofs makes each completion ask the server to wait for its
	// receipts' proofs (wait_for_proofs), so that JobEnd.Complete carries
	// them and their checkpoint. By default a completion is answered at
	// once, with its receipts but no proofs (PROTOCOL.md §5.8), and the
	// job's slot is free sooner.
	WaitForProofs bool
	// ReportPatience bounds how long a job's result (complete, fail) is
	// retried while the server is out of reach; the lease's expiry bounds it
	// too. Defaults to DefaultReportPatience.
	ReportPatience time.Duration
	// LogFlushInterval is how often buffered log lines are sent.
	// Defaults to DefaultLogFlushInterval. LogBatchSize bounds the lines of
	// one request (defaults to DefaultLogBatchSize; at most
	// wire.MaxLogEntries), MaxBufferedLogs the
	// lines kept while the server is out of reach (defaults to
	// DefaultMaxBufferedLogs; the oldest are dropped beyond).
	LogFlushInterval time.Duration
	LogBatchSize     int
	MaxBufferedLogs  int
	// TokenRenewBefore is how long before it expires the worker token is
	// renewed (Client.RenewToken, signed by the node's key; no provisioning
	// token needed), or a third of its lifetime before, if that is sooner.
	// Defaults to DefaultTokenRenewBefore.
	TokenRenewBefore time.Duration
	// Metrics, if set, gives each heartbeat's metrics: a value that
	// marshals to a JSON object.
	Metrics func() any
	// OnJobEnd, if set, is called (from the job's goroutine) when a job
	// ends for this worker.
	OnJobEnd func(JobEnd)
	// Logger receives the worker's events. Defaults to the Client's.
	Logger *slog.Logger
}

// Runner is a worker node's runtime: it registers, heartbeats, leases jobs
// for its handlers, runs them with contexts that are cancelled when the
// job must stop, reports their logs and results, and drains on shutdown.
type Runner struct {
	c   *Client
	cfg RunnerConfig
	log *slog.Logger

	mu       sync.Mutex
	handlers map[string]HandlerFunc
	jobs     map[string]*task
	started  bool
	draining bool
	// drainAsked is set once the server said an operator asked this
	// worker to drain.
	drainAsked bool
	hbInterval time.Duration
	// leasesThrough is the server_time of the newest lease (or register
	// or start) answer whose grants are in jobs: what a heartbeat sends as
	// leases_through, so that the server ends only leases the worker has
	// heard of and does not hold.
	leasesThrough time.Time
	changed       chan struct{} // closed and replaced when jobs changes
	// offlineAt is when (local clock) the jobs stop unless a heartbeat
	// gets through first; offlineTimer fires then (offlineFired), until
	// offlineDone.
	offlineAt    time.Time
	offlineTimer *time.Timer
	offlineDone  bool

	drainOnce sync.Once
	drainCh   chan struct{}
	slotCh    chan struct{}
	hbKick    chan struct{}
	fatalCh   chan error

	baseCtx context.Context // jobs' parent: Run's values, never cancelled
	hardCtx context.Context // reporting; cancelled when Run ends
	// completes batches completions; nil sends each alone.
	completes *completer

	renewMu sync.Mutex
	// renewAt is when (server time) the token should be renewed;
	// lastTry when a renewal was last tried (server time).
	renewAt, lastTry time.Time
}

// NewRunner returns a Runner that talks through c. cfg may be nil. It
// fails, with an error that wraps ErrConfig and names the setting, when c
// is nil or a setting is invalid.
func NewRunner(c *Client, cfg *RunnerConfig) (*Runner, error) {
	if c == nil {
		return nil, fmt.Errorf("%w: NewRunner needs a Client", ErrConfig)
	}
	var wc RunnerConfig
	if cfg != nil {
		wc = *cfg
	}
	if err := defaults("RunnerConfig", []setting{
		{"IdlePoll", &wc.IdlePoll, DefaultIdlePoll},
		{"LeaseMargin", &wc.LeaseMargin, DefaultLeaseMargin},
		{"DrainTimeout", &wc.DrainTimeout, DefaultDrainTimeout},
		{"DrainGrace", &wc.DrainGrace, DefaultDrainGrace},
		{"ReportPatience", &wc.ReportPatience, DefaultReportPatience},
		{"LogFlushInterval", &wc.LogFlushInterval, DefaultLogFlushInterval},
		{"TokenRenewBefore", &wc.TokenRenewBefore, DefaultTokenRenewBefore},
		{"HeartbeatInterval", &wc.HeartbeatInterval, 0},
		{"CompleteWindow", &wc.CompleteWindow, DefaultCompleteWindow},
	}); err != nil {
		return nil, err
	}
	for _, n := range []struct {
		name string
		v    *int
		def  int
		max  int
	}{
		{"WaitSeconds", &wc.WaitSeconds, DefaultWaitSeconds, wire.MaxWaitSeconds},
		{"LogBatchSize", &wc.LogBatchSize, DefaultLogBatchSize, wire.MaxLogEntries},
		{"SignalsWaitSeconds", &wc.SignalsWaitSeconds, DefaultSignalsWaitSeconds, wire.MaxSignalsWaitSeconds},
		{"MaxBufferedLogs", &wc.MaxBufferedLogs, DefaultMaxBufferedLogs, 0},
		{"MaxConcurrent", &wc.MaxConcurrent, 0, 0},
	} {
		switch {
		case *n.v < 0:
			return nil, fmt.Errorf("%w: RunnerConfig.%s is negative (%d)", ErrConfig, n.name, *n.v)
		case n.max > 0 && *n.v > n.max:
			return nil, fmt.Errorf("%w: RunnerConfig.%s %d is over %d", ErrConfig, n.name, *n.v, n.max)
		case *n.v == 0:
			*n.v = n.def
		}
	}
	if wc.Logger == nil {
		wc.Logger = c.log
	}
	if wc.Registration != nil {
		r := *wc.Registration
		wc.Registration = &r
	}
	if wc.MaxConcurrent <= 0 {
		wc.MaxConcurrent = 1
		if wc.Registration != nil && wc.Registration.GovernorLimits.MaxJobs > 0 {
			wc.MaxConcurrent = wc.Registration.GovernorLimits.MaxJobs
		}
	}
	if wc.SupportedGPUSKUs == nil && wc.Registration != nil {
		for _, g := range wc.Registration.Capabilities.GPUs {
			if !slices.Contains(wc.SupportedGPUSKUs, g.SKU) {
				wc.SupportedGPUSKUs = append(wc.SupportedGPUSKUs, g.SKU)
			}
		}
	}
	return &Runner{
		c: c, cfg: wc, log: wc.Logger,
		handlers: map[string]HandlerFunc{},
		jobs:     map[string]*task{},
		changed:  make(chan struct{}),
		drainCh:  make(chan struct{}),
		slotCh:   make(chan struct{}, 1),
		hbKick:   make(chan struct{}, 1),
		fatalCh:  make(chan error, 1),
	}, nil
}

// Handle registers h for jobType. Call it before Run.
func (w *Runner) Handle(jobType string, h HandlerFunc) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.handlers[jobType] = h
}

// Drain asks the worker to stop: it leases nothing more, lets running jobs
// finish within DrainTimeout, releases those that do not, sends a last
// heartbeat with status "draining", and Run returns. Safe to call at any
// time, from any goroutine, more than once.
func (w *Runner) Drain() { w.drainOnce.Do(func() { close(w.drainCh) }) }

// Jobs returns the ids of the jobs the worker holds.
func (w *Runner) Jobs() []string {
	w.mu.Lock()
	defer w.mu.Unlock()
	ids := make([]string, 0, len(w.jobs))
	for id := range w.jobs {
		ids = append(ids, id)
	}
	sort.Strings(ids)
	return ids
}

// Run runs the worker until ctx is cancelled or Drain is called, then
// drains (see Drain) and returns nil. Jobs keep running while it drains:
// their contexts do not derive from ctx. It returns an error at once if
// the worker cannot register, and after stopping its jobs if the server
// refuses its credential for good (revoked, banned). Run may be called
// once.
func (w *Runner) Run(ctx context.Context) error {
	w.mu.Lock()
	if w.started {
		w.mu.Unlock()
		return errors.New("client: Runner.Run called twice")
	}
	w.started = true
	types := make([]string, 0, len(w.handlers))
	for t := range w.handlers {
		types = append(types, t)
	}
	w.mu.Unlock()
	if len(types) == 0 {
		return errors.New("client: the worker has no handler")
	}
	sort.Strings(types)
	if w.cfg.Registration == nil && w.cfg.ProvisioningToken != "" {
		host, _ := os.Hostname()
		node := w.c.id.NodeID()
		if node == "" {
			node = host
		}
		w.cfg.Registration = &wire.RegisterRequest{NodeID: node, Name: node, Hostname: host, Role: "worker",
			GovernorLimits: wire.GovernorLimits{MaxJobs: w.cfg.MaxConcurrent}}
	}
	if r := w.cfg.Registration; r != nil && len(r.Capabilities.JobTypes) == 0 {
		r.Capabilities.JobTypes = types
	}

	w.baseCtx = context.WithoutCancel(ctx)
	hardCtx, hardStop := context.WithCancel(w.baseCtx)
	defer hardStop()
	w.hardCtx = hardCtx
	if w.cfg.MaxConcurrent > 1 {
		w.completes = newCompleter(hardCtx, w.c, w.cfg.CompleteWindow)
	}

	fresh, err := w.ensureRegistered(ctx)
	if err != nil {
		return err
	}
	if !fresh {
		// A process that just started holds nothing: the server ends
		// every lease it thinks this worker holds, and records what it
		// runs now.
		if err := w.startUp(ctx, types); err != nil {
			return err
		}
	}
	go func() {
		select {
		case <-ctx.Done():
			w.Drain()
		case <-w.drainCh:
		}
	}()

	hbCtx, stopHB := context.WithCancel(w.baseCtx)
	hbDone := make(chan struct{})
	go func() {
		defer close(hbDone)
		w.heartbeatLoop(hbCtx)
	}()
	sigDone := make(chan struct{})
	go func() {
		defer close(sigDone)
		w.signalsLoop(hbCtx)
	}()
	leaseCtx, stopLeasing := context.WithCancel(w.baseCtx)
	leaseDone := make(chan struct{})
	go func() {
		defer close(leaseDone)
		w.leaseLoop(leaseCtx, types)
	}()

	var fatal error
	select {
	case <-w.drainCh:
	case fatal = <-w.fatalCh:
	}
	w.mu.Lock()
	w.draining = true
	w.mu.Unlock()
	stopLeasing()
	<-leaseDone
	w.kickHeartbeat()

	if fatal != nil {
		w.log.Error("stopping: the server refuses this worker", "err", fatal)
		w.stopJobs(fatal)
		w.waitIdle(w.cfg.DrainGrace)
	} else {
		w.log.Info("draining", "jobs", len(w.Jobs()), "timeout", w.cfg.DrainTimeout)
		if !w.waitIdle(w.cfg.DrainTimeout) {
			w.log.Warn("drain timeout: releasing the jobs still running", "jobs", w.Jobs())
			w.stopJobs(ErrDrained)
			w.waitIdle(w.cfg.DrainGrace)
		}
	}
	w.forceRelease()
	// Reports still being retried stop now; their jobs' leases lapse on
	// the server.
	hardStop()
	w.waitIdle(w.cfg.DrainGrace)
	w.Drain()
	stopHB()
	<-hbDone
	<-sigDone
	if fatal == nil {
		fctx, cancel := context.WithTimeout(w.baseCtx, w.finalTimeout())
		_, err := w.c.Heartbeat(fctx, wire.HeartbeatRequest{Status: "draining", CurrentJobs: w.Jobs(), Metrics: w.metrics()})
		cancel()
		if err != nil {
			w.log.Warn("final heartbeat", "err", err)
		}
	}
	return fatal
}

// ensureRegistered registers the node when it has no token (fresh is
// then true: the registration carried current_jobs []), or renews a token
// close to its expiry.
func (w *Runner) ensureRegistered(ctx context.Context) (fresh bool, err error) {
	tok, exp := w.c.id.Token(), w.c.id.TokenExpiresAt()
	if !exp.IsZero() {
		w.renewMu.Lock()
		w.renewAt = exp.Add(-w.cfg.TokenRenewBefore) // its lifetime is unknown
		w.renewMu.Unlock()
	}
	switch {
	case tok == "" && w.cfg.ProvisioningToken == "":
		return false, errors.New("client: the identity has no worker token and RunnerConfig.ProvisioningToken is empty")
	case tok == "":
		return true, w.register(ctx)
	case !exp.IsZero() && w.c.until(exp) < w.cfg.TokenRenewBefore:
		w.renewMu.Lock()
		err := w.refreshLocked(ctx)
		w.renewMu.Unlock()
		if err != nil {
			if w.c.until(exp) <= 0 {
				return false, err
			}
			w.log.Warn("renewing the worker token", "err", err)
		}
	}
	return false, nil
}

// startUp calls start (POST /workers/start) with what the worker runs now
// (RunnerConfig.Registration's fields, job types from its handlers) and
// current_jobs [], and logs what the answer says. A server without the
// route is logged and otherwise ignored; a refusal of the credential is
// returned.
func (w *Runner) startUp(ctx context.Context, types []string) error {
	req := wire.StartRequest{
		Capabilities:   wire.Capabilities{JobTypes: types},
		GovernorLimits: wire.GovernorLimits{MaxJobs: w.cfg.MaxConcurrent},
		CurrentJobs:    &[]string{},
	}
	if r := w.cfg.Registration; r != nil {
		req.Name, req.Hostname, req.Role, req.Version = r.Name, r.Hostname, r.Role, r.Version
		req.Capabilities, req.GovernorLimits, req.Tags = r.Capabilities, r.GovernorLimits, r.Tags
	}
	out, err := w.c.Start(ctx, req)
	switch {
	case err == nil:
	case isAuthFatal(err):
		return err
	default:
		w.log.Warn("start: the server did not take this worker's capabilities and current jobs", "err", err)
		return nil
	}
	w.sawLeases(out.ServerTime)
	receipt := "" // the worker_updated receipt's id, not its pointer
	if out.ReceiptID != nil {
		receipt = *out.ReceiptID
	}
	w.log.Info("started", "worker_id", out.WorkerID, "status", out.Status, "changed", out.Changed,
		"receipt_id", receipt, "ended_jobs", out.EndedJobs)
	if len(out.EndedJobs) > 0 {
		w.log.Warn("the server ended the leases of jobs this worker held before it restarted", "jobs", out.EndedJobs)
	}
	if len(out.PendingJobTypes)+len(out.PendingTags) > 0 {
		w.log.Warn("job types or tags await an operator's approval; they are not granted until then",
			"pending_job_types", out.PendingJobTypes, "pending_tags", out.PendingTags)
	}
	return nil
}

// sawLeases notes the server_time of an answer whose grants (if any) are
// in w.jobs already.
func (w *Runner) sawLeases(at time.Time) {
	w.mu.Lock()
	if at.After(w.leasesThrough) {
		w.leasesThrough = at
	}
	w.mu.Unlock()
}

// maybeRenew renews the token when it is due, at most once a minute
// (server time).
func (w *Runner) maybeRenew(ctx context.Context) {
	w.renewMu.Lock()
	defer w.renewMu.Unlock()
	now := w.c.ServerNow()
	if w.renewAt.IsZero() || now.Before(w.renewAt) || now.Sub(w.lastTry) < time.Minute {
		return
	}
	if err := w.refreshLocked(ctx); err != nil {
		w.log.Warn("renewing the worker token", "err", err)
	}
}

// register registers the node as Run starts: it holds nothing, and says
// so (current_jobs []).
func (w *Runner) register(ctx context.Context) error {
	w.renewMu.Lock()
	defer w.renewMu.Unlock()
	return w.registerLocked(ctx, &[]string{})
}

// registerLocked registers the node, with current_jobs held (nil: none
// sent, for a registration again while jobs run, whose grants in flight
// the worker may not have taken in).
func (w *Runner) registerLocked(ctx context.Context, held *[]string) error {
	if w.cfg.ProvisioningToken == "" || w.cfg.Registration == nil {
		return errors.New("client: cannot register: no RunnerConfig.ProvisioningToken")
	}
	w.lastTry = w.c.ServerNow()
	req := *w.cfg.Registration
	req.CurrentJobs = held
	out, err := w.c.Register(ctx, w.cfg.ProvisioningToken, req)
	if out == nil {
		return err
	}
	if held != nil {
		w.sawLeases(out.ServerTime)
		if len(out.EndedJobs) > 0 {
			w.log.Warn("the server ended the leases of jobs this worker held before it restarted", "jobs", out.EndedJobs)
		}
		if len(out.PendingJobTypes)+len(out.PendingTags) > 0 && out.Status != wire.RegisterStatusPending {
			w.log.Warn("job types or tags await an operator's approval; they are not granted until then",
				"pending_job_types", out.PendingJobTypes, "pending_tags", out.PendingTags)
		}
	}
	w.scheduleRenewal(out.TokenExpiresAt, out.ServerTime)
	w.log.Info("registered", "worker_id", out.WorkerID, "status", out.Status, "token_expires_at", out.TokenExpiresAt)
	if out.Status == wire.RegisterStatusPending {
		w.log.Warn("the control plane grants this node no job until an operator approves it", "worker_id", out.WorkerID)
	}
	if err != nil {
		w.log.Error("saving the identity", "err", err)
	} else if w.cfg.Registered != nil {
		w.cfg.Registered(*out)
	}
	return nil
}

// renew registers again after the server said the token used expired (an
// expired token cannot be renewed), unless another goroutine has renewed
// it since.
func (w *Runner) renew(ctx context.Context, used string) error {
	w.renewMu.Lock()
	defer w.renewMu.Unlock()
	if w.c.id.Token() != used {
		return nil
	}
	return w.registerLocked(ctx, nil)
}

func (w *Runner) setFatal(err error) {
	select {
	case w.fatalCh <- err:
	default:
	}
}

func (w *Runner) kickHeartbeat() {
	select {
	case w.hbKick <- struct{}{}:
	default:
	}
}

func (w *Runner) metrics() json.RawMessage {
	if w.cfg.Metrics == nil {
		return nil
	}
	b, err := json.Marshal(w.cfg.Metrics())
	if err != nil || !isObject(b) {
		w.log.Warn("heartbeat metrics are not a JSON object", "err", err)
		return nil
	}
	return b
}

// heartbeatLoop heartbeats until ctx ends.
func (w *Runner) heartbeatLoop(ctx context.Context) {
	defer w.stopOfflineWatch()
	failures := 0
	next := time.Duration(0)
	for {
		timer := time.NewTimer(next)
		select {
		case <-ctx.Done():
			timer.Stop()
			return
		case <-timer.C:
		case <-w.hbKick:
			timer.Stop()
		}
		used := w.c.id.Token()
		err := w.heartbeatOnce(ctx)
		interval := w.heartbeatInterval()
		switch {
		case err == nil:
			failures = 0
			next = interval
		case ctx.Err() != nil:
			return
		case IsCode(err, wire.CodeTokenExpired):
			if rerr := w.renew(ctx, used); rerr != nil {
				w.setFatal(fmt.Errorf("%w; renewing: %w", err, rerr))
				return
			}
			next = 0
		case isAuthFatal(err):
			w.setFatal(err)
			return
		default:
			failures++
			w.log.Warn("heartbeat failed", "err", err, "failures", failures)
			next = min(interval, backoffDelay(time.Second, 15*time.Second, failures)+500*time.Millisecond)
		}
		next = min(next, w.leaseUrgency(), w.offlineUrgency())
		if err == nil {
			w.maybeRenew(ctx)
		}
	}
}

func (w *Runner) heartbeatInterval() time.Duration {
	if w.cfg.HeartbeatInterval > 0 {
		return w.cfg.HeartbeatInterval
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.hbInterval > 0 {
		return w.hbInterval
	}
	return 30 * time.Second
}

// leaseUrgency is how soon the next heartbeat must come so that every
// lease is extended well before its margin.
func (w *Runner) leaseUrgency() time.Duration {
	d := time.Hour
	for _, t := range w.tasks() {
		t.mu.Lock()
		left := w.c.until(t.expiresAt) - t.margin()
		t.mu.Unlock()
		d = min(d, left/3)
	}
	return max(d, 100*time.Millisecond)
}

func (w *Runner) tasks() []*task {
	w.mu.Lock()
	defer w.mu.Unlock()
	ts := make([]*task, 0, len(w.jobs))
	for _, t := range w.jobs {
		ts = append(ts, t)
	}
	return ts
}

func (w *Runner) heartbeatOnce(ctx context.Context) error {
	w.mu.Lock()
	listed := make(map[string]*task, len(w.jobs))
	ids := make([]string, 0, len(w.jobs))
	for id, t := range w.jobs {
		listed[id] = t
		ids = append(ids, id)
	}
	status := "idle"
	switch {
	case w.draining:
		status = "draining"
	case len(ids) > 0:
		status = "busy"
	}
	// Read with the task set: every job granted at or before it that the
	// worker still holds is in ids.
	through := w.leasesThrough
	w.mu.Unlock()
	sort.Strings(ids)
	sent := time.Now()
	req := wire.HeartbeatRequest{Status: status, CurrentJobs: ids, Metrics: w.metrics()}
	if !through.IsZero() {
		req.LeasesThrough = &through
	}
	resp, err := w.c.Heartbeat(ctx, req)
	if err != nil {
		return err
	}
	if len(resp.EndedJobs) > 0 {
		w.log.Warn("the server ended leases this worker does not hold", "jobs", resp.EndedJobs)
	}
	// The deadline on this clock, from when the heartbeat was sent: no
	// clock skew, and no time the request spent in flight, moves it later.
	if window := resp.HeartbeatDeadline.Sub(resp.ServerTime); !resp.HeartbeatDeadline.IsZero() && window > 0 {
		w.watchOffline(sent.Add(window - min(w.cfg.LeaseMargin, window/5)))
	}
	if resp.NextHeartbeatSeconds > 0 {
		w.mu.Lock()
		w.hbInterval = time.Duration(resp.NextHeartbeatSeconds) * time.Second
		w.mu.Unlock()
	}
	// Only the tasks listed: a job that ended and was leased again since is
	// a new task, which this answer says nothing about.
	for _, l := range resp.Leases {
		if t := listed[l.JobID]; t != nil {
			t.extend(l.ExpiresAt)
		}
	}
	for _, id := range resp.LostJobs {
		if t := listed[id]; t != nil {
			t.lose()
		}
	}
	w.signaled(listed, resp.LostJobs, resp.CancelJobs)
	if resp.Drain {
		w.drainRequested()
	}
	for _, t := range listed {
		t.rearm() // the clock offset may have moved
	}
	return nil
}

// watchOffline (re)arms the watchdog that stops every job at (local
// clock) unless a heartbeat gets through first.
func (w *Runner) watchOffline(at time.Time) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.offlineDone {
		return
	}
	w.offlineAt = at
	if w.offlineTimer == nil {
		w.offlineTimer = time.AfterFunc(time.Until(at), w.offlineFired)
	} else {
		w.offlineTimer.Reset(time.Until(at))
	}
}

// offlineFired stops every job, unless a heartbeat moved the deadline
// meanwhile.
func (w *Runner) offlineFired() {
	w.mu.Lock()
	if w.offlineDone {
		w.mu.Unlock()
		return
	}
	if d := time.Until(w.offlineAt); d > 0 {
		w.offlineTimer.Reset(d)
		w.mu.Unlock()
		return
	}
	ts := make([]*task, 0, len(w.jobs))
	for _, t := range w.jobs {
		ts = append(ts, t)
	}
	w.mu.Unlock()
	for _, t := range ts {
		if context.Cause(t.ctx) == nil {
			t.w.log.Warn("no heartbeat got through before the control plane's deadline: stopping the job", "job", t.id)
		}
		t.cancel(ErrOffline)
	}
}

// offlineUrgency is how soon the next heartbeat must come so that it
// gets through well before the heartbeat deadline.
func (w *Runner) offlineUrgency() time.Duration {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.offlineAt.IsZero() {
		return time.Hour
	}
	return max(time.Until(w.offlineAt)/2, 100*time.Millisecond)
}

// stopOfflineWatch ends the watchdog when heartbeats end.
func (w *Runner) stopOfflineWatch() {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.offlineDone = true
	if w.offlineTimer != nil {
		w.offlineTimer.Stop()
	}
}

// leaseLoop leases jobs while slots are free, until ctx ends. It asks
// the server to accept what it grants (one request instead of one more per
// job); a grant that comes back leased (an older server, or a type the
// envelope refuses at accept) is accepted by its task.
func (w *Runner) leaseLoop(ctx context.Context, types []string) {
	failures := 0
	for ctx.Err() == nil {
		free := w.freeSlots()
		if free <= 0 {
			select {
			case <-ctx.Done():
				return
			case <-w.slotCh:
			}
			continue
		}
		start, used := time.Now(), w.c.id.Token()
		w.log.Debug("lease long-poll", "wait_seconds", w.cfg.WaitSeconds)
		resp, err := w.c.Lease(ctx, wire.LeaseRequest{
			SupportedJobTypes: types, SupportedGPUSKUs: w.cfg.SupportedGPUSKUs,
			MaxJobs: min(free, wire.MaxJobsPerLease), WaitSeconds: w.cfg.WaitSeconds, Accept: true,
		})
		switch {
		case err == nil:
			failures = 0
		case ctx.Err() != nil:
			return
		case IsCode(err, wire.CodeTokenExpired):
			if rerr := w.renew(ctx, used); rerr != nil {
				w.setFatal(fmt.Errorf("%w; renewing: %w", err, rerr))
				return
			}
			continue
		case isAuthFatal(err):
			w.setFatal(err)
			return
		default:
			failures++
			w.log.Warn("lease failed", "err", err, "failures", failures)
			sleep(ctx, backoffDelay(time.Second, 30*time.Second, failures)+time.Second)
			continue
		}
		for _, g := range resp.Leases {
			w.start(g)
		}
		// Every grant of the answer is in w.jobs now (or being released).
		w.sawLeases(resp.ServerTime)
		if len(resp.Leases) == 0 && time.Since(start) < time.Duration(w.cfg.WaitSeconds)*time.Second/2 {
			sleep(ctx, w.cfg.IdlePoll)
		}
	}
}

func (w *Runner) freeSlots() int {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.cfg.MaxConcurrent - len(w.jobs)
}

// start runs a granted job, or hands it back at once if the worker is
// draining or has no handler for it.
func (w *Runner) start(g wire.Grant) {
	w.mu.Lock()
	h := w.handlers[g.Job.JobType]
	// A job granted again under another lease token while its previous
	// attempt here is still reporting how it ended (a retry that is due at
	// once) is a new task: it replaces the old one in jobs, whose removal
	// then leaves it alone.
	old, held := w.jobs[g.Job.ID]
	reason := ""
	switch {
	case w.draining:
		reason = "drain"
	case h == nil:
		reason = "no handler for job type " + g.Job.JobType
	case held && old.token == g.LeaseToken:
		w.mu.Unlock()
		w.log.Error("the server leased a job this worker holds already", "job", g.Job.ID)
		return
	}
	if reason != "" {
		w.mu.Unlock()
		if _, err := w.c.Release(w.hardCtx, g.Job.ID, wire.ReleaseRequest{LeaseToken: g.LeaseToken, Reason: reason}); err != nil {
			w.log.Warn("releasing a job not run", "job", g.Job.ID, "reason", reason, "err", err)
		}
		w.ended(JobEnd{Job: g.Job, Outcome: JobReleased})
		return
	}
	t := newTask(w, g)
	w.jobs[g.Job.ID] = t
	w.notifyLocked()
	w.mu.Unlock()
	deadline := g.ExpiresAt
	if g.Job.State != wire.JobStateRunning && !g.AcceptBy.IsZero() && (deadline.IsZero() || g.AcceptBy.Before(deadline)) {
		deadline = g.AcceptBy
	}
	t.extend(deadline)
	go t.run(h)
}

func (w *Runner) notifyLocked() {
	close(w.changed)
	w.changed = make(chan struct{})
}

// remove forgets t and frees its slot.
func (w *Runner) remove(t *task) {
	w.mu.Lock()
	if w.jobs[t.id] == t {
		delete(w.jobs, t.id)
		w.notifyLocked()
	}
	w.mu.Unlock()
	select {
	case w.slotCh <- struct{}{}:
	default:
	}
}

// waitIdle waits up to d for the worker to hold no job.
func (w *Runner) waitIdle(d time.Duration) bool {
	timer := time.NewTimer(d)
	defer timer.Stop()
	for {
		w.mu.Lock()
		n, ch := len(w.jobs), w.changed
		w.mu.Unlock()
		if n == 0 {
			return true
		}
		select {
		case <-ch:
		case <-timer.C:
			return false
		}
	}
}

// stopJobs cancels every running job with cause.
func (w *Runner) stopJobs(cause error) {
	for _, t := range w.tasks() {
		t.stop(cause)
	}
}

// forceRelease releases, all at once, the jobs whose handlers did not
// return in time; their goroutines are abandoned and report nothing.
func (w *Runner) forceRelease() {
	ctx, cancel := context.WithTimeout(w.baseCtx, w.finalTimeout())
	defer cancel()
	var wg sync.WaitGroup
	for _, t := range w.tasks() {
		if !t.claim() {
			continue // reporting its own end; hardCtx bounds it
		}
		t.stop(ErrDrained)
		wg.Go(func() {
			_, err := w.c.Release(ctx, t.id, wire.ReleaseRequest{LeaseToken: t.token, Reason: "drain"})
			end := JobEnd{Job: t.jobCopy(), Outcome: JobReleased, Err: ErrDrained}
			if err != nil && !IsLeaseLost(err) {
				w.log.Warn("releasing a job at drain", "job", t.id, "err", err)
				end.Outcome, end.Err = JobAbandoned, err
			}
			t.finish()
			w.remove(t)
			w.ended(end)
		})
	}
	wg.Wait()
}

// finalTimeout bounds the last calls of a drain (releases, the final
// heartbeat): the node may be about to vanish.
func (w *Runner) finalTimeout() time.Duration {
	return min(w.c.cfg.RequestTimeout, max(w.cfg.DrainGrace, 5*time.Second))
}

func (w *Runner) ended(e JobEnd) {
	w.log.Info("job ended", "job", e.Job.ID, "type", e.Job.JobType, "outcome", e.Outcome, "err", e.Err)
	if w.cfg.OnJobEnd != nil {
		w.cfg.OnJobEnd(e)
	}
}
