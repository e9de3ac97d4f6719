package lease

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"io"
	"time"
)

// Config holds the Manager's settings. A zero setting means its default
// (the Default constants), a negative one is an error (WithDefaults), and
// a nil *Config means all defaults. workerapi.Config carries one, so
// that each setting, its default and its check are written once.
type Config struct {
	// LeaseTTL is how long a lease lives without an extension.
	// Defaults to DefaultLeaseTTL.
	LeaseTTL time.Duration
	// AcceptTimeout is how long a worker has to accept a leased job before
	// the job goes back to the queue. Defaults to DefaultAcceptTimeout.
	AcceptTimeout time.Duration
	// CancelGrace is how long a leased or running job's lease lives, at
	// most, once its cancel is requested: no extension renews it, and when
	// it runs out the job ends canceled. Defaults to DefaultCancelGrace.
	CancelGrace time.Duration
	// MaxRuntime is how long a job without Requirements.MaxRuntimeSeconds
	// may run under one lease, from accept: no extension carries a lease
	// past it, and a lease that reaches it ends the job failed
	// (CodeMaxRuntimeExceeded). Defaults to DefaultMaxRuntime; at most
	// MaxRuntimeLimit.
	MaxRuntime time.Duration
	// RetryBase is the backoff before the second attempt; each further
	// attempt doubles it, and jitter takes off up to half. Defaults to
	// DefaultRetryBase.
	RetryBase time.Duration
	// RetryMax caps the backoff; at least RetryBase. Defaults to
	// DefaultRetryMax.
	RetryMax time.Duration
	// DefaultMaxAttempts applies to jobs enqueued without MaxAttempts.
	// Defaults to DefaultMaxAttempts.
	DefaultMaxAttempts int
	// MaxJobsPerLease caps LeaseRequest.MaxJobs. Defaults to
	// DefaultMaxJobsPerLease.
	MaxJobsPerLease int
	// MaxLeasesPerWorker caps the live leases of any one worker, whatever
	// its own governor max_jobs says: a worker's governor may lower the
	// cap, never raise it. Defaults to DefaultMaxLeasesPerWorker.
	MaxLeasesPerWorker int
	// ListLimit is the page size of List when the filter gives none, and
	// the largest page it returns. Defaults to DefaultListLimit; at most
	// 1000.
	ListLimit int
	// ExplainWorkersTTL is how long Explain may reuse the list of workers
	// it read (dispatch explains every job it enqueues, and would
	// otherwise read every worker each time). Workers registered or
	// approved through this Manager are seen at once; other changes (on
	// another replica, or rolled back) within the TTL. Leasing never uses
	// the list. Defaults to DefaultExplainWorkersTTL; a negative value
	// turns reuse off.
	ExplainWorkersTTL time.Duration
	// HoldSweeps, when set, is asked before each sweep of due expiries
	// that Lease would run (see Lease), and true skips the sweep. workerapi
	// holds them while the replica's clock is off the database's, so that
	// a replica whose clock runs fast does not expire live leases; Expire
	// is not affected. Defaults to nil: Lease sweeps.
	HoldSweeps func() bool
	// LeaseEnded, when set, is the one hook that every end of a lease the
	// Manager makes without its worker's request goes through: Expire and
	// Lease's expiry sweep (a TTL, accept deadline, cancel grace or max
	// runtime run out), ExpireOffline, and Retire. It is called once for
	// each lease so ended, right after the job's write (see EndLease),
	// with the job as written (its LastError says why; its Lease is the
	// lease that ended; AcceptedAt, when set, is when that lease was
	// accepted) and a context that carries the write's transaction: the
	// one InTx began, or the caller's. It may write in that transaction
	// (workerapi mints the attempt's job_failed receipt there), and an
	// error it returns rolls the write back (with InTx; without it the
	// write stands) and is returned by the call that ended the lease. A
	// writer that lost the race for the job (another replica ended the
	// lease first) writes nothing and calls nothing. Defaults to nil.
	LeaseEnded func(ctx context.Context, j *Job) error
	// InTx, when set, runs fn in one transaction carried in fn's context,
	// committing only if fn returns nil, and joins the transaction ctx
	// carries, if any (workerapi passes its Transactor's InTx). Every
	// server-side end of a lease runs its write and LeaseEnded in one call
	// of it, so that both commit or neither does. Defaults to nil: each
	// write commits on its own.
	InTx func(ctx context.Context, fn func(ctx context.Context) error) error
	// Retention, when positive, is how long an ended job (succeeded,
	// failed or canceled) is kept after it finished: Prune deletes the
	// jobs that ended longer ago, with their events and artifacts.
	// Defaults to 0, which keeps every job.
	Retention time.Duration
	// HeartbeatInterval is how often workers are asked to heartbeat: a
	// worker last seen within it and half of it again is online, and one
	// seen longer ago is stale (it missed a heartbeat). Defaults to
	// DefaultHeartbeatInterval.
	HeartbeatInterval time.Duration
	// OfflineAfter is how long after it was last seen a worker is offline:
	// ExpireOffline ends its leases, and Explain does not count it. It
	// defaults to 3 × HeartbeatInterval, and may not be below
	// HeartbeatInterval (every worker would go offline between two
	// heartbeats).
	OfflineAfter time.Duration
	// Now is the clock. Defaults to time.Now.
	Now func() time.Time
	// Rand is the source of tokens, ids and jitter. Defaults to crypto/rand.Reader.
	Rand io.Reader
}

