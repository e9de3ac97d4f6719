package workerapi_test

import (
	"context"
	"crypto/rand"
	"errors"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/nodelane/nodelane/lease"
	"github.com/nodelane/nodelane/receipts"
	"github.com/nodelane/nodelane/workerapi"
	"github.com/nodelane/nodelane/workerapi/wire"
)

// New refuses a missing store or a missing or invalid setting, with an
// error that wraps ErrConfig and names it, instead of failing later.
func TestNewFailsFast(t *testing.T) {
	t.Parallel()
	otherName, _, err := receipts.GenerateKey(rand.Reader, "nodelane-receipts")
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name   string
		change func(*workerapi.Stores, *workerapi.Config)
		want   string
	}{
		{"no Tx", func(s *workerapi.Stores, _ *workerapi.Config) { s.Tx = nil }, "Stores.Tx"},
		{"no Notifier", func(s *workerapi.Stores, _ *workerapi.Config) { s.Notifier = nil }, "Stores.Notifier"},
		{"no Leases", func(s *workerapi.Stores, _ *workerapi.Config) { s.Leases = nil }, "Stores.Leases"},
		{"no Credentials", func(s *workerapi.Stores, _ *workerapi.Config) { s.Credentials = nil }, "Stores.Credentials"},
		{"no Nonces", func(s *workerapi.Stores, _ *workerapi.Config) { s.Nonces = nil }, "Stores.Nonces"},
		{"no Envelope", func(s *workerapi.Stores, _ *workerapi.Config) { s.Envelope = nil }, "Stores.Envelope"},
		{"a canonical blocked type made safe", func(_ *workerapi.Stores, c *workerapi.Config) { c.EnvelopeSafe = []string{"eval_run", "raw_training"} }, "raw_training"},
		{"no Receipts", func(s *workerapi.Stores, _ *workerapi.Config) { s.Receipts = nil }, "Stores.Receipts"},
		{"no Fingerprints", func(s *workerapi.Stores, _ *workerapi.Config) { s.Fingerprints = nil }, "Stores.Fingerprints"},
		{"no peppers", func(_ *workerapi.Stores, c *workerapi.Config) { c.Peppers = nil }, "Peppers"},
		{"pepper version unknown", func(_ *workerapi.Stores, c *workerapi.Config) { c.PepperVersion = 2 }, "PepperVersion"},
		{"short pepper", func(_ *workerapi.Stores, c *workerapi.Config) { c.Peppers = map[int][]byte{1: make([]byte, 8)} }, "Peppers"},
		{"no signer", func(_ *workerapi.Stores, c *workerapi.Config) { c.ReceiptSigner = "" }, "ReceiptSigner"},
		{"bad signer", func(_ *workerapi.Stores, c *workerapi.Config) { c.ReceiptSigner = "PRIVATE+KEY+x+1+abc" }, "ReceiptSigner"},
		{"signer name is not the origin", func(_ *workerapi.Stores, c *workerapi.Config) { c.ReceiptSigner = otherName }, "Origin"},
		{"negative LeaseTTL", func(_ *workerapi.Stores, c *workerapi.Config) { c.Lease.LeaseTTL = -time.Second }, "LeaseTTL"},
		{"negative AcceptTimeout", func(_ *workerapi.Stores, c *workerapi.Config) { c.Lease.AcceptTimeout = -time.Second }, "AcceptTimeout"},
		{"negative CancelGrace", func(_ *workerapi.Stores, c *workerapi.Config) { c.Lease.CancelGrace = -time.Second }, "CancelGrace"},
		{"negative MaxRuntime", func(_ *workerapi.Stores, c *workerapi.Config) { c.Lease.MaxRuntime = -time.Second }, "MaxRuntime"},
		{"MaxRuntime over the protocol", func(_ *workerapi.Stores, c *workerapi.Config) { c.Lease.MaxRuntime = 31 * 24 * time.Hour }, "MaxRuntime"},
		{"negative MaintainInterval", func(_ *workerapi.Stores, c *workerapi.Config) { c.MaintainInterval = -1 }, "MaintainInterval"},
		{"negative AnswerTTL", func(_ *workerapi.Stores, c *workerapi.Config) { c.AnswerTTL = -1 }, "AnswerTTL"},
		{"negative ProofWait", func(_ *workerapi.Stores, c *workerapi.Config) { c.ProofWait = -1 }, "ProofWait"},
		{"MaxWait over the protocol", func(_ *workerapi.Stores, c *workerapi.Config) { c.MaxWait = 2 * time.Minute }, "MaxWait"},
		{"RetryMax below RetryBase", func(_ *workerapi.Stores, c *workerapi.Config) {
			c.Lease.RetryBase, c.Lease.RetryMax = time.Hour, time.Minute
		}, "RetryMax"},
		{"negative SequenceInterval", func(_ *workerapi.Stores, c *workerapi.Config) { c.SequenceInterval = -1 }, "SequenceInterval"},
		{"negative SequenceBatch", func(_ *workerapi.Stores, c *workerapi.Config) { c.SequenceBatch = -1 }, "SequenceBatch"},
		{"negative Retention", func(_ *workerapi.Stores, c *workerapi.Config) { c.Lease.Retention = -time.Hour }, "Retention"},
		{"negative BodyLimit", func(_ *workerapi.Stores, c *workerapi.Config) { c.BodyLimit = -1 }, "BodyLimit"},
		{"negative Artifacts.MaxBytes", func(_ *workerapi.Stores, c *workerapi.Config) { c.Artifacts.MaxBytes = -1 }, "Artifacts.MaxBytes"},
		{"negative Artifacts.MaxPerJob", func(_ *workerapi.Stores, c *workerapi.Config) { c.Artifacts.MaxPerJob = -1 }, "Artifacts.MaxPerJob"},
		{"Artifacts.MaxPerJob over a page", func(_ *workerapi.Stores, c *workerapi.Config) { c.Artifacts.MaxPerJob = 1000 }, "Artifacts.MaxPerJob"},
		{"negative Artifacts.MaxUploadsPerWorker", func(_ *workerapi.Stores, c *workerapi.Config) { c.Artifacts.MaxUploadsPerWorker = -1 }, "Artifacts.MaxUploadsPerWorker"},
		{"negative Artifacts.PartSize", func(_ *workerapi.Stores, c *workerapi.Config) { c.Artifacts.PartSize = -1 }, "Artifacts.PartSize"},
		{"Artifacts.PartSize under 1 MiB", func(_ *workerapi.Stores, c *workerapi.Config) { c.Artifacts.PartSize = 1000 }, "Artifacts.PartSize"},
		{"Artifacts.MaxBytes in too many parts", func(_ *workerapi.Stores, c *workerapi.Config) {
			c.Artifacts.PartSize, c.Artifacts.MaxBytes = workerapi.MinPartSize, workerapi.MaxUploadParts*workerapi.MinPartSize+1
		}, "Artifacts.MaxBytes"},
		{"negative Artifacts.UploadTTL", func(_ *workerapi.Stores, c *workerapi.Config) { c.Artifacts.UploadTTL = -1 }, "Artifacts.UploadTTL"},
		{"negative Artifacts.SweepInterval", func(_ *workerapi.Stores, c *workerapi.Config) { c.Artifacts.SweepInterval = -1 }, "Artifacts.SweepInterval"},
		{"negative MaxLeasesPerWorker", func(_ *workerapi.Stores, c *workerapi.Config) { c.Lease.MaxLeasesPerWorker = -1 }, "MaxLeasesPerWorker"},
		{"negative OfflineAfter", func(_ *workerapi.Stores, c *workerapi.Config) { c.Lease.OfflineAfter = -time.Second }, "OfflineAfter"},
		{"OfflineAfter below HeartbeatInterval", func(_ *workerapi.Stores, c *workerapi.Config) {
			c.Lease.HeartbeatInterval, c.Lease.OfflineAfter = 2*time.Second, time.Second
		}, "OfflineAfter"},
		{"MaxLeasesPerWorker over what a heartbeat names", func(_ *workerapi.Stores, c *workerapi.Config) { c.Lease.MaxLeasesPerWorker = wire.MaxCurrentJobs + 1 }, "MaxLeasesPerWorker"},
		{"Lease.MaxJobsPerLease over the protocol", func(_ *workerapi.Stores, c *workerapi.Config) { c.Lease.MaxJobsPerLease = wire.MaxJobsPerLease + 1 }, "MaxJobsPerLease"},
		{"Lease.Now set", func(_ *workerapi.Stores, c *workerapi.Config) { c.Lease.Now = time.Now }, "Lease.HoldSweeps, LeaseEnded, InTx, Now and Rand"},
		{"Lease.LeaseEnded set", func(_ *workerapi.Stores, c *workerapi.Config) {
			c.Lease.LeaseEnded = func(context.Context, *lease.Job) error { return nil }
		}, "Lease.HoldSweeps, LeaseEnded, InTx, Now and Rand"},
		{"TrustedProxies with a zero prefix", func(_ *workerapi.Stores, c *workerapi.Config) {
			c.TrustedProxies = []netip.Prefix{netip.MustParsePrefix("10.0.0.0/8"), {}}
		}, "TrustedProxies[1]"},
	}
	for _, origin := range []string{
		"cp.example.com", "/nodelane", "ftp://cp.example.com", "https://", "https://:443/x",
		"https://cp.example.com/?a=1", "https://cp.example.com/x?", "https://cp.example.com/#top",
		"https://cp.example.com#", "https://cp.example.com:/", "https://cp.example.com:x/",
		"mailto:ops@example.com", "https://cp.example.com/%zz",
	} {
		tests = append(tests, struct {
			name   string
			change func(*workerapi.Stores, *workerapi.Config)
			want   string
		}{"PublicOrigin " + origin, func(_ *workerapi.Stores, c *workerapi.Config) { c.PublicOrigin = origin }, "PublicOrigin"})
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			st, cfg := sqliteStores(t)
			tt.change(&st, &cfg)
			srv, err := workerapi.New(st, cfg)
			if !errors.Is(err, workerapi.ErrConfig) {
				t.Fatalf("New: %v (server %v), want ErrConfig", err, srv)
			}
			if !strings.Contains(err.Error(), tt.want) {
				t.Errorf("New: %q does not name %s", err, tt.want)
			}
		})
	}
	t.Run("valid", func(t *testing.T) {
		t.Parallel()
		st, cfg := sqliteStores(t)
		if _, err := workerapi.New(st, cfg); err != nil {
			t.Fatalf("New with a valid configuration: %v", err)
		}
	})
	t.Run("valid proxy settings", func(t *testing.T) {
		t.Parallel()
		for _, origin := range []string{"https://cp.example.com", "https://CP.example.com:8443/nodelane/", "http://[::1]:8080/a/b"} {
			st, cfg := sqliteStores(t)
			cfg.PublicOrigin = origin
			cfg.TrustedProxies = []netip.Prefix{netip.MustParsePrefix("10.0.0.0/8"), netip.MustParsePrefix("::1/128")}
			if _, err := workerapi.New(st, cfg); err != nil {
				t.Errorf("New with PublicOrigin %q: %v", origin, err)
			}
		}
	})
	// A password in a PublicOrigin is never repeated in the error.
	t.Run("PublicOrigin with a password", func(t *testing.T) {
		t.Parallel()
		st, cfg := sqliteStores(t)
		cfg.PublicOrigin = "https://ops:hunter2@cp.example.com/"
		_, err := workerapi.New(st, cfg)
		if !errors.Is(err, workerapi.ErrConfig) || !strings.Contains(err.Error(), "PublicOrigin") || strings.Contains(err.Error(), "hunter2") {
			t.Fatalf("New: %v, want ErrConfig naming PublicOrigin without the password", err)
		}
	})
}

// ArtifactConfig's defaults are the documented ones.
func TestArtifactConfigDefaults(t *testing.T) {
	t.Parallel()
	c, err := workerapi.ArtifactConfig{}.WithDefaults()
	if err != nil {
		t.Fatal(err)
	}
	want := workerapi.ArtifactConfig{
		MaxBytes: 10 << 30, MaxPerJob: 100, MaxUploadsPerWorker: 4, PartSize: 64 << 20,
		UploadTTL: time.Hour, SweepInterval: 10 * time.Minute,
	}
	if c != want {
		t.Errorf("WithDefaults = %+v, want %+v", c, want)
	}
}
