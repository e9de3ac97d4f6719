package workerapi_test

import (
	"context"
	"crypto/rand"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/nodelane/nodelane/bunstore"
	"github.com/nodelane/nodelane/internal/apitest"
	"github.com/nodelane/nodelane/internal/waitfor"
	"github.com/nodelane/nodelane/lease"
	"github.com/nodelane/nodelane/receipts"
	"github.com/nodelane/nodelane/workerapi"
)

// sqliteStores opens a fresh SQLite database and returns its Stores and a
// valid Config.
func sqliteStores(t *testing.T) (workerapi.Stores, workerapi.Config) {
	t.Helper()
	ctx := context.Background()
	db, err := bunstore.Open(ctx, apitest.SQLite(t).DSN, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := db.Close(); err != nil {
			t.Error(err)
		}
	})
	pepper := make([]byte, 32)
	if _, err := rand.Read(pepper); err != nil {
		t.Fatal(err)
	}
	signer, _, err := receipts.GenerateKey(rand.Reader, receipts.DefaultOrigin)
	if err != nil {
		t.Fatal(err)
	}
	return workerapi.Stores{
			Tx: db, Notifier: workerapi.NewLocalNotifier(), Leases: db.LeaseStore(), Credentials: db.CredentialStore(),
			Nonces: db.NonceStore(nil), Envelope: db.EnvelopeStore(), Receipts: db.ReceiptStore(),
			Fingerprints: db.FingerprintStore(),
		}, workerapi.Config{
			Peppers: map[int][]byte{1: pepper}, PepperVersion: 1, ReceiptSigner: signer,
		}
}

// recordingHooks records the job ids of JobChanged; block, when set,
// holds every call until it is closed or the hook's context ends.
type recordingHooks struct {
	mu    sync.Mutex
	jobs  []string
	block chan struct{}
	ended chan error // receives the hook context's error when block was abandoned
}

func (h *recordingHooks) JobChanged(ctx context.Context, e workerapi.JobEvent) {
	if h.block != nil {
		select {
		case <-h.block:
		case <-ctx.Done():
			h.ended <- ctx.Err()
			return
		}
	}
	h.mu.Lock()
	h.jobs = append(h.jobs, e.Job.ID)
	h.mu.Unlock()
}

func (h *recordingHooks) ReceiptMinted(context.Context, receipts.Stored) {}

func (h *recordingHooks) seen() []string {
	h.mu.Lock()
	defer h.mu.Unlock()
	return append([]string(nil), h.jobs...)
}

