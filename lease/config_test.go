package lease_test

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/nodelane/nodelane/lease"
)

// TestConfigDefaults checks that WithDefaults fills every zero setting
// with its default, OfflineAfter from the HeartbeatInterval given.
func TestConfigDefaults(t *testing.T) {
	t.Parallel()
	c, err := lease.Config{HeartbeatInterval: 10 * time.Second}.WithDefaults()
	if err != nil {
		t.Fatal(err)
	}
	want := lease.Config{
		LeaseTTL: lease.DefaultLeaseTTL, AcceptTimeout: lease.DefaultAcceptTimeout, CancelGrace: lease.DefaultCancelGrace,
		MaxRuntime: lease.DefaultMaxRuntime, RetryBase: lease.DefaultRetryBase, RetryMax: lease.DefaultRetryMax,
		DefaultMaxAttempts: lease.DefaultMaxAttempts, MaxJobsPerLease: lease.DefaultMaxJobsPerLease,
		MaxLeasesPerWorker: lease.DefaultMaxLeasesPerWorker, ListLimit: lease.DefaultListLimit,
		ExplainWorkersTTL: lease.DefaultExplainWorkersTTL, HeartbeatInterval: 10 * time.Second, OfflineAfter: 30 * time.Second,
	}
	if c.Now == nil || c.Rand == nil {
		t.Errorf("Now or Rand not defaulted")
	}
	c.Now, c.Rand = nil, nil
	if diff := cmp.Diff(want, c); diff != "" {
		t.Errorf("WithDefaults (-want +got):\n%s", diff)
	}
	// A negative ExplainWorkersTTL turns reuse off and stays.
	if c, err := (lease.Config{ExplainWorkersTTL: -1}).WithDefaults(); err != nil || c.ExplainWorkersTTL != -1 {
		t.Errorf("ExplainWorkersTTL -1: %v, %v", c.ExplainWorkersTTL, err)
	}
}

// TestConfigInvalid checks that WithDefaults refuses each invalid
// setting with an error that wraps ErrConfig and names it, and that
// NewManager panics on it.
func TestConfigInvalid(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name string
		cfg  lease.Config
	}{
		{"LeaseTTL", lease.Config{LeaseTTL: -1}},
		{"AcceptTimeout", lease.Config{AcceptTimeout: -time.Second}},
		{"CancelGrace", lease.Config{CancelGrace: -1}},
		{"MaxRuntime", lease.Config{MaxRuntime: -1}},
		{"MaxRuntime", lease.Config{MaxRuntime: lease.MaxRuntimeLimit + time.Second}},
		{"RetryBase", lease.Config{RetryBase: -1}},
		{"RetryMax", lease.Config{RetryMax: -1}},
		{"RetryMax", lease.Config{RetryBase: 2 * time.Hour}},
		{"HeartbeatInterval", lease.Config{HeartbeatInterval: -1}},
		{"OfflineAfter", lease.Config{OfflineAfter: -1}},
		{"OfflineAfter", lease.Config{HeartbeatInterval: time.Minute, OfflineAfter: 59 * time.Second}},
		{"Retention", lease.Config{Retention: -1}},
		{"DefaultMaxAttempts", lease.Config{DefaultMaxAttempts: -1}},
		{"DefaultMaxAttempts", lease.Config{DefaultMaxAttempts: 101}},
		{"MaxJobsPerLease", lease.Config{MaxJobsPerLease: -1}},
		{"MaxLeasesPerWorker", lease.Config{MaxLeasesPerWorker: -1}},
		{"ListLimit", lease.Config{ListLimit: -1}},
		{"ListLimit", lease.Config{ListLimit: 1001}},
	} {
		_, err := tc.cfg.WithDefaults()
		if !errors.Is(err, lease.ErrConfig) || !strings.Contains(err.Error(), tc.name) {
			t.Errorf("%+v: WithDefaults = %v, want ErrConfig naming %s", tc.cfg, err, tc.name)
		}
		func() {
			defer func() {
				if r := recover(); r == nil {
					t.Errorf("%+v: NewManager did not panic", tc.cfg)
				}
			}()
			lease.NewManager(lease.NewMemoryStore(), &tc.cfg)
		}()
	}
}
