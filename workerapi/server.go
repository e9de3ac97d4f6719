package workerapi

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/netip"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/mod/sumdb/note"

	"github.com/nodelane/nodelane/credential"
	"github.com/nodelane/nodelane/envelope"
	"github.com/nodelane/nodelane/fingerprint"
	"github.com/nodelane/nodelane/lease"
	"github.com/nodelane/nodelane/receipts"
	"github.com/nodelane/nodelane/replay"
	"github.com/nodelane/nodelane/workerapi/wire"
)

// Transactor runs fn in one transaction carried in fn's context: every
// store call made with that context joins it, and it commits only if fn
// returns nil. An InTx whose context already carries a transaction joins
// it: it runs fn in that transaction, without a savepoint, and returns
// fn's error, leaving the commit or rollback of the whole to the outer
// InTx. bunstore.DB implements it; workerapitest is its conformance
// suite.
//
// Isolation: READ COMMITTED or stronger. The stores decide on committed
// data and their own writes (see each core's Store), never on a read that
// another writer can invalidate, so no stronger level is needed; a
// stronger one only adds aborts.
//
// Aborts. When the database aborts the transaction (a deadlock, a
// serialization failure), the store call that meets it returns its core's
// ErrAborted (lease.ErrAborted, credential.ErrAborted, replay.ErrAborted,
// envelope.ErrAborted, receipts.ErrAborted, fingerprint.ErrAborted), and
// from then on nothing more of the transaction commits: every later store
// call with its context fails, and InTx returns a non-nil error even if fn
// returns nil. PostgreSQL keeps this by itself (an aborted transaction
// refuses every statement until it ends). InnoDB (MySQL, MariaDB) does
// not: a deadlock rolls the transaction back and the session goes on in
// autocommit, so an adapter on it remembers the abort in the transaction
// it carries and refuses every later call itself, or else a caller that
// goes on commits its next writes one by one.
//
// InTx runs fn once. It never runs fn again after an abort, nor on any
// other error: it returns fn's error, or its own, and whoever began the
// request runs it again (the Server answers 503 unavailable, and the
// worker retries the request with a new nonce). The functions the Server
// passes keep state outside the transaction (counts, the answers they
// return), so running one twice is not safe. A store method called
// without a transaction in its context may still retry its own
// transaction, as each core's Store says.
type Transactor interface {
	InTx(ctx context.Context, fn func(ctx context.Context) error) error
}

// SharedTransactor is what a Transactor may also implement to let
// concurrent requests share a transaction, and so its commit. The Server
// runs the transaction of each signed request but an upload's through
// InSharedTx when Stores.Tx implements it, and through InTx otherwise.
// bunstore.DB implements it.
type SharedTransactor interface {
	// InSharedTx runs fn in a transaction it may share with concurrent
	// callers of InSharedTx. fn's writes are atomic (a savepoint): fn's
	// error undoes only fn's writes and is returned to this caller only.
	// It returns once the shared transaction has ended; a failed commit
	// is every caller's error. key names what fn locks that other calls
	// with the same key lock too (the Server passes the node's id: each
	// request of a node writes the node's nonce row); an implementation
	// that runs several shared transactions at once keeps a key's calls
	// in one at a time, so that two never wait for each other there in
	// opposite orders. fn runs with ctx's values, but ctx's cancellation
	// need not reach it once it has begun. If ctx already carries a
	// transaction, fn joins it, as in InTx. When the database aborts the
	// shared transaction (a deadlock), every caller sharing it fails with
	// the abort, not only the one whose statement met it: on InnoDB a
	// deadlock rolls the whole transaction back, savepoints included.
	InSharedTx(ctx context.Context, key string, fn func(ctx context.Context) error) error
}

