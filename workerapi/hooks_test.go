package workerapi_test

import (
	"context"
	"fmt"
	"net/http"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nodelane/nodelane/internal/apitest"
	"github.com/nodelane/nodelane/internal/waitfor"
	"github.com/nodelane/nodelane/lease"
	"github.com/nodelane/nodelane/receipts"
	"github.com/nodelane/nodelane/workerapi"
	"github.com/nodelane/nodelane/workerapi/wire"
)

// stuckHooks never return until released.
type stuckHooks struct{ release chan struct{} }

func (h stuckHooks) JobChanged(context.Context, workerapi.JobEvent) { <-h.release }
func (h stuckHooks) ReceiptMinted(context.Context, receipts.Stored) { <-h.release }

// panickyHooks panic on every call but count them.
type panickyHooks struct{ calls atomic.Int64 }

func (h *panickyHooks) JobChanged(context.Context, workerapi.JobEvent) {
	h.calls.Add(1)
	panic("hook failed")
}

func (h *panickyHooks) ReceiptMinted(context.Context, receipts.Stored) {
	h.calls.Add(1)
	panic("hook failed")
}

// runJobs registers a node and runs n jobs through lease, accept and
// complete, in a goroutine; it reports whether all finished in time.
func runJobs(t *testing.T, env *apitest.Env, n int) bool {
	t.Helper()
	node := env.NewNode(t, "node")
	done := make(chan struct{})
	var once sync.Once
	go func() {
		defer once.Do(func() { close(done) })
		node.Register(t, studioGPU())
		for range n {
			job := env.Enqueue(t, lease.NewJob{Type: "status_check"})
			l := nodeCall[wire.LeaseResponse](t, node, "lease", "/workers/jobs/lease", wire.LeaseRequest{MaxJobs: 1}, http.StatusOK)
			path := "/workers/jobs/" + job.ID
			nodeCall[wire.AcceptResponse](t, node, "accept", path+"/accept", wire.TokenRequest{LeaseToken: *l.LeaseToken}, http.StatusOK)
			nodeCall[wire.CompleteResponse](t, node, "complete", path+"/complete", wire.CompleteRequest{LeaseToken: *l.LeaseToken}, http.StatusOK)
			if j := env.Job(t, job.ID); j.State != lease.StateSucceeded {
				t.Errorf("job %s is %s", job.ID, j.State)
			}
		}
	}()
	select {
	case <-done:
		return true
	case <-time.After(60 * time.Second): // liveness bound, not a performance check
		return false
	}
}

// A hook that never returns blocks no request and rolls nothing back.
func TestStuckHookNeverBlocks(t *testing.T) {
	t.Parallel()
	h := stuckHooks{release: make(chan struct{})}
	env := apitest.New(t, "sqlite", apitest.Started(), apitest.WithConfig(func(c *workerapi.Config) { c.Hooks = h }))
	defer close(h.release)
	if !runJobs(t, env, 5) {
		t.Fatal("requests did not finish while a hook was stuck")
	}
}

// A hook that panics is recovered: requests succeed and later events are
// still delivered.
func TestPanickingHookIsContained(t *testing.T) {
	t.Parallel()
	h := &panickyHooks{}
	env := apitest.New(t, "sqlite", apitest.Started(), apitest.WithConfig(func(c *workerapi.Config) { c.Hooks = h }))
	if !runJobs(t, env, 3) {
		t.Fatal("requests did not finish")
	}
	// 1 registration receipt, then per job 3 changes and 2 receipts.
	waitfor.Until(t, fmt.Sprintf("%d hook calls after panicking", 1+3*5), func() bool {
		return h.calls.Load() >= 1+3*5
	})
}
