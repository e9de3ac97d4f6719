package workerapi

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"time"

	"golang.org/x/mod/sumdb/note"

	"github.com/nodelane/nodelane/credential"
	"github.com/nodelane/nodelane/envelope"
	"github.com/nodelane/nodelane/lease"
	"github.com/nodelane/nodelane/receipts"
	"github.com/nodelane/nodelane/replay"
)

// Transactor runs fn in one transaction carried in fn's context: every
// store call made with that context joins it, and it commits only if fn
// returns nil. A Transactor nested in another joins the outer one.
// bunstore.DB implements it.
type Transactor interface {
	InTx(ctx context.Context, fn func(ctx context.Context) error) error
}

// Notifier wakes long-polls, on every replica, when jobs may have become
// leasable. bunstore implements it with LISTEN/NOTIFY on PostgreSQL and
// in process on SQLite.
type Notifier interface {
	// Notify announces new work. Called with a context that carries a
	// transaction, it may deliver only once that transaction commits.
	Notify(ctx context.Context) error
	// Subscribe returns a channel that receives after every Notify (on any
	// replica; several notifications may fold into one) until cancel is
	// called.
	Subscribe() (ch <-chan struct{}, cancel func())
}

// Stores are the storage a Server runs on. All are required. Every store
// must join the transaction that Tx carries in a context.
type Stores struct {
	Tx          Transactor
	Notifier    Notifier
	Leases      lease.Store
	Credentials credential.Store
	Nonces      replay.NonceStore
	Envelope    envelope.Store
	Receipts    receipts.Store
}

// Config holds a Server's settings.
type Config struct {
	// Peppers and PepperVersion key the credential digests (see
	// credential.Config). Required.
	Peppers       map[int][]byte
	PepperVersion int
	// ReceiptSigner is the note signer key (receipts.GenerateKey) that
	// signs checkpoints. Required.
	ReceiptSigner string
	// Origin names the receipt log in its checkpoints. Defaults to
	// receipts.DefaultOrigin.
	Origin string

	// Prices per GPU-hour in micro-USD, by SKU, snapshotted on each lease.
	Prices receipts.Prices

	// LeaseTTL defaults to 600 s; AcceptTimeout to 60 s.
	LeaseTTL      time.Duration
	AcceptTimeout time.Duration
	// RetryBase and RetryMax shape the backoff before a retried job is
	// eligible again (see lease.Config). Default to 10 s and 1 h.
	RetryBase, RetryMax time.Duration
	// WorkerTokenTTL is the lifetime of a worker token. Defaults to 30 days.
	WorkerTokenTTL time.Duration
	// HeartbeatInterval is the next_heartbeat_seconds answered. Defaults to 30 s.
	HeartbeatInterval time.Duration
	// PollInterval is the poll_interval_seconds answered at registration.
	// Defaults to 300 s.
	PollInterval time.Duration
	// MaxWait caps a lease request's wait_seconds. Defaults to 60 s.
	MaxWait time.Duration
	// ProofWait bounds how long a route that answers with a proof waits for
	// its receipt to be sequenced. Defaults to 10 s.
	ProofWait time.Duration
	// BodyLimit caps request bodies. Defaults to 1 MiB.
	BodyLimit int64
	// EnvelopeSafe and EnvelopeBlocked extend the envelope's job types.
	EnvelopeSafe, EnvelopeBlocked []string

	// Logger receives request logs (never a secret). Defaults to a logger
	// that discards everything.
	Logger *slog.Logger
	// Metrics observes requests. Defaults to nil: none.
	Metrics Metrics
	// Hooks lets the host react to job changes and receipts. Defaults to
	// nil: none.
	Hooks Hooks

	// Now is the clock. Defaults to time.Now.
	Now func() time.Time
	// Rand is the source of randomness. Defaults to crypto/rand.Reader.
	Rand io.Reader
}

// Server serves the worker and operator routes over its Stores. It is
// safe for concurrent use; several Servers (replicas) may share one
// database.
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
}

// New returns a Server. It reports a missing store or setting.
func New(st Stores, cfg Config) (*Server, error) {
	switch {
	case st.Tx == nil || st.Notifier == nil || st.Leases == nil || st.Credentials == nil ||
		st.Nonces == nil || st.Envelope == nil || st.Receipts == nil:
		return nil, errors.New("workerapi: every store is required")
	case cfg.ReceiptSigner == "":
		return nil, errors.New("workerapi: Config.ReceiptSigner is required")
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	if cfg.Rand == nil {
		cfg.Rand = rand.Reader
	}
	if cfg.WorkerTokenTTL <= 0 {
		cfg.WorkerTokenTTL = 30 * 24 * time.Hour
	}
	if cfg.HeartbeatInterval <= 0 {
		cfg.HeartbeatInterval = 30 * time.Second
	}
	if cfg.PollInterval <= 0 {
		cfg.PollInterval = 300 * time.Second
	}
	if cfg.MaxWait <= 0 {
		cfg.MaxWait = 60 * time.Second
	}
	if cfg.ProofWait <= 0 {
		cfg.ProofWait = 10 * time.Second
	}
	if cfg.BodyLimit <= 0 {
		cfg.BodyLimit = 1 << 20
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	s := &Server{st: st, cfg: cfg, log: cfg.Logger}
	s.leases = lease.NewManager(st.Leases, &lease.Config{
		LeaseTTL: cfg.LeaseTTL, AcceptTimeout: cfg.AcceptTimeout, RetryBase: cfg.RetryBase, RetryMax: cfg.RetryMax,
		Now: cfg.Now, Rand: cfg.Rand,
	})
	var err error
	if s.issuer, err = credential.NewIssuer(st.Credentials, &credential.Config{
		Peppers: cfg.Peppers, PepperVersion: cfg.PepperVersion, Now: cfg.Now, Rand: cfg.Rand,
	}); err != nil {
		return nil, fmt.Errorf("workerapi: %w", err)
	}
	s.verifier = replay.NewVerifier(st.Nonces, &replay.VerifierConfig{Now: cfg.Now})
	if s.gate, err = envelope.NewGate(st.Envelope, &envelope.Config{
		ExtraSafe: cfg.EnvelopeSafe, ExtraBlocked: cfg.EnvelopeBlocked, Now: cfg.Now,
	}); err != nil {
		return nil, fmt.Errorf("workerapi: %w", err)
	}
	rcfg := &receipts.Config{Origin: cfg.Origin, Now: cfg.Now, Rand: cfg.Rand,
		OnError: func(err error) { s.log.Error("receipt sequencer", "err", err) }}
	s.receipts = receipts.NewLog(st.Receipts, rcfg)
	signer, err := note.NewSigner(cfg.ReceiptSigner)
	if err != nil {
		return nil, errors.New("workerapi: Config.ReceiptSigner is not a note signer key")
	}
	if s.seq, err = receipts.NewSequencer(st.Receipts, signer, rcfg); err != nil {
		return nil, fmt.Errorf("workerapi: %w", err)
	}
	if s.verifierKey, err = receipts.VerifierKey(cfg.ReceiptSigner); err != nil {
		return nil, fmt.Errorf("workerapi: %w", err)
	}
	s.hooks = newHookRunner(cfg.Hooks, s.log)
	return s, nil
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
func (s *Server) now() time.Time { return s.cfg.Now().UTC().Truncate(time.Microsecond) }