// Notifier wakes long-polls, on every replica, when jobs may have become
// leasable. It is required. bunstore implements it with LISTEN/NOTIFY on
// PostgreSQL and in process on SQLite; pollnotify implements it on any
// database by polling a counter, for databases without LISTEN/NOTIFY
// (MySQL, MariaDB, SQLite shared by several processes). A Notifier that
// also implements SignalNotifier wakes one worker's signals and lease
// long-polls when an operator's cancel, ban, retirement or drain concerns
// it; one that does not still works, each such signal then waking every
// long-poll (SignalNotifier).
//
// A wake-up must never come before the work it announces is visible: a
// long-poll woken early looks, finds nothing, and sleeps until its next
// look (up to 5 s later) while the work waits. workerapitest checks it.
type Notifier interface {
	// Notify announces new work. Called with a context that carries a
	// transaction, it wakes no subscriber, on any replica, before that
	// transaction commits, and wakes every subscriber once it has
	// committed; after a rollback it may wake them or not (a needless
	// wake-up costs one look). Called without one, it wakes every
	// subscriber.
	Notify(ctx context.Context) error
	// Subscribe returns a channel that receives after every Notify (on any
	// replica; several notifications may fold into one) until cancel is
	// called.
	Subscribe() (ch <-chan struct{}, cancel func())
}

// Stores are the storage a Server runs on. Tx, Notifier and the six
// stores are required; Clock and Schema are optional. Every store must
// join the transaction that Tx carries in a context. Beyond these, the
// Server looks for optional interfaces on what it is given and runs
// without each (README's "Writing a custom storage adapter" lists them
// and what each adds): SharedTransactor on Tx, SignalNotifier on
// Notifier, lease.DrainStore, lease.HeartbeatStore, lease.StatsCounter
// and lease.LeaseCounter on Leases, and receipts.BatchAdder on Receipts.
// workerapi/adaptertest runs every conformance suite on one set of
// Stores.
type Stores struct {
	Tx          Transactor
	Notifier    Notifier
	Leases      lease.Store
	Credentials credential.Store
	Nonces      replay.Store
	Envelope    envelope.Store
	Receipts    receipts.Store
	// Clock, when set, is the database's clock (bunstore.DB is one):
	// the Server measures its own clock against it (CheckClock), follows
	// it, and holds its clock-bound work while the two are more than
	// Config.MaxClockSkew apart. Replicas of one database then decide
	// lease expiries and signature windows by one clock. Without it the
	// Server trusts Config.Now, and Ready always reports ready.
	Clock DatabaseClock
	// Fingerprints keeps the fingerprints of the secrets every replica
	// must share (see Server.CheckSecrets).
	Fingerprints fingerprint.Store
	// Schema, when set, tells whether the database's schema is this
	// build's (bunstore.DB is one): CheckReady reports not ready while it
	// is not. Defaults to nil: not checked.
	Schema SchemaChecker
}

// SchemaChecker checks that a database's schema has every migration the
// build needs. bunstore.DB implements it.
type SchemaChecker interface {
	CheckMigrations(ctx context.Context) error
}

// The defaults of Config, exported so that hosts and their flags say them
// once. Those of Config.Lease are lease's, repeated here for hosts that
// name them through workerapi.
const (
	DefaultLeaseTTL           = lease.DefaultLeaseTTL
	DefaultAcceptTimeout      = lease.DefaultAcceptTimeout
	DefaultCancelGrace        = lease.DefaultCancelGrace
	DefaultMaxRuntime         = lease.DefaultMaxRuntime
	DefaultRetryBase          = lease.DefaultRetryBase
	DefaultRetryMax           = lease.DefaultRetryMax
	DefaultHeartbeatInterval  = lease.DefaultHeartbeatInterval
	DefaultMaxLeasesPerWorker = lease.DefaultMaxLeasesPerWorker

	DefaultWorkerTokenTTL   = 30 * 24 * time.Hour
	DefaultPollInterval     = 300 * time.Second
	DefaultMaxWait          = wire.MaxWaitSeconds * time.Second
	DefaultProofWait        = 10 * time.Second
	DefaultSequenceInterval = 100 * time.Millisecond
	DefaultSequenceBatch    = 512
	DefaultBodyLimit        = 1 << 20
	DefaultMaintainInterval = time.Second
	// DefaultMaxActiveRequests is the default of Config.MaxActiveRequests:
	// under bunstore's default pool of 20 connections, so that the
	// maintainer and the sequencer find one while requests queue.
	DefaultMaxActiveRequests = 16
	// DefaultMaxClockSkew and DefaultClockCheckInterval are the
	// defaults of Config.MaxClockSkew and Config.ClockCheckInterval.
	DefaultMaxClockSkew       = 2 * time.Second
	DefaultClockCheckInterval = time.Minute
)

