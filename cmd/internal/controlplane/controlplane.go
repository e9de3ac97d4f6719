// Package controlplane wires nodelane's storage to its handlers the way a
// host application does: bunstore on SQLite or PostgreSQL, a secrets file
// with the credential pepper and the receipt signing key, and a
// workerapi.Server with its maintainer. The example server and the demo
// share it.
package controlplane

import (
	"context"
	"crypto/rand"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"net/netip"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/nodelane/nodelane/bunstore"
	"github.com/nodelane/nodelane/lease"
	"github.com/nodelane/nodelane/receipts"
	"github.com/nodelane/nodelane/workerapi"
)

// Options configure a control plane.
type Options struct {
	// DB is a bunstore DSN: sqlite:PATH or postgres://...
	DB string
	// DBMaxConns is bunstore.Config.MaxOpenConns: the connections the
	// database pool holds at most (0: bunstore's default, 20 on
	// PostgreSQL and no limit on SQLite; negative: no limit).
	DBMaxConns int
	// SecretsFile holds the pepper and the receipt signing key; it is
	// created 0600 on first use. Replicas share it: the Server refuses to
	// start on secrets other than the database's (see
	// workerapi.Server.CheckSecrets).
	SecretsFile string
	// ExistingSecrets makes Open fail when SecretsFile does not exist,
	// rather than create it: a command that only uses the secrets (the
	// break-glass mint-operator) must not make up new ones.
	ExistingSecrets bool
	LeaseTTL        time.Duration
	AcceptTimeout   time.Duration
	Prices          receipts.Prices
	// Origin names the receipt log. Defaults to receipts.DefaultOrigin.
	Origin string
	// MaintainInterval is workerapi.Config.MaintainInterval.
	MaintainInterval time.Duration
	// ApproveNodes, MaxLeasesPerWorker, CancelGrace and MaxRuntime are
	// workerapi.Config's.
	ApproveNodes       bool
	MaxLeasesPerWorker int
	CancelGrace        time.Duration
	MaxRuntime         time.Duration
	// RetryBase is workerapi.Config.Lease.RetryBase: the backoff before a
	// job's second attempt.
	RetryBase time.Duration
	// Retention is workerapi.Config.Lease.Retention: 0 keeps every job.
	Retention time.Duration
	// ProvisioningTokenTTL, ProvisioningRegistrations and
	// AuditReceiptsPerHour are workerapi.Config's.
	ProvisioningTokenTTL      time.Duration
	ProvisioningRegistrations int64
	AuditReceiptsPerHour      int64
	// HeartbeatInterval and OfflineAfter are workerapi.Config's.
	HeartbeatInterval time.Duration
	OfflineAfter      time.Duration
	// SequenceInterval and SequenceBatch are workerapi.Config's.
	SequenceInterval time.Duration
	SequenceBatch    int
	// PublicOrigin and TrustedProxies are workerapi.Config's: the URL
	// workers use when a proxy in front rewrites Host or strips a prefix,
	// and the proxies whose X-Forwarded-For the request log believes.
	PublicOrigin   string
	TrustedProxies []netip.Prefix
	Logger         *slog.Logger
	// Metrics is workerapi.Config.Metrics (the example server's
	// Prometheus adapter). Defaults to nil: none.
	Metrics workerapi.Metrics
	// Now is the clock, for tests. Defaults to time.Now.
	Now func() time.Time
	// Artifacts is workerapi.Config.Artifacts: the store of artifact
	// bytes and its limits. The zero value keeps no bytes.
	Artifacts workerapi.ArtifactConfig
	// Shares is workerapi.Config.Shares: each caller's share of the body
	// bytes and long-polls every caller shares. The zero value is
	// workerapi's defaults.
	Shares workerapi.Shares
	// SafeTypes is workerapi.Config.EnvelopeSafe: job types that always
	// run, beside the canonical safe ones (server -safe-type). A
	// canonical blocked type among them is refused at Open.
	SafeTypes []string
}

// ControlPlane is an open control plane. Close it when done.
type ControlPlane struct {
	DB       *bunstore.DB
	Notifier *bunstore.Notifier
	Server   *workerapi.Server
}

