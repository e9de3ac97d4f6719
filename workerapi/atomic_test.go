package workerapi_test

import (
	"context"
	"errors"
	"net/http"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/nodelane/nodelane/credential"
	"github.com/nodelane/nodelane/internal/apitest"
	"github.com/nodelane/nodelane/lease"
	"github.com/nodelane/nodelane/receipts"
	"github.com/nodelane/nodelane/replay"
	"github.com/nodelane/nodelane/workerapi"
	"github.com/nodelane/nodelane/workerapi/wire"
)

var errInjected = errors.New("injected fault")

// faults fails the armed-th store write after it is armed, counting every
// write a request makes to the lease, credential, receipt and nonce
// stores inside its transaction.
type faults struct {
	mu     sync.Mutex
	armed  bool
	failAt int
	writes int
}

func (f *faults) arm(at int) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.armed, f.failAt, f.writes = true, at, 0
}

func (f *faults) disarm() (writes int) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.armed = false
	return f.writes
}

// write is called before every store write; it fails the chosen one.
func (f *faults) write() error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if !f.armed {
		return nil
	}
	f.writes++
	if f.writes == f.failAt {
		return errInjected
	}
	return nil
}

type faultyLeases struct {
	lease.Store
	f *faults
}

func (s faultyLeases) CreateJobs(ctx context.Context, js []*lease.Job) error {
	if err := s.f.write(); err != nil {
		return err
	}
	return s.Store.CreateJobs(ctx, js)
}

func (s faultyLeases) UpdateJob(ctx context.Context, j *lease.Job, rev int64) error {
	if err := s.f.write(); err != nil {
		return err
	}
	return s.Store.UpdateJob(ctx, j, rev)
}

func (s faultyLeases) ClaimLeases(ctx context.Context, workerID string, plan func(*lease.Worker) (lease.ClaimQuery, lease.LeaseClaim, bool, error)) ([]*lease.Job, error) {
	if err := s.f.write(); err != nil {
		return nil, err
	}
	return s.Store.ClaimLeases(ctx, workerID, plan)
}

func (s faultyLeases) AcceptLeased(ctx context.Context, ws []lease.AcceptWrite) ([]*lease.Job, error) {
	if err := s.f.write(); err != nil {
		return nil, err
	}
	return s.Store.AcceptLeased(ctx, ws)
}

func (s faultyLeases) CompleteRunning(ctx context.Context, ws []lease.CompleteWrite) ([]*lease.Job, error) {
	if err := s.f.write(); err != nil {
		return nil, err
	}
	return s.Store.CompleteRunning(ctx, ws)
}

func (s faultyLeases) AddEvents(ctx context.Context, evs []*lease.Event) (int, error) {
	if err := s.f.write(); err != nil {
		return 0, err
	}
	return s.Store.AddEvents(ctx, evs)
}

func (s faultyLeases) AddArtifact(ctx context.Context, a *lease.Artifact) error {
	if err := s.f.write(); err != nil {
		return err
	}
	return s.Store.AddArtifact(ctx, a)
}

func (s faultyLeases) PutWorker(ctx context.Context, w *lease.Worker) error {
	if err := s.f.write(); err != nil {
		return err
	}
	return s.Store.PutWorker(ctx, w)
}

type faultyCredentials struct {
	credential.Store
	f *faults
}

func (s faultyCredentials) CreatePrincipal(ctx context.Context, p *credential.Principal) error {
	if err := s.f.write(); err != nil {
		return err
	}
	return s.Store.CreatePrincipal(ctx, p)
}

func (s faultyCredentials) UpdatePrincipal(ctx context.Context, p *credential.Principal, rev int64) error {
	if err := s.f.write(); err != nil {
		return err
	}
	return s.Store.UpdatePrincipal(ctx, p, rev)
}

func (s faultyCredentials) CreateCredential(ctx context.Context, c *credential.Credential) error {
	if err := s.f.write(); err != nil {
		return err
	}
	return s.Store.CreateCredential(ctx, c)
}

func (s faultyCredentials) UpdateCredential(ctx context.Context, c *credential.Credential, rev int64) error {
	if err := s.f.write(); err != nil {
		return err
	}
	return s.Store.UpdateCredential(ctx, c, rev)
}

type faultyReceipts struct {
	receipts.Store
	f *faults
}

func (s faultyReceipts) AddReceipt(ctx context.Context, r *receipts.Stored) error {
	if err := s.f.write(); err != nil {
		return err
	}
	return s.Store.AddReceipt(ctx, r)
}

type faultyNonces struct {
	replay.Store
	f *faults
}

func (s faultyNonces) Insert(ctx context.Context, node, nonce string, expires, now time.Time) error {
	if err := s.f.write(); err != nil {
		return err
	}
	return s.Store.Insert(ctx, node, nonce, expires, now)
}

