package workerapi_test

import (
	"context"
	"fmt"
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

// A notification wakes one long-poll of those whose claims consider the
// same jobs, not all of them: the one woken claims the job and wakes the
// next, which finds nothing and ends the turn. A thundering herd would
// cost every waiting long-poll a claim per job. Long-polls of another
// class (other tags) are woken too, one of them: the job that only they
// fit is theirs at once, not at the end of their wait.
func TestLongPollRelay(t *testing.T) {
	t.Parallel()
	for _, dialect := range []string{"sqlite", "postgres"} {
		t.Run(dialect, func(t *testing.T) {
			t.Parallel()
			var c *countingLeases
			f := setup(t, dialect, withCountedClaims(&c))
			const same = 8
			nodes := []*apitest.Node{f.node}
			for i := range same - 1 {
				n := f.env.NewNode(t, fmt.Sprintf("relay-%d", i))
				n.Register(t, registerRequest())
				nodes = append(nodes, n)
			}
			other := f.env.NewNode(t, "relay-other")
			reg := registerRequest()
			reg.Tags = []string{"lab", "h100-room"}
			other.Register(t, reg)

			type answer struct {
				node int
				out  wire.LeaseResponse
			}
			answers := make(chan answer, same+1)
			poll := func(i int, n *apitest.Node, wait int) {
				st, b := post(t, n, wire.PathLease, wire.LeaseRequest{SupportedJobTypes: []string{"status_check"}, WaitSeconds: wait})
				if st != http.StatusOK {
					t.Errorf("long-poll of node %d: %d %s", i, st, b)
				}
				answers <- answer{i, decode[wire.LeaseResponse](t, b)}
			}
			var wg sync.WaitGroup
			defer wg.Wait()
			for i, n := range nodes {
				wg.Go(func() { poll(i, n, 2) })
			}
			wg.Go(func() { poll(same, other, 30) })
			f.env.AwaitLongPolls(t, same+1)
			before := c.claims.Load()

			// Only the tagged node fits this one.
			tagged := f.env.Enqueue(t, lease.NewJob{Type: "status_check", Requirements: lease.Requirements{Tags: []string{"h100-room"}}})
			if a := <-answers; a.node != same || a.out.Job == nil || a.out.Job.ID != tagged.ID {
				t.Fatalf("first answer after a job only node %d fits: node %d, %+v", same, a.node, a.out)
			}
			job := f.env.Enqueue(t, lease.NewJob{Type: "status_check"})
			var got []int
			for range same {
				if a := <-answers; a.out.Job != nil {
					if a.out.Job.ID != job.ID {
						t.Errorf("node %d leased %s, want %s", a.node, a.out.Job.ID, job.ID)
					}
					got = append(got, a.node)
				}
			}
			if len(got) != 1 {
				t.Errorf("the job went to nodes %v, want one", got)
			}
			// Two notifications: each wakes one waiter of the untagged
			// class (the first finds nothing, the second claims and hands
			// on to a third, which finds nothing); the first wakes the
			// tagged one. Each of the two that found nothing may look once
			// more on its tick before its 2 s wait ends. A herd costs 8
			// claims per notification.
			if n := c.claims.Load() - before; n > 6 {
				t.Errorf("two jobs for %d waiting long-polls cost %d claims, want at most 6", same+1, n)
			}
		})
	}
}