// Config holds a Server's settings. A zero duration or limit means its
// default; a negative one is an error from New.
type Config struct {
	// Peppers and PepperVersion key the credential digests (see
	// credential.Config): at least one pepper of 32 bytes or more, and
	// PepperVersion names one of them. Required.
	Peppers       map[int][]byte
	PepperVersion int
	// ReceiptSigner is the note signer key (receipts.GenerateKey) that
	// signs checkpoints. Its key name must equal Origin, as C2SP
	// tlog-checkpoint recommends. Required.
	ReceiptSigner string
	// Origin names the receipt log in its checkpoints. Defaults to
	// receipts.DefaultOrigin.
	Origin string

	// Prices per GPU-hour in micro-USD, by SKU, snapshotted on each lease.
	Prices receipts.Prices

	// Lease configures the lease state machine: lease TTL, accept
	// timeout, cancel grace, max runtime, retry backoff, heartbeat
	// interval (the next_heartbeat_seconds answered; lease.Liveness),
	// offline threshold (the maintainer then ends a worker's live leases,
	// and each heartbeat answer's heartbeat_deadline is that moment),
	// retention of ended jobs (receipts are never deleted: a deleted
	// job's receipts still verify), the live leases per worker (a node's
	// governor_limits.max_jobs may lower it, never raise it) and the
	// rest. Each setting's default and check is lease.Config's
	// (lease.Config.WithDefaults); New adds the protocol's bounds:
	// MaxLeasesPerWorker at most wire.MaxCurrentJobs (the jobs one
	// heartbeat can name), MaxJobsPerLease at most wire.MaxJobsPerLease
	// (its default). The Server sets HoldSweeps, LeaseEnded, InTx, Now
	// and Rand itself, from its own clock and Rand; setting them here is
	// an error.
	Lease lease.Config

	// WorkerTokenTTL is the lifetime of a worker token. Defaults to
	// DefaultWorkerTokenTTL.
	WorkerTokenTTL time.Duration
	// ProvisioningTokenTTL is the lifetime of the provisioning token
	// Bootstrap mints, and ProvisioningRegistrations the most nodes it
	// may register (1 to wire.MaxRegistrations; re-registrations count):
	// a copied token is useful to no one for long. An operator mints the
	// next one with POST /operator/credentials. They default to
	// DefaultProvisioningTokenTTL and DefaultProvisioningRegistrations.
	ProvisioningTokenTTL      time.Duration
	ProvisioningRegistrations int64
	// AuditReceiptsPerHour is how many node_audit receipts, which are
	// never deleted, one node may mint in an hour (POST /workers/audit;
	// the hour begins at the first event after the last hour ended), at
	// least wire.MaxAuditEvents so that a full batch fits. Past it the
	// route answers 429 quota_exceeded with Retry-After and mints
	// nothing. Defaults to DefaultAuditReceiptsPerHour.
	AuditReceiptsPerHour int64
	// PollInterval is the poll_interval_seconds answered at registration.
	// Defaults to DefaultPollInterval.
	PollInterval time.Duration
	// MaxWait caps a lease request's wait_seconds. Defaults to (and may
	// not exceed) DefaultMaxWait.
	MaxWait time.Duration
	// ProofWait bounds how long a route that answers with a proof waits for
	// its receipt to be sequenced. Defaults to DefaultProofWait.
	ProofWait time.Duration
	// SequenceInterval is how often the sequencer that Start runs looks
	// for receipts to sequence when no request woke it (a completion
	// wakes it at once). Defaults to DefaultSequenceInterval.
	SequenceInterval time.Duration
	// SequenceBatch caps the receipts one sequencing transaction
	// integrates under one signed checkpoint. Defaults to
	// DefaultSequenceBatch.
	SequenceBatch int
	// BodyLimit caps request bodies, in bytes. Defaults to DefaultBodyLimit.
	BodyLimit int64
	// Shares bound what all callers share, so that no one caller takes
	// all of it: the bytes of request bodies held at once, and the
	// long-polls open, per node and in all (shares.go).
	Shares Shares
	// MaxActiveRequests is how many requests may run their database work
	// at once: the credential check when the credential store must read
	// it (one it keeps in memory takes no turn: credential.MemoryOnly),
	// and a signed request's transaction.
	// The others wait their turn in the order they came, holding no
	// connection; a long-poll's wait holds no turn, each of its looks
	// takes one. Without it requests would queue in the database pool,
	// which hands a freed connection to a random waiter (database/sql):
	// under load most requests then wait little and a few wait many
	// times longer (measured with 10,000 nodes heartbeating: heartbeat
	// p50 0.6 s, p99 29 s, max 55 s). Keep it under the pool's size
	// (bunstore.Config.MaxOpenConns), so that the maintainer and the
	// sequencer find a connection. Defaults to DefaultMaxActiveRequests;
	// a negative value means no limit.
	MaxActiveRequests int
	// MaintainInterval is how often the maintainer that Start runs
	// expires leases and activations and collects nonces. Defaults to
	// DefaultMaintainInterval.
	MaintainInterval time.Duration
	// MaxClockSkew is how far the Server's clock (Now) may be from the
	// database's (Stores.Clock) before the Server holds its maintainer and
	// lease expiry sweeps and reports not ready (see CheckClock). Defaults
	// to DefaultMaxClockSkew.
	MaxClockSkew time.Duration
	// ClockCheckInterval is how often Start's background work measures
	// the clock against the database's. Defaults to
	// DefaultClockCheckInterval.
	ClockCheckInterval time.Duration
	// AnswerTTL is how long the first answer to a fail, a release, or an
	// artifact or audit report sent with an idempotency_key is
	// remembered, for a repeat to get it (PROTOCOL.md "Retries"); a
	// lease's is remembered until the accept_by of its grants. Defaults
	// to DefaultAnswerTTL.
	AnswerTTL time.Duration
	// EnvelopeSafe and EnvelopeBlocked extend the envelope's job types.
	EnvelopeSafe, EnvelopeBlocked []string

	// ApproveNodes makes every new node register pending: register answers
	// status "pending", and the node is granted no job until an operator
	// approves it (POST /operator/workers/{id}/approve). Nodes registered
	// before are not affected, and turning it off approves no one.
	// Defaults to false: a node with a provisioning credential is trusted
	// at once.
	ApproveNodes bool
	// PublicOrigin is the URL workers reach this Server's Handler (or
	// WorkerHandler) at, such as "https://cp.example.com/nodelane", when
	// a proxy in front rewrites Host or strips a path prefix: an absolute
	// http or https URL, optionally with a path prefix, without userinfo,
	// query or fragment. Worker signatures are then verified against
	// @authority = its host (lowercased, without the default port of its
	// scheme) and @path = its path (without a trailing "/"), then the path
	// the handler routes (r.URL's, after any http.StripPrefix of the
	// host), whatever Host and path the proxy forwarded; @query is the
	// query as received. Defaults to "": signatures are verified against
	// the request as received, which needs a proxy to forward Host and the
	// path unchanged.
	PublicOrigin string
	// TrustedProxies are the addresses of the proxies in front of the
	// Server. The request log's client_addr is the peer's IP, or, when the
	// peer is in one of them, the right-most X-Forwarded-For address that
	// is not. X-Forwarded-For is read for that log attribute only, never
	// for anything else. Defaults to none: client_addr is the peer's IP.
	TrustedProxies []netip.Prefix

	// Artifacts says whether and how the Server keeps artifact bytes:
	// by default it keeps none (artifacts are metadata only).
	Artifacts ArtifactConfig

	// Logger receives request logs (never a secret). Defaults to a logger
	// that discards everything.
	Logger *slog.Logger
	// Metrics observes requests; if it also implements EventMetrics, it
	// counts leases, sequenced receipts and replay refusals too.
	// Defaults to nil: none.
	Metrics Metrics
	// Hooks lets the host react to job changes and receipts; Start runs
	// their delivery. Defaults to nil: none.
	Hooks Hooks

	// Now is the clock. Defaults to time.Now.
	Now func() time.Time
	// Rand is the source of randomness. Defaults to crypto/rand.Reader.
	Rand io.Reader
}

