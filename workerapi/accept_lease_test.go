package workerapi_test

import (
	"context"
	"net/http"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/nodelane/nodelane/envelope"
	"github.com/nodelane/nodelane/internal/apitest"
	"github.com/nodelane/nodelane/internal/testdb"
	"github.com/nodelane/nodelane/internal/waitfor"
	"github.com/nodelane/nodelane/lease"
	"github.com/nodelane/nodelane/workerapi"
	"github.com/nodelane/nodelane/workerapi/wire"
)

// Lease with accept (PROTOCOL.md §5.3): the jobs granted are accepted in
// the same request, over real HTTP on every dialect.

// leaseAccept enqueues n jobs of jobType and leases them with accept.
func (f *fx) leaseAccept(t *testing.T, jobType string, n int) ([]*lease.Job, wire.LeaseResponse) {
	t.Helper()
	var jobs []*lease.Job
	for range n {
		jobs = append(jobs, f.env.Enqueue(t, lease.NewJob{Type: jobType, Requirements: lease.Requirements{GPUSKU: sku, GPUCount: 1}}))
	}
	st, b := post(t, f.node, wire.PathLease, wire.LeaseRequest{SupportedJobTypes: []string{jobType}, MaxJobs: n, Accept: true})
	if st != http.StatusOK {
		t.Fatalf("lease with accept: %d %s", st, b)
	}
	out := decode[wire.LeaseResponse](t, b)
	if len(out.Leases) != n {
		t.Fatalf("lease with accept granted %d jobs, want %d: %s", len(out.Leases), n, b)
	}
	return jobs, out
}