// Open opens the database (migrating it), loads or creates the secrets,
// and builds the Server.
func Open(ctx context.Context, o Options) (*ControlPlane, error) {
	if o.Origin == "" {
		o.Origin = receipts.DefaultOrigin
	}
	load := LoadOrCreateSecrets
	if o.ExistingSecrets {
		load = func(path, _ string) (*Secrets, error) { return LoadSecrets(path) }
	}
	sec, err := load(o.SecretsFile, o.Origin)
	if err != nil {
		return nil, err
	}
	db, err := bunstore.Open(ctx, o.DB, &bunstore.Config{MaxOpenConns: o.DBMaxConns})
	if err != nil {
		return nil, err
	}
	n, err := db.Notifier(ctx, &bunstore.NotifierConfig{Logger: o.Logger})
	if err != nil {
		db.Close()
		return nil, err
	}
	srv, err := workerapi.New(workerapi.Stores{
		Tx:           db,
		Notifier:     n,
		Leases:       db.LeaseStore(),
		Credentials:  db.CredentialStore(),
		Nonces:       db.NonceStore(nil),
		Envelope:     db.EnvelopeStore(),
		Receipts:     db.ReceiptStore(),
		Fingerprints: db.FingerprintStore(),
		Clock:        db,
		Schema:       db,
	}, workerapi.Config{
		Peppers:       map[int][]byte{sec.PepperVersion: sec.Pepper},
		PepperVersion: sec.PepperVersion,
		ReceiptSigner: sec.ReceiptSigner,
		Origin:        o.Origin,
		Prices:        o.Prices,
		Lease: lease.Config{
			LeaseTTL: o.LeaseTTL, AcceptTimeout: o.AcceptTimeout, CancelGrace: o.CancelGrace, MaxRuntime: o.MaxRuntime,
			HeartbeatInterval: o.HeartbeatInterval, OfflineAfter: o.OfflineAfter,
			MaxLeasesPerWorker: o.MaxLeasesPerWorker, Retention: o.Retention, RetryBase: o.RetryBase,
		},
		MaintainInterval:          o.MaintainInterval,
		ApproveNodes:              o.ApproveNodes,
		SequenceInterval:          o.SequenceInterval,
		SequenceBatch:             o.SequenceBatch,
		PublicOrigin:              o.PublicOrigin,
		TrustedProxies:            o.TrustedProxies,
		Logger:                    o.Logger,
		Metrics:                   o.Metrics,
		Now:                       o.Now,
		Artifacts:                 o.Artifacts,
		Shares:                    o.Shares,
		EnvelopeSafe:              o.SafeTypes,
		ProvisioningTokenTTL:      o.ProvisioningTokenTTL,
		ProvisioningRegistrations: o.ProvisioningRegistrations,
		AuditReceiptsPerHour:      o.AuditReceiptsPerHour,
	})
	if err != nil {
		n.Close()
		db.Close()
		return nil, err
	}
	return &ControlPlane{DB: db, Notifier: n, Server: srv}, nil
}

// Close stops the server's background work (see workerapi.Server.Stop,
// bounded by ctx) and closes the notifier and the database.
func (cp *ControlPlane) Close(ctx context.Context) error {
	return errors.Join(cp.Server.Stop(ctx), cp.Notifier.Close(), cp.DB.Close())
}

// Secrets are what every replica of one control plane shares.
type Secrets struct {
	PepperVersion int    `json:"pepper_version"`
	Pepper        []byte `json:"pepper"`
	// ReceiptSigner is a golang.org/x/mod/sumdb/note signer key.
	ReceiptSigner string `json:"receipt_signer"`
}

// LoadOrCreateSecrets reads the secrets file, or creates it (mode 0600,
// its receipt signing key named origin, as checkpoints require,
// never overwriting) with a fresh 32-byte pepper and signing key. It
// refuses a file that others may read.
func LoadOrCreateSecrets(path, origin string) (*Secrets, error) {
	s, err := LoadSecrets(path)
	if errors.Is(err, fs.ErrNotExist) {
		return createSecrets(path, origin)
	}
	return s, err
}

// LoadSecrets reads the secrets file, which must exist (else an error
// that matches fs.ErrNotExist). It refuses a file that others may read.
func LoadSecrets(path string) (*Secrets, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("secrets file: %w", err)
	}
	if fi, err := os.Stat(path); err == nil && fi.Mode().Perm()&0o077 != 0 {
		return nil, fmt.Errorf("secrets file %s is readable by others (mode %v): chmod 600 it", path, fi.Mode().Perm())
	}
	var s Secrets
	if err := json.Unmarshal(b, &s); err != nil || len(s.Pepper) < 32 || s.PepperVersion < 1 || s.ReceiptSigner == "" {
		return nil, fmt.Errorf("secrets file %s is malformed", path)
	}
	return &s, nil
}