// Server serves the worker and operator routes over its Stores. It is
// safe for concurrent use; several Servers (replicas) may share one
// database. Start runs its background work and Stop ends it.
type Server struct {
	st          Stores
	cfg         Config
	log         *slog.Logger
	leases      *lease.Manager
	issuer      *credential.Issuer
	verifier    *replay.Verifier
	gate        *envelope.Gate
	receipts    *receipts.Log
	seq         *receipts.Sequencer
	verifierKey string
	hooks       *hookRunner
	life        lifecycle
	// seqOutage and maintOutage log the failures of the sequencer and
	// the maintainer once per outage.
	seqOutage, maintOutage *outage
	// clock is the Server's clock against the database's (clock.go).
	clock dbClock
	// origin is Config.PublicOrigin parsed, or nil; trusted is
	// Config.TrustedProxies (clientaddr.go).
	origin  *publicOrigin
	trusted []netip.Prefix
	// secrets is set once CheckSecrets succeeded.
	secrets struct {
		sync.Mutex
		ok bool
	}
	// parked counts the long-polls waiting (LongPolls).
	parked atomic.Int64
	// relay hands notifications to waiting long-polls.
	relay *relay
	// turns holds a token per request running its database work
	// (Config.MaxActiveRequests; nil: no limit). Senders blocked on a
	// channel are woken in the order they blocked: turns are taken in
	// arrival order.
	turns chan struct{}
	// uploads counts the part streams of each worker (artifacts.go);
	// swept is when the maintainer last swept the artifact store.
	slots  uploadSlots
	swept  atomic.Int64
	cursor sweepCursor
	// shares counts what is in use of Config.Shares.
	shares *shares
}

