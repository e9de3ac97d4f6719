package workerapi_test

import (
	"context"
	"net/http"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/nodelane/nodelane/bunstore"
	"github.com/nodelane/nodelane/internal/apitest"
	"github.com/nodelane/nodelane/lease"
	"github.com/nodelane/nodelane/workerapi"
	"github.com/nodelane/nodelane/workerapi/wire"
)

// countingLeases counts the claims of a Server's lease attempts.
type countingLeases struct {
	*bunstore.LeaseStore
	claims atomic.Int64
}

func (s *countingLeases) ClaimLeases(ctx context.Context, workerID string, plan func(*lease.Worker) (lease.ClaimQuery, lease.LeaseClaim, bool, error)) ([]*lease.Job, error) {
	s.claims.Add(1)
	return s.LeaseStore.ClaimLeases(ctx, workerID, plan)
}

// withCountedClaims makes the Server's lease store count its claims.
func withCountedClaims(c **countingLeases) apitest.Option {
	return apitest.WithStores(func(st workerapi.Stores) workerapi.Stores {
		*c = &countingLeases{LeaseStore: st.Leases.(*bunstore.LeaseStore)}
		st.Leases = *c
		return st
	})
}

// An idle long-poll looks once, at its start: nothing announced a job,
// none it examined becomes due during the wait, so it claims nothing
// more until its answer, which says why as an answer without a wait
// does. Each look of an idle fleet's long-polls is a claim transaction.
func TestLongPollIdle(t *testing.T) {
	t.Parallel()
	for _, dialect := range []string{"sqlite", "postgres"} {
		t.Run(dialect, func(t *testing.T) {
			t.Parallel()
			var c *countingLeases
			f := setup(t, dialect, withCountedClaims(&c))
			// A job of another type, queued: it wakes nothing.
			f.env.Enqueue(t, lease.NewJob{Type: "lora_train", Requirements: lease.Requirements{GPUSKU: "none", GPUCount: 1}})
			st, b := post(t, f.node, wire.PathLease, wire.LeaseRequest{SupportedJobTypes: []string{"status_check"}, WaitSeconds: 3})
			out := decode[wire.LeaseResponse](t, b)
			if st != http.StatusOK || len(out.Leases) != 0 {
				t.Fatalf("idle long-poll: %d %s", st, b)
			}
			if n := c.claims.Load(); n != 1 {
				t.Errorf("an idle long-poll of 3 s claimed %d times, want once", n)
			}
			_, b0 := post(t, f.node, wire.PathLease, wire.LeaseRequest{SupportedJobTypes: []string{"status_check"}})
			if want := decode[wire.LeaseResponse](t, b0).Message; want == "" || out.Message != want {
				t.Errorf("the idle long-poll says %q, an answer without a wait %q", out.Message, want)
			}
		})
	}
}

// A worker at its live-lease limit frees a slot when a job of its own
// ends, which no notification announces: its long-poll looks again on
// its ticks, and leases the next job within the wait.
func TestLongPollAtLimit(t *testing.T) {
	t.Parallel()
	env := apitest.New(t, "sqlite")
	n := env.NewNode(t, "one-slot")
	reg := registerRequest()
	reg.GovernorLimits.MaxJobs = 1
	n.Register(t, reg)
	first := env.Enqueue(t, lease.NewJob{Type: "status_check"})
	st, b := post(t, n, wire.PathLease, wire.LeaseRequest{SupportedJobTypes: []string{"status_check"}, Accept: true})
	lr := decode[wire.LeaseResponse](t, b)
	if st != http.StatusOK || lr.Job == nil || lr.Job.ID != first.ID {
		t.Fatalf("lease: %d %s", st, b)
	}
	second := env.Enqueue(t, lease.NewJob{Type: "status_check"})

	var (
		wg  sync.WaitGroup
		got wire.LeaseResponse
	)
	wg.Go(func() {
		st, b := post(t, n, wire.PathLease, wire.LeaseRequest{SupportedJobTypes: []string{"status_check"}, WaitSeconds: 20})
		if st != http.StatusOK {
			t.Errorf("long-poll at the limit: %d %s", st, b)
		}
		got = decode[wire.LeaseResponse](t, b)
	})
	env.AwaitLongPolls(t, 1)
	if st, b := post(t, n, "/workers/jobs/"+first.ID+"/complete", wire.CompleteRequest{LeaseToken: *lr.LeaseToken}); st != http.StatusOK {
		t.Fatalf("complete: %d %s", st, b)
	}
	wg.Wait()
	if got.Job == nil || got.Job.ID != second.ID {
		t.Fatalf("the long-poll at its limit answered %+v after its slot freed, want job %s", got, second.ID)
	}
}