func createSecrets(path, origin string) (*Secrets, error) {
	s := &Secrets{PepperVersion: 1, Pepper: make([]byte, 32)}
	if _, err := rand.Read(s.Pepper); err != nil {
		return nil, err
	}
	var err error
	if s.ReceiptSigner, _, err = receipts.GenerateKey(rand.Reader, origin); err != nil {
		return nil, err
	}
	b, err := json.MarshalIndent(s, "", "  ")
	if err != nil {
		return nil, err
	}
	if dir := filepath.Dir(path); dir != "" {
		if err := os.MkdirAll(dir, 0o700); err != nil {
			return nil, err
		}
	}
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if errors.Is(err, fs.ErrExist) {
		return LoadOrCreateSecrets(path, origin) // another replica created it first
	}
	if err != nil {
		return nil, fmt.Errorf("secrets file: %w", err)
	}
	if _, err := f.Write(append(b, '\n')); err != nil {
		f.Close()
		os.Remove(path)
		return nil, err
	}
	if err := f.Sync(); err != nil {
		f.Close()
		return nil, err
	}
	return s, f.Close()
}

// Tokens is the tokens file the example server writes on its first start.
type Tokens struct {
	OperatorToken     string `json:"operator_token"`
	ProvisioningToken string `json:"provisioning_token"`
	ReceiptPublicKey  string `json:"receipt_public_key"`
}

// WriteFileAtomic writes v as JSON to path, mode 0600, through a
// temporary file and a rename, so a reader never sees half a file.
func WriteFileAtomic(path string, v any) error {
	b, err := json.MarshalIndent(v, "", "  ")
	if err != nil {
		return err
	}
	f, err := os.CreateTemp(filepath.Dir(path), ".tmp-"+filepath.Base(path)+"-*")
	if err != nil {
		return err
	}
	tmp := f.Name()
	defer os.Remove(tmp)
	if err := f.Chmod(0o600); err != nil {
		f.Close()
		return err
	}
	if _, err := f.Write(append(b, '\n')); err != nil {
		f.Close()
		return err
	}
	if err := f.Sync(); err != nil {
		f.Close()
		return err
	}
	if err := f.Close(); err != nil {
		return err
	}
	return os.Rename(tmp, path)
}

// ParseTrustedProxy parses a trusted proxy given as a CIDR prefix
// ("10.0.0.0/8", "fd00::/8") or a bare IP address (a prefix of that one
// address).
func ParseTrustedProxy(s string) (netip.Prefix, error) {
	if p, err := netip.ParsePrefix(s); err == nil {
		return p.Masked(), nil
	}
	a, err := netip.ParseAddr(s)
	if err != nil || a.Zone() != "" {
		return netip.Prefix{}, fmt.Errorf("%q is neither an IP address nor a CIDR prefix (such as 10.0.0.1 or 10.0.0.0/8)", s)
	}
	return netip.PrefixFrom(a, a.BitLen()), nil
}

// CheckPublicURL checks a public URL as workerapi.Config.PublicOrigin
// takes it, for a flag to refuse a wrong one before anything starts: an
// absolute http or https URL with a host, optionally a path, and no
// userinfo, query or fragment. The workerapi.Server checks it again.
//
// Its errors never repeat a password the URL holds.
func CheckPublicURL(s string) error {
	u, err := url.Parse(s)
	switch {
	case err != nil:
		return errors.New("the value does not parse as a URL")
	case u.User != nil:
		return errors.New("the URL has userinfo (user@ or user:password@); workers sign no credentials into the URL")
	case u.Scheme != "http" && u.Scheme != "https", u.Opaque != "", u.Hostname() == "":
		return fmt.Errorf("%q is not an absolute http:// or https:// URL with a host", s)
	case u.RawQuery != "" || u.ForceQuery || u.Fragment != "" || strings.Contains(s, "#"):
		return fmt.Errorf("%q has a query or a fragment: give the URL the workers use, a path prefix at most", s)
	}
	return nil
}
