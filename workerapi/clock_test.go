package workerapi_test

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/nodelane/nodelane/bunstore"
	"github.com/nodelane/nodelane/internal/apitest"
	"github.com/nodelane/nodelane/internal/logtest"
	"github.com/nodelane/nodelane/lease"
	"github.com/nodelane/nodelane/workerapi"
	"github.com/nodelane/nodelane/workerapi/wire"
)

// withDBClock gives the Server its database's clock.
func withDBClock() apitest.Option {
	return apitest.WithStores(func(s workerapi.Stores) workerapi.Stores {
		s.Clock = s.Tx.(*bunstore.DB)
		return s
	})
}

// The incident of issue 12: a replica whose own clock runs 11 minutes
// fast must not take a live lease for expired. Once it has measured its
// clock against the database's it follows the database's, so the
// worker's completion is accepted; it reports not ready and holds its
// maintainer until its clock is back within the bound.
func TestClockSkewFollowsTheDatabase(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	logs := logtest.New()
	env := apitest.New(t, "sqlite", withDBClock(), apitest.WithConfig(func(c *workerapi.Config) {
		c.Logger = slog.New(logs)
	}))
	srv := env.Server
	if err := srv.Ready(); !errors.Is(err, workerapi.ErrNotReady) {
		t.Fatalf("Ready before the clock was measured = %v, want ErrNotReady", err)
	}
	if err := srv.CheckClock(ctx); err != nil {
		t.Fatal(err)
	}
	if err := srv.Ready(); err != nil {
		t.Fatalf("Ready with the clock in step = %v", err)
	}
	n := env.NewNode(t, "node")
	n.Register(t, studioGPU())
	job := env.Enqueue(t, lease.NewJob{Type: "status_check"})
	l := nodeCall[wire.LeaseResponse](t, n, "lease", wire.PathLease, wire.LeaseRequest{MaxJobs: 1}, http.StatusOK)
	path := "/workers/jobs/" + job.ID
	nodeCall[wire.AcceptResponse](t, n, "accept", path+"/accept", wire.TokenRequest{LeaseToken: *l.LeaseToken}, http.StatusOK)

	// The replica's clock jumps 11 minutes ahead, past the 10-minute
	// lease. Before it measures, it is simply wrong: the signature, made
	// by the worker's correct clock, is stale to it.
	env.Clock.Advance(11 * time.Minute)
	resp, body := n.Do(t, http.MethodPost, wire.PathHeartbeat, wire.HeartbeatRequest{Status: "busy"})
	wantCode(t, "heartbeat before the clock check", resp.StatusCode, body, http.StatusUnauthorized, wire.CodeStaleTimestamp)

	if err := srv.CheckClock(ctx); err != nil {
		t.Fatal(err)
	}
	err := srv.Ready()
	if !errors.Is(err, workerapi.ErrNotReady) || !strings.Contains(err.Error(), "off the database's") {
		t.Fatalf("Ready with the clock 11 minutes fast = %v", err)
	}
	if err := srv.MaintainOnce(ctx); !errors.Is(err, workerapi.ErrNotReady) {
		t.Fatalf("MaintainOnce with the clock 11 minutes fast = %v, want ErrNotReady", err)
	}
	logs.WaitFor(t, "the skew's ERROR", func(r slog.Record) bool {
		return r.Level == slog.LevelError && strings.HasPrefix(r.Message, "clock skew")
	})
	// It follows the database's clock: the lease is live, the signature
	// fresh.
	nodeCall[wire.CompleteResponse](t, n, "complete", path+"/complete", wire.CompleteRequest{LeaseToken: *l.LeaseToken}, http.StatusOK)

	// A second check in the same state logs nothing more.
	if err := srv.CheckClock(ctx); err != nil {
		t.Fatal(err)
	}
	env.Clock.Advance(-11 * time.Minute)
	if err := srv.CheckClock(ctx); err != nil {
		t.Fatal(err)
	}
	if err := srv.Ready(); err != nil {
		t.Fatalf("Ready with the clock back = %v", err)
	}
	if err := srv.MaintainOnce(ctx); err != nil {
		t.Fatalf("MaintainOnce with the clock back = %v", err)
	}
	var errs, infos int
	for _, r := range logs.Records() {
		switch {
		case r.Level == slog.LevelError:
			errs++
		case r.Level == slog.LevelInfo && strings.HasPrefix(r.Message, "clock skew"):
			infos++
		}
	}
	if errs != 1 || infos != 1 {
		t.Errorf("%d ERROR and %d INFO clock records, want one each (once per change of state)", errs, infos)
	}
}

// Start measures the clock at once and then every ClockCheckInterval; the
// readiness handler says what Ready says.
func TestClockWatchAndReadyHandler(t *testing.T) {
	t.Parallel()
	logs := logtest.New()
	env := apitest.New(t, "sqlite", withDBClock(), apitest.Started(), apitest.WithConfig(func(c *workerapi.Config) {
		c.Logger = slog.New(logs)
		c.ClockCheckInterval = time.Millisecond
	}))
	hs := httptest.NewServer(env.Server.ReadyHandler())
	defer hs.Close()
	ready := func(method string) (int, workerapi.ReadyResponse) {
		t.Helper()
		req, err := http.NewRequest(method, hs.URL+"/readyz", nil)
		if err != nil {
			t.Fatal(err)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		var out workerapi.ReadyResponse
		if resp.StatusCode != http.StatusMethodNotAllowed {
			if err := json.Unmarshal(b, &out); err != nil {
				t.Fatalf("readiness body %q: %v", b, err)
			}
		}
		return resp.StatusCode, out
	}
	measured := func(r slog.Record) bool { return r.Message == "clock measured against the database" }
	logs.WaitFor(t, "a measurement", measured)
	if code, out := ready(http.MethodGet); code != http.StatusOK || !out.Ready || out.Reason != "" {
		t.Fatalf("readiness in step: %d %+v", code, out)
	}

	env.Clock.Advance(-30 * time.Second) // this replica runs slow
	logs.WaitFor(t, "the skew's ERROR", func(r slog.Record) bool { return r.Level == slog.LevelError })
	code, out := ready(http.MethodGet)
	if code != http.StatusServiceUnavailable || out.Ready || !strings.Contains(out.Reason, "off the database's") {
		t.Fatalf("readiness 30 s slow: %d %+v", code, out)
	}
	if strings.Contains(out.Reason, "workerapi:") {
		t.Errorf("the reason names the package: %q", out.Reason)
	}
	env.Clock.Advance(30 * time.Second)
	logs.WaitFor(t, "the recovery's INFO", func(r slog.Record) bool {
		return r.Level == slog.LevelInfo && strings.HasPrefix(r.Message, "clock skew")
	})
	if code, out := ready(http.MethodGet); code != http.StatusOK || !out.Ready {
		t.Fatalf("readiness back in step: %d %+v", code, out)
	}
	if code, _ := ready(http.MethodPost); code != http.StatusMethodNotAllowed {
		t.Errorf("POST to the readiness handler: %d, want 405", code)
	}
}

// Without a database clock the Server trusts its own and is ready.
func TestReadyWithoutDBClock(t *testing.T) {
	t.Parallel()
	env := apitest.New(t, "sqlite")
	if err := env.Server.Ready(); err != nil {
		t.Fatalf("Ready = %v", err)
	}
	if err := env.Server.CheckClock(context.Background()); err != nil {
		t.Fatalf("CheckClock = %v", err)
	}
}