// A Server started and stopped with hooks set leaves no goroutine behind,
// and Stop delivers the events queued before it.
//
// This test and the three after it that check for leaks with goleak do
// not run in parallel: goleak sees every goroutine of the process, and
// the parallel tests start theirs at any time.
func TestLifecycleNoLeak(t *testing.T) {
	st, cfg := sqliteStores(t)
	defer goleak.VerifyNone(t, goleak.IgnoreCurrent())
	h := &recordingHooks{}
	cfg.Hooks = h
	cfg.MaintainInterval = 5 * time.Millisecond
	srv, err := workerapi.New(st, cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	// An event before Start waits in the queue.
	early, _, _, err := srv.Dispatch(ctx, lease.NewJob{Type: "status_check"})
	if err != nil {
		t.Fatal(err)
	}
	if err := srv.Start(ctx); err != nil {
		t.Fatal(err)
	}
	if err := srv.Start(ctx); !errors.Is(err, workerapi.ErrStarted) {
		t.Errorf("second Start: %v, want ErrStarted", err)
	}
	var ids []string
	for range 20 {
		j, _, _, err := srv.Dispatch(ctx, lease.NewJob{Type: "status_check"})
		if err != nil {
			t.Fatal(err)
		}
		ids = append(ids, j.ID)
	}
	// Stop while the background work runs: once it delivered the first
	// event, and the maintainer, every 5 ms, is running its rounds.
	waitfor.Until(t, "the hooks to see the first event", func() bool { return len(h.seen()) > 0 })
	if err := srv.Stop(ctx); err != nil {
		t.Fatal(err)
	}
	got := h.seen()
	want := append([]string{early.ID}, ids...)
	if strings.Join(got, ",") != strings.Join(want, ",") {
		t.Errorf("hooks saw %v, want %v in order", got, want)
	}
	// After Stop, events are dropped and nothing runs.
	if _, _, _, err := srv.Dispatch(ctx, lease.NewJob{Type: "status_check"}); err != nil {
		t.Fatal(err)
	}
	if err := srv.Stop(ctx); err != nil {
		t.Errorf("second Stop: %v", err)
	}
	if n := len(h.seen()); n != len(want) {
		t.Errorf("hooks saw %d events after Stop, want %d", n, len(want))
	}
}

// Stop gives up when its context ends, and cancels the context the
// hooks were given, so a hook that honours it returns and leaks nothing.
func TestLifecycleStopDeadline(t *testing.T) {
	st, cfg := sqliteStores(t)
	defer goleak.VerifyNone(t, goleak.IgnoreCurrent())
	h := &recordingHooks{block: make(chan struct{}), ended: make(chan error, 8)}
	cfg.Hooks = h
	srv, err := workerapi.New(st, cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	if err := srv.Start(ctx); err != nil {
		t.Fatal(err)
	}
	if _, _, _, err := srv.Dispatch(ctx, lease.NewJob{Type: "status_check"}); err != nil {
		t.Fatal(err)
	}
	sctx, cancel := context.WithTimeout(ctx, 50*time.Millisecond)
	defer cancel()
	if err := srv.Stop(sctx); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Stop with a stuck hook: %v, want context.DeadlineExceeded", err)
	}
	select {
	case err := <-h.ended:
		if !errors.Is(err, context.Canceled) {
			t.Errorf("the hook's context ended with %v, want context.Canceled", err)
		}
	case <-time.After(10 * time.Second): // liveness bound
		t.Fatal("the hook's context was not cancelled")
	}
	if n := len(h.seen()); n != 0 {
		t.Errorf("hook completed %d events, want 0", n)
	}
	// The deferred goleak.VerifyNone retries while the background
	// goroutines observe the cancellation.
}

// The end of Start's context stops the background work; Stop then
// returns at once.
func TestLifecycleContextEnds(t *testing.T) {
	st, cfg := sqliteStores(t)
	defer goleak.VerifyNone(t, goleak.IgnoreCurrent())
	h := &recordingHooks{}
	cfg.Hooks = h
	srv, err := workerapi.New(st, cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	if err := srv.Start(ctx); err != nil {
		t.Fatal(err)
	}
	j, _, _, err := srv.Dispatch(context.Background(), lease.NewJob{Type: "status_check"})
	if err != nil {
		t.Fatal(err)
	}
	cancel()
	if err := srv.Stop(context.Background()); err != nil {
		t.Fatal(err)
	}
	if got := h.seen(); len(got) != 1 || got[0] != j.ID {
		t.Errorf("hooks saw %v, want [%s]", got, j.ID)
	}
}

// Stop on a Server never started returns nil and starts nothing.
func TestLifecycleStopUnstarted(t *testing.T) {
	st, cfg := sqliteStores(t)
	defer goleak.VerifyNone(t, goleak.IgnoreCurrent())
	srv, err := workerapi.New(st, cfg)
	if err != nil {
		t.Fatal(err)
	}
	if err := srv.Stop(context.Background()); err != nil {
		t.Fatal(err)
	}
}

// The maintainer that Start runs expires a lease without any request.
func TestLifecycleMaintainerExpires(t *testing.T) {
	t.Parallel()
	st, cfg := sqliteStores(t)
	now := time.Now()
	var mu sync.Mutex
	cfg.Now = func() time.Time { mu.Lock(); defer mu.Unlock(); return now }
	cfg.MaintainInterval = 5 * time.Millisecond
	srv, err := workerapi.New(st, cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	job, _, _, err := srv.Dispatch(ctx, lease.NewJob{Type: "status_check"})
	if err != nil {
		t.Fatal(err)
	}
	m := srv.Leases()
	if _, err := m.RegisterWorker(ctx, &lease.Worker{ID: "w1", NodeID: "n1", Capabilities: lease.Capabilities{JobTypes: []string{"status_check"}}, Governor: lease.Governor{MaxJobs: 1}}); err != nil {
		t.Fatal(err)
	}
	gs, err := m.Lease(ctx, lease.LeaseRequest{WorkerID: "w1", JobTypes: []string{"status_check"}})
	if err != nil || len(gs) != 1 {
		t.Fatalf("lease: %v, %d grants", err, len(gs))
	}
	mu.Lock()
	now = now.Add(workerapi.DefaultAcceptTimeout + time.Second)
	mu.Unlock()
	if err := srv.Start(ctx); err != nil {
		t.Fatal(err)
	}
	defer func() {
		if err := srv.Stop(ctx); err != nil {
			t.Error(err)
		}
	}()
	waitfor.Until(t, "the maintainer to put the unaccepted job back in the queue", func() bool {
		j, err := st.Leases.GetJob(ctx, job.ID)
		if err != nil {
			t.Fatal(err)
		}
		return j.State == lease.StateQueued
	})
}