// TestAtomicity fails each store write of register, artifacts, complete
// and fail in turn and shows that the request then changes nothing: its
// state change, its nonce and its receipts commit together or not at
// all. The loop ends when the request makes fewer writes than the one
// chosen to fail, so every step is covered.
func TestAtomicity(t *testing.T) {
	t.Parallel()
	type setup = atomSetup
	steps := []struct {
		name    string
		prepare func(t *testing.T, s *setup)
		request func(t *testing.T, s *setup) *http.Request
		want    int
	}{
		{"register", func(*testing.T, *setup) {}, func(t *testing.T, s *setup) *http.Request {
			req := studioGPU()
			req.NodeID, req.PublicKey = s.node.NodeID, s.node.PublicKey
			r := s.node.Request(t, http.MethodPost, "/workers/register", req)
			r.Header.Set("Authorization", "Bearer "+s.env.ProvisioningToken)
			return r
		}, http.StatusCreated},
		{"artifacts", leaseAndAccept, func(t *testing.T, s *setup) *http.Request {
			sum := "9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08"
			size := int64(4)
			return s.node.Request(t, http.MethodPost, "/workers/jobs/"+s.job+"/artifacts", wire.ArtifactRequest{
				LeaseToken: s.tok, ArtifactType: "adapter", Name: "a", URI: "file:///a", ChecksumSHA256: &sum, SizeBytes: &size,
			})
		}, http.StatusCreated},
		{"complete", leaseAndAccept, func(t *testing.T, s *setup) *http.Request {
			return s.node.Request(t, http.MethodPost, "/workers/jobs/"+s.job+"/complete", wire.CompleteRequest{LeaseToken: s.tok})
		}, http.StatusOK},
		{"fail", leaseAndAccept, func(t *testing.T, s *setup) *http.Request {
			return s.node.Request(t, http.MethodPost, "/workers/jobs/"+s.job+"/fail", wire.FailRequest{LeaseToken: s.tok, ErrorCode: "oom", Retryable: true})
		}, http.StatusOK},
	}
	for _, st := range steps {
		t.Run(st.name, func(t *testing.T) {
			t.Parallel()
			for at := 1; ; at++ {
				if at > 50 {
					t.Fatal("the request still fails after 50 writes")
				}
				f := &faults{}
				env := apitest.New(t, "sqlite",
					apitest.WithConfig(func(c *workerapi.Config) { c.ProofWait = 200 * time.Millisecond }),
					apitest.WithStores(func(s workerapi.Stores) workerapi.Stores {
						s.Leases = faultyLeases{s.Leases, f}
						s.Credentials = faultyCredentials{s.Credentials, f}
						s.Receipts = faultyReceipts{s.Receipts, f}
						s.Nonces = faultyNonces{s.Nonces, f}
						return s
					}))
				s := &setup{env: env, node: env.NewNode(t, "node")}
				st.prepare(t, s)
				before := env.Dump(t)
				req := st.request(t, s)
				f.arm(at)
				resp, body := env.Raw(t, req)
				writes := f.disarm()
				if writes < at {
					// Every write passed: the request must have succeeded.
					if resp.StatusCode != st.want {
						t.Fatalf("with no fault: %d %s", resp.StatusCode, body)
					}
					if at == 1 {
						t.Fatal("the request made no write")
					}
					t.Logf("%s: checked a failure at each of %d writes", st.name, at-1)
					return
				}
				wantCode(t, "a failed write", resp.StatusCode, body, http.StatusServiceUnavailable, wire.CodeUnavailable)
				if d := cmp.Diff(before, env.Dump(t)); d != "" {
					t.Fatalf("write %d failed, yet the request changed state (-before +after):\n%s", at, d)
				}
				// Whatever failed, the signed request cannot run again.
				resp, body = env.Raw(t, req)
				wantCode(t, "the failed request replayed", resp.StatusCode, body, http.StatusUnauthorized, wire.CodeReplayedNonce)
			}
		})
	}
}

type atomSetup struct {
	env  *apitest.Env
	node *apitest.Node
	job  string
	tok  string
}

// leaseAndAccept registers the node, enqueues a job, leases and accepts it.
func leaseAndAccept(t *testing.T, s *atomSetup) {
	t.Helper()
	s.node.Register(t, studioGPU())
	s.job = s.env.Enqueue(t, lease.NewJob{Type: "status_check"}).ID
	l := nodeCall[wire.LeaseResponse](t, s.node, "lease", "/workers/jobs/lease", wire.LeaseRequest{MaxJobs: 1}, http.StatusOK)
	if l.LeaseToken == nil {
		t.Fatalf("nothing leased: %+v", l)
	}
	s.tok = *l.LeaseToken
	nodeCall[wire.AcceptResponse](t, s.node, "accept", "/workers/jobs/"+s.job+"/accept", wire.TokenRequest{LeaseToken: s.tok}, http.StatusOK)
}