func TestLeaseAccept(t *testing.T) {
	t.Parallel()
	for _, d := range testdb.Dialects() {
		t.Run(d.Name, func(t *testing.T) {
			t.Parallel()
			rec := &recorder{}
			f := setup(t, d.Name, apitest.WithConfig(func(c *workerapi.Config) {
				c.Hooks = rec
				// The node never heartbeats while the clock runs past
				// accept_by: it must not go offline meanwhile.
				c.Lease.OfflineAfter = time.Hour
			}), apitest.Started())
			now := time.Now().UTC().Truncate(time.Millisecond)
			f.env.Clock.Set(now)
			defer f.env.Clock.Follow()

			jobs, out := f.leaseAccept(t, "status_check", 2)
			if out.Message != "leased and accepted 2 jobs" {
				t.Errorf("message %q", out.Message)
			}
			if out.Job == nil || out.Job.State != wire.JobStateRunning || *out.LeaseToken != out.Leases[0].LeaseToken {
				t.Errorf("the top-level grant is not the first, running: %+v", out)
			}
			for i, g := range out.Leases {
				j := f.env.Job(t, g.Job.ID)
				switch {
				case g.Job.State != wire.JobStateRunning || g.Job.AcceptedAt == nil || !g.Job.AcceptedAt.Equal(now):
					t.Errorf("grant %d: job %+v, want running, accepted now", i, g.Job)
				case !g.ExpiresAt.Equal(now.Add(workerapi.DefaultLeaseTTL)):
					t.Errorf("grant %d: expires_at %v, want the accepted lease's %v", i, g.ExpiresAt, now.Add(workerapi.DefaultLeaseTTL))
				case j.State != lease.StateRunning || j.AcceptedAt == nil || !j.Lease.ExpiresAt.Equal(g.ExpiresAt):
					t.Errorf("job %s as stored: %s, lease %+v", j.ID, j.State, j.Lease)
				}
				if !slices.ContainsFunc(jobs, func(q *lease.Job) bool { return q.ID == g.Job.ID }) {
					t.Errorf("grant %d is job %s, not one queued here", i, g.Job.ID)
				}
			}
			id, tok := out.Leases[0].Job.ID, out.Leases[0].LeaseToken

			t.Run("accept_by does not apply", func(t *testing.T) {
				f.env.Clock.Advance(workerapi.DefaultAcceptTimeout + time.Minute)
				defer f.env.Clock.Set(now)
				if err := f.env.Server.MaintainOnce(context.Background()); err != nil {
					t.Fatal(err)
				}
				for _, g := range out.Leases {
					if j := f.env.Job(t, g.Job.ID); j.State != lease.StateRunning {
						t.Errorf("job %s is %s past accept_by, want running", j.ID, j.State)
					}
				}
				st, b := post(t, f.node, wire.JobPath(id, wire.ActionStatus), wire.StatusRequest{LeaseToken: tok, EventType: "progress"})
				if st != http.StatusOK {
					t.Errorf("status past accept_by: %d %s", st, b)
				}
			})
			t.Run("accept again changes nothing", func(t *testing.T) {
				f.unchanged(t, id, func() {
					st, b := post(t, f.node, wire.JobPath(id, wire.ActionAccept), wire.TokenRequest{LeaseToken: tok})
					if st != http.StatusOK || decode[wire.AcceptResponse](t, b).Job.State != wire.JobStateRunning {
						t.Errorf("accept again: %d %s", st, b)
					}
				})
			})
			t.Run("complete", func(t *testing.T) {
				st, b := post(t, f.node, wire.JobPath(id, wire.ActionComplete), wire.CompleteRequest{LeaseToken: tok})
				if st != http.StatusOK || decode[wire.CompleteResponse](t, b).Job.State != wire.JobStateSucceeded {
					t.Errorf("complete: %d %s", st, b)
				}
			})
			t.Run("hooks", func(t *testing.T) {
				// queued>leased and leased>running, as a lease then an
				// accept would report them.
				want := []string{"queued>leased", "leased>running", "running>succeeded"}
				var trans []string
				waitfor.Until(t, "the hooks to see the job's three changes", func() bool {
					trans = nil
					rec.mu.Lock()
					for _, c := range rec.changes {
						if c.Job.ID == id {
							trans = append(trans, string(c.From)+">"+string(c.Job.State))
						}
					}
					rec.mu.Unlock()
					return len(trans) >= len(want)
				})
				if !slices.Equal(trans, want) {
					t.Errorf("job changes %v, want %v", trans, want)
				}
			})
			t.Run("without accept nothing changes", func(t *testing.T) {
				for name, body := range map[string]any{
					"absent": wire.LeaseRequest{SupportedJobTypes: []string{"telemetry_sync"}},
					"false":  `{"supported_job_types":["telemetry_sync"],"accept":false}`,
					"null":   `{"supported_job_types":["telemetry_sync"],"accept":null}`,
				} {
					t.Run(name, func(t *testing.T) {
						j := f.env.Enqueue(t, lease.NewJob{Type: "telemetry_sync"})
						st, b := post(t, f.node, wire.PathLease, body)
						out := decode[wire.LeaseResponse](t, b)
						if st != http.StatusOK || len(out.Leases) != 1 || out.Leases[0].Job.ID != j.ID ||
							out.Leases[0].Job.State != wire.JobStateLeased || out.Message != "leased 1 job" {
							t.Fatalf("lease: %d %s", st, b)
						}
						if got := f.env.Job(t, j.ID); got.State != lease.StateLeased || got.AcceptedAt != nil {
							t.Errorf("job as stored: %s", got.State)
						}
						if !out.Leases[0].AcceptBy.Equal(now.Add(workerapi.DefaultAcceptTimeout)) {
							t.Errorf("accept_by %v", out.Leases[0].AcceptBy)
						}
						// Free the worker's slot (it holds 4 leases at most).
						if st, b := post(t, f.node, wire.JobPath(j.ID, wire.ActionRelease), wire.ReleaseRequest{LeaseToken: out.Leases[0].LeaseToken}); st != http.StatusOK {
							t.Fatalf("release: %d %s", st, b)
						}
						if _, err := f.env.Server.Leases().Cancel(context.Background(), j.ID); err != nil {
							t.Fatal(err)
						}
					})
				}
			})
			t.Run("accept must be a boolean", func(t *testing.T) {
				j := f.env.Enqueue(t, lease.NewJob{Type: "telemetry_sync"})
				before := f.env.Dump(t)
				st, b := post(t, f.node, wire.PathLease, `{"supported_job_types":["telemetry_sync"],"accept":"yes"}`)
				wantErr(t, st, b, http.StatusBadRequest, wire.CodeInvalidRequest)
				if diff := cmp.Diff(before, f.env.Dump(t)); diff != "" {
					t.Errorf("a refused lease changed state (-before +after):\n%s", diff)
				}
				if got := f.env.Job(t, j.ID); got.State != lease.StateQueued {
					t.Errorf("job %s", got.State)
				}
				// Take it out of the way of the long-poll below.
				if _, err := f.env.Server.Leases().Cancel(context.Background(), j.ID); err != nil {
					t.Fatal(err)
				}
			})
			t.Run("long-poll", func(t *testing.T) {
				f.env.Clock.Follow()
				done := make(chan []byte, 1)
				go func() {
					_, b := f.node.Do(t, http.MethodPost, wire.PathLease,
						wire.LeaseRequest{SupportedJobTypes: []string{"telemetry_sync"}, WaitSeconds: 20, Accept: true})
					done <- b
				}()
				f.env.AwaitLongPolls(t, 1)
				j := f.env.Enqueue(t, lease.NewJob{Type: "telemetry_sync"})
				b := waitfor.Receive(t, "the long-poll's answer", done)
				out := decode[wire.LeaseResponse](t, b)
				if len(out.Leases) != 1 || out.Leases[0].Job.ID != j.ID || out.Leases[0].Job.State != wire.JobStateRunning {
					t.Errorf("long-poll with accept: %s", b)
				}
				if got := f.env.Job(t, j.ID); got.State != lease.StateRunning {
					t.Errorf("job as stored: %s", got.State)
				}
			})
		})
	}
}