// ErrConfig is wrapped by every error of New about a missing or invalid
// store or setting; the message names it.
var ErrConfig = errors.New("workerapi: invalid configuration")

// New returns a Server. It fails, with an error that wraps ErrConfig and
// names the setting, when a store is missing or a setting is missing or
// invalid, so that a misconfigured host stops at startup rather than on
// its first request.
func New(st Stores, cfg Config) (*Server, error) {
	if err := st.Validate(); err != nil {
		return nil, err
	}
	if err := cfg.setDefaults(); err != nil {
		return nil, err
	}
	var err error
	s := &Server{st: st, cfg: cfg, log: cfg.Logger, relay: newRelay(st.Notifier), shares: newShares(cfg.Shares)}
	if cfg.MaxActiveRequests > 0 {
		s.turns = make(chan struct{}, cfg.MaxActiveRequests)
	}
	if cfg.PublicOrigin != "" {
		if s.origin, err = parsePublicOrigin(cfg.PublicOrigin); err != nil {
			return nil, err
		}
	}
	if s.trusted, err = checkTrustedProxies(cfg.TrustedProxies); err != nil {
		return nil, err
	}
	s.seqOutage = newOutage(s.log, "receipt sequencer", cfg.Now)
	s.maintOutage = newOutage(s.log, "maintainer", cfg.Now)
	s.clock.failures = newOutage(s.log, "clock check", cfg.Now)
	lc := cfg.Lease
	lc.HoldSweeps, lc.LeaseEnded, lc.InTx, lc.Now, lc.Rand = s.clockHeld, s.leaseEnded, s.endTx, s.clockNow, cfg.Rand
	s.leases = lease.NewManager(st.Leases, &lc)
	if s.issuer, err = credential.NewIssuer(st.Credentials, &credential.Config{
		Peppers: cfg.Peppers, PepperVersion: cfg.PepperVersion, Now: s.clockNow, Rand: cfg.Rand,
	}); err != nil {
		return nil, fmt.Errorf("%w: Peppers/PepperVersion: %w", ErrConfig, err)
	}
	s.verifier = replay.NewVerifier(st.Nonces, &replay.VerifierConfig{Now: s.clockNow})
	if s.gate, err = envelope.NewGate(st.Envelope, &envelope.Config{
		ExtraSafe: cfg.EnvelopeSafe, ExtraBlocked: cfg.EnvelopeBlocked, Now: s.clockNow,
	}); err != nil {
		return nil, fmt.Errorf("%w: EnvelopeSafe/EnvelopeBlocked: %w", ErrConfig, err)
	}
	rcfg := &receipts.Config{Origin: cfg.Origin, Now: s.clockNow, Rand: cfg.Rand,
		Interval: cfg.SequenceInterval, BatchSize: cfg.SequenceBatch,
		OnError: s.seqOutage.fail, OnRecover: s.seqOutage.ok, OnSequenced: s.sequenced}
	s.receipts = receipts.NewLog(st.Receipts, rcfg)
	signer, err := note.NewSigner(cfg.ReceiptSigner)
	if err != nil {
		return nil, fmt.Errorf("%w: ReceiptSigner is not a note signer key (receipts.GenerateKey makes one)", ErrConfig)
	}
	if signer.Name() != cfg.Origin {
		return nil, fmt.Errorf("%w: ReceiptSigner's key name %q differs from Origin %q: generate the key with the origin as its name", ErrConfig, signer.Name(), cfg.Origin)
	}
	if s.seq, err = receipts.NewSequencer(st.Receipts, signer, rcfg); err != nil {
		return nil, fmt.Errorf("%w: %w", ErrConfig, err)
	}
	if s.verifierKey, err = receipts.VerifierKey(cfg.ReceiptSigner); err != nil {
		return nil, fmt.Errorf("%w: ReceiptSigner: %w", ErrConfig, err)
	}
	s.hooks = newHookRunner(cfg.Hooks, s.log)
	return s, nil
}