// The defaults of Config, exported so that hosts and their flags say
// them once. DefaultHeartbeatInterval is with Liveness.
const (
	DefaultLeaseTTL           = 600 * time.Second
	DefaultAcceptTimeout      = 60 * time.Second
	DefaultCancelGrace        = 60 * time.Second
	DefaultMaxRuntime         = 24 * time.Hour
	DefaultRetryBase          = 10 * time.Second
	DefaultRetryMax           = time.Hour
	DefaultMaxAttempts        = 3
	DefaultMaxJobsPerLease    = 32
	DefaultMaxLeasesPerWorker = 16
	DefaultListLimit          = 100
	DefaultExplainWorkersTTL  = time.Second
)

// ErrConfig is wrapped by the error WithDefaults returns for an invalid
// setting; the message names it.
var ErrConfig = errors.New("lease: invalid configuration")

// WithDefaults returns c with each zero setting replaced by its default,
// or an error that wraps ErrConfig and names the first invalid setting: a
// negative duration or limit (but ExplainWorkersTTL, where it turns reuse
// off), MaxRuntime over MaxRuntimeLimit, RetryMax below RetryBase,
// ListLimit over 1000, or OfflineAfter below HeartbeatInterval.
func (c Config) WithDefaults() (Config, error) {
	durations := []struct {
		name string
		v    *time.Duration
		def  time.Duration
	}{
		{"LeaseTTL", &c.LeaseTTL, DefaultLeaseTTL},
		{"AcceptTimeout", &c.AcceptTimeout, DefaultAcceptTimeout},
		{"CancelGrace", &c.CancelGrace, DefaultCancelGrace},
		{"MaxRuntime", &c.MaxRuntime, DefaultMaxRuntime},
		{"RetryBase", &c.RetryBase, DefaultRetryBase},
		{"RetryMax", &c.RetryMax, DefaultRetryMax},
		{"HeartbeatInterval", &c.HeartbeatInterval, DefaultHeartbeatInterval},
		{"ExplainWorkersTTL", &c.ExplainWorkersTTL, DefaultExplainWorkersTTL},
		{"Retention", &c.Retention, 0},
	}
	for _, d := range durations {
		switch {
		case *d.v < 0 && d.name != "ExplainWorkersTTL":
			return c, fmt.Errorf("%w: %s is negative (%v)", ErrConfig, d.name, *d.v)
		case *d.v == 0:
			*d.v = d.def
		}
	}
	switch {
	case c.OfflineAfter < 0:
		return c, fmt.Errorf("%w: OfflineAfter is negative (%v)", ErrConfig, c.OfflineAfter)
	case c.OfflineAfter == 0:
		c.OfflineAfter = 3 * c.HeartbeatInterval
	}
	limits := []struct {
		name string
		v    *int
		def  int
	}{
		{"DefaultMaxAttempts", &c.DefaultMaxAttempts, DefaultMaxAttempts},
		{"MaxJobsPerLease", &c.MaxJobsPerLease, DefaultMaxJobsPerLease},
		{"MaxLeasesPerWorker", &c.MaxLeasesPerWorker, DefaultMaxLeasesPerWorker},
		{"ListLimit", &c.ListLimit, DefaultListLimit},
	}
	for _, l := range limits {
		switch {
		case *l.v < 0:
			return c, fmt.Errorf("%w: %s is negative (%d)", ErrConfig, l.name, *l.v)
		case *l.v == 0:
			*l.v = l.def
		}
	}
	switch {
	case c.MaxRuntime > MaxRuntimeLimit:
		return c, fmt.Errorf("%w: MaxRuntime %v is over the protocol's %v", ErrConfig, c.MaxRuntime, MaxRuntimeLimit)
	case c.RetryMax < c.RetryBase:
		return c, fmt.Errorf("%w: RetryMax %v is below RetryBase %v", ErrConfig, c.RetryMax, c.RetryBase)
	case c.OfflineAfter < c.HeartbeatInterval:
		return c, fmt.Errorf("%w: OfflineAfter %v is below HeartbeatInterval %v: every worker would go offline between two heartbeats", ErrConfig, c.OfflineAfter, c.HeartbeatInterval)
	case c.DefaultMaxAttempts > maxAttempts:
		return c, fmt.Errorf("%w: DefaultMaxAttempts %d is over %d", ErrConfig, c.DefaultMaxAttempts, maxAttempts)
	case c.ListLimit > maxListPage:
		return c, fmt.Errorf("%w: ListLimit %d is over %d", ErrConfig, c.ListLimit, maxListPage)
	}
	if c.Now == nil {
		c.Now = time.Now
	}
	if c.Rand == nil {
		c.Rand = rand.Reader
	}
	return c, nil
}