// flipEnvelope is an envelope store whose runtime, once armed, reads as
// deactivated after the next pass reads: the envelope as an operator's
// deactivation would leave it between the lease and the accept of one
// request.
type flipEnvelope struct {
	envelope.Store

	mu    sync.Mutex
	armed bool
	pass  int
}

func (e *flipEnvelope) State(ctx context.Context) (envelope.State, error) {
	st, err := e.Store.State(ctx)
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.armed {
		if e.pass > 0 {
			e.pass--
		} else {
			st.Active, st.Until = false, nil
		}
	}
	return st, err
}

func (e *flipEnvelope) arm(pass int) {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.armed, e.pass = true, pass
}

func (e *flipEnvelope) disarm() {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.armed = false
}

// TestLeaseAcceptEnvelope checks that the envelope gates a lease with
// accept once, before the claim: a type it blocks then is not granted,
// and a type it allows then is granted and accepted in the claim's one
// write, whatever a later read of the envelope would say.
func TestLeaseAcceptEnvelope(t *testing.T) {
	t.Parallel()
	for _, d := range testdb.Dialects() {
		t.Run(d.Name, func(t *testing.T) {
			t.Parallel()
			flip := &flipEnvelope{}
			f := setup(t, d.Name, apitest.WithStores(func(s workerapi.Stores) workerapi.Stores {
				flip.Store = s.Envelope
				s.Envelope = flip
				return s
			}))
			now := time.Now().UTC().Truncate(time.Millisecond)
			f.env.Clock.Set(now)
			defer f.env.Clock.Follow()
			req := lease.NewJob{Type: "lora_train", Requirements: lease.Requirements{GPUSKU: sku, GPUCount: 1}}

			t.Run("blocked when leasing", func(t *testing.T) {
				j := f.env.Enqueue(t, req)
				before := f.env.Dump(t)
				st, b := post(t, f.node, wire.PathLease, wire.LeaseRequest{SupportedJobTypes: []string{"lora_train"}, Accept: true})
				out := decode[wire.LeaseResponse](t, b)
				if st != http.StatusOK || len(out.Leases) != 0 || !strings.Contains(out.Message, "blocked") {
					t.Fatalf("lease: %d %s", st, b)
				}
				if diff := cmp.Diff(before, f.env.Dump(t)); diff != "" {
					t.Errorf("an empty lease changed state (-before +after):\n%s", diff)
				}
				if _, err := f.env.Server.Leases().Cancel(context.Background(), j.ID); err != nil {
					t.Fatal(err)
				}
			})

			t.Run("one read gates the lease and the accept", func(t *testing.T) {
				if st, b := f.env.Operator(t, http.MethodPost, "/operator/envelope/activate", map[string]any{"reason": "test"}); st != http.StatusOK {
					t.Fatalf("activate: %d %s", st, b)
				}
				gated := f.env.Enqueue(t, req)
				safe := f.env.Enqueue(t, lease.NewJob{Type: "status_check", Requirements: lease.Requirements{GPUSKU: sku, GPUCount: 1}})
				// The lease reads the runtime active; any later read, as the
				// separate accept read of old did, would see it inactive.
				flip.arm(1)
				defer flip.disarm()
				st, b := post(t, f.node, wire.PathLease, wire.LeaseRequest{
					SupportedJobTypes: []string{"lora_train", "status_check"}, MaxJobs: 2, Accept: true,
				})
				out := decode[wire.LeaseResponse](t, b)
				if st != http.StatusOK || len(out.Leases) != 2 || out.Message != "leased and accepted 2 jobs" {
					t.Fatalf("lease: %d %s", st, b)
				}
				for _, g := range out.Leases {
					if g.Job.State != wire.JobStateRunning || g.Job.AcceptedAt == nil || !g.Job.AcceptedAt.Equal(now) {
						t.Errorf("grant of job %s: %+v, want running, accepted now", g.Job.ID, g.Job)
					}
				}
				for _, id := range []string{gated.ID, safe.ID} {
					if j := f.env.Job(t, id); j.State != lease.StateRunning || j.AcceptedAt == nil {
						t.Errorf("job %s as stored: %s", id, j.State)
					}
				}
			})
		})
	}
}