// Validate reports the first store of st that New requires and st lacks,
// with an error that wraps ErrConfig and names it ("Stores.Notifier is
// required"). The conformance suites call it on the Stores they are
// given.
func (st Stores) Validate() error {
	for _, c := range []struct {
		name    string
		missing bool
	}{
		{"Tx", st.Tx == nil}, {"Notifier", st.Notifier == nil}, {"Leases", st.Leases == nil},
		{"Credentials", st.Credentials == nil}, {"Nonces", st.Nonces == nil},
		{"Envelope", st.Envelope == nil}, {"Receipts", st.Receipts == nil},
		{"Fingerprints", st.Fingerprints == nil},
	} {
		if c.missing {
			return fmt.Errorf("%w: Stores.%s is required", ErrConfig, c.name)
		}
	}
	return nil
}

// setDefaults fills in the defaults and reports the first invalid setting.
func (c *Config) setDefaults() error {
	switch {
	case len(c.Peppers) == 0:
		return fmt.Errorf("%w: Peppers is required (at least one pepper of 32 random bytes)", ErrConfig)
	case c.Peppers[c.PepperVersion] == nil:
		return fmt.Errorf("%w: PepperVersion %d names no pepper of Peppers", ErrConfig, c.PepperVersion)
	case c.ReceiptSigner == "":
		return fmt.Errorf("%w: ReceiptSigner is required (receipts.GenerateKey makes one)", ErrConfig)
	}
	durations := []struct {
		name string
		v    *time.Duration
		def  time.Duration
	}{
		{"WorkerTokenTTL", &c.WorkerTokenTTL, DefaultWorkerTokenTTL},
		{"ProvisioningTokenTTL", &c.ProvisioningTokenTTL, DefaultProvisioningTokenTTL},
		{"PollInterval", &c.PollInterval, DefaultPollInterval},
		{"MaxWait", &c.MaxWait, DefaultMaxWait},
		{"ProofWait", &c.ProofWait, DefaultProofWait},
		{"SequenceInterval", &c.SequenceInterval, DefaultSequenceInterval},
		{"MaintainInterval", &c.MaintainInterval, DefaultMaintainInterval},
		{"MaxClockSkew", &c.MaxClockSkew, DefaultMaxClockSkew},
		{"ClockCheckInterval", &c.ClockCheckInterval, DefaultClockCheckInterval},
		{"AnswerTTL", &c.AnswerTTL, DefaultAnswerTTL},
	}
	for _, d := range durations {
		switch {
		case *d.v < 0:
			return fmt.Errorf("%w: %s is negative (%v)", ErrConfig, d.name, *d.v)
		case *d.v == 0:
			*d.v = d.def
		}
	}
	switch {
	case c.MaxWait > DefaultMaxWait:
		return fmt.Errorf("%w: MaxWait %v is over the protocol's %v", ErrConfig, c.MaxWait, DefaultMaxWait)
	case c.BodyLimit < 0:
		return fmt.Errorf("%w: BodyLimit is negative (%d)", ErrConfig, c.BodyLimit)
	case c.BodyLimit == 0:
		c.BodyLimit = DefaultBodyLimit
	}
	switch {
	case c.ProvisioningRegistrations < 0 || c.ProvisioningRegistrations > wire.MaxRegistrations:
		return fmt.Errorf("%w: ProvisioningRegistrations %d is not 1 to %d", ErrConfig, c.ProvisioningRegistrations, wire.MaxRegistrations)
	case c.ProvisioningRegistrations == 0:
		c.ProvisioningRegistrations = DefaultProvisioningRegistrations
	}
	switch {
	case c.AuditReceiptsPerHour < 0 || c.AuditReceiptsPerHour > 0 && c.AuditReceiptsPerHour < wire.MaxAuditEvents:
		return fmt.Errorf("%w: AuditReceiptsPerHour %d is below the %d events of one batch", ErrConfig, c.AuditReceiptsPerHour, wire.MaxAuditEvents)
	case c.AuditReceiptsPerHour == 0:
		c.AuditReceiptsPerHour = DefaultAuditReceiptsPerHour
	}
	if c.MaxActiveRequests == 0 {
		c.MaxActiveRequests = DefaultMaxActiveRequests
	}
	switch {
	case c.SequenceBatch < 0:
		return fmt.Errorf("%w: SequenceBatch is negative (%d)", ErrConfig, c.SequenceBatch)
	case c.SequenceBatch == 0:
		c.SequenceBatch = DefaultSequenceBatch
	}
	switch l := &c.Lease; {
	case l.HoldSweeps != nil || l.LeaseEnded != nil || l.InTx != nil || l.Now != nil || l.Rand != nil:
		return fmt.Errorf("%w: Lease.HoldSweeps, LeaseEnded, InTx, Now and Rand are the Server's own: set Config.Now and Config.Rand instead", ErrConfig)
	case l.MaxJobsPerLease > wire.MaxJobsPerLease:
		return fmt.Errorf("%w: Lease.MaxJobsPerLease %d is over the protocol's %d", ErrConfig, l.MaxJobsPerLease, wire.MaxJobsPerLease)
	case l.MaxLeasesPerWorker > wire.MaxCurrentJobs:
		// A heartbeat names every job its node holds in current_jobs.
		return fmt.Errorf("%w: Lease.MaxLeasesPerWorker %d is over the %d jobs a heartbeat can name", ErrConfig, l.MaxLeasesPerWorker, wire.MaxCurrentJobs)
	case l.MaxJobsPerLease == 0:
		l.MaxJobsPerLease = wire.MaxJobsPerLease
	}
	var err error
	if c.Lease, err = c.Lease.WithDefaults(); err != nil {
		return fmt.Errorf("%w: Lease: %w", ErrConfig, err)
	}
	if c.Artifacts, err = c.Artifacts.WithDefaults(); err != nil {
		return err
	}
	if c.Shares, err = c.Shares.WithDefaults(c.BodyLimit); err != nil {
		return err
	}
	if c.Origin == "" {
		c.Origin = receipts.DefaultOrigin
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	if c.Now == nil {
		c.Now = time.Now
	}
	if c.Rand == nil {
		c.Rand = rand.Reader
	}
	return nil
}

// ReceiptVerifierKey is the note verifier key of the receipt log, what
// PROTOCOL.md calls receipt_public_key: third parties verify receipts
// offline with it.
func (s *Server) ReceiptVerifierKey() string { return s.verifierKey }

// Issuer returns the credential issuer, for a host that mints operator
// and provisioning credentials at setup.
func (s *Server) Issuer() *credential.Issuer { return s.issuer }

// Leases returns the lease manager, for a host that enqueues jobs in Go.
func (s *Server) Leases() *lease.Manager { return s.leases }

// now is the Server's clock in UTC microseconds.
func (s *Server) now() time.Time { return s.clockNow().UTC().Truncate(time.Microsecond) }
