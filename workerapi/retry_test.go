package workerapi_test

import (
	"context"
	"errors"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nodelane/nodelane/internal/apitest"
	"github.com/nodelane/nodelane/lease"
	"github.com/nodelane/nodelane/replay"
	"github.com/nodelane/nodelane/workerapi"
	"github.com/nodelane/nodelane/workerapi/wire"
)

// errCommitLost is a COMMIT whose answer the database connection lost.
var errCommitLost = errors.New("injected: connection reset during COMMIT")

// commitFaults wraps the Server's Transactor: the next transaction armed
// with lose commits and then reports errCommitLost, as a connection lost
// during COMMIT does (the control plane cannot tell whether it
// committed); one armed with fail reports errCommitLost without
// committing. noNonce makes the nonce store fail from then on, so that
// the outcome cannot be learned.
type commitFaults struct {
	workerapi.Transactor
	replay.Store

	mu                  sync.Mutex
	lose, fail, noNonce bool
}

func (f *commitFaults) InTx(ctx context.Context, fn func(ctx context.Context) error) error {
	f.mu.Lock()
	lose, fail := f.lose, f.fail
	f.lose, f.fail = false, false
	f.mu.Unlock()
	if fail {
		return f.Transactor.InTx(ctx, func(ctx context.Context) error {
			if err := fn(ctx); err != nil {
				return err
			}
			return errCommitLost // rolls back
		})
	}
	err := f.Transactor.InTx(ctx, func(ctx context.Context) error {
		if err := fn(ctx); err != nil {
			return err
		}
		f.mu.Lock()
		defer f.mu.Unlock()
		if lose && f.noNonce {
			// From now on, outside this transaction, the nonce store
			// cannot answer.
			f.noNonce = false
			f.Store = brokenNonces{f.Store}
		}
		return nil
	})
	if err == nil && lose {
		return errCommitLost
	}
	return err
}

// brokenNonces is a nonce store that cannot answer.
type brokenNonces struct{ replay.Store }

func (brokenNonces) Insert(context.Context, string, string, time.Time, time.Time) error {
	return errors.New("injected: the nonce store cannot answer")
}

func (f *commitFaults) Insert(ctx context.Context, node, nonce string, expires, now time.Time) error {
	f.mu.Lock()
	ns := f.Store
	f.mu.Unlock()
	return ns.Insert(ctx, node, nonce, expires, now)
}

func (f *commitFaults) arm(lose, fail, noNonce bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.lose, f.fail, f.noNonce = lose, fail, noNonce
}

func withCommitFaults(f *commitFaults) apitest.Option {
	return apitest.WithStores(func(st workerapi.Stores) workerapi.Stores {
		f.Transactor, f.Store = st.Tx, st.Nonces
		st.Tx, st.Nonces = f, f
		return st
	})
}

func artifactCount(t *testing.T, env *apitest.Env, jobID string) int {
	t.Helper()
	arts, err := env.Server.Leases().Artifacts(context.Background(), lease.ArtifactFilter{JobID: jobID})
	if err != nil {
		t.Fatal(err)
	}
	return len(arts)
}

// TestUnknownCommit checks that a COMMIT whose outcome the control plane does not
// know is settled by the nonce: committed, the answer is the request's
// (never 503 "nothing was accepted"); rolled back, 503 and nothing kept;
// not learnable, 503 that says so, and a repeat with the key learns it.
func TestUnknownCommit(t *testing.T) {
	t.Parallel()
	onDialects(t, func(t *testing.T, d string) {
		faults := &commitFaults{}
		f := setup(t, d, withCommitFaults(faults))
		id, tok := f.running(t, "status_check")
		art := func(key string) wire.ArtifactRequest {
			return wire.ArtifactRequest{LeaseToken: tok, ArtifactType: "adapter", Name: "a.bin", URI: "s3://b/a.bin", IdempotencyKey: key}
		}

		t.Run("committed", func(t *testing.T) {
			n, rs := artifactCount(t, f.env, id), f.env.Receipts(t)
			faults.arm(true, false, false)
			st, b := post(t, f.node, wire.JobPath(id, "artifacts"), art(""))
			if st != http.StatusCreated {
				t.Fatalf("artifact whose COMMIT's answer was lost: %d %s, want 201", st, b)
			}
			out := decode[wire.ArtifactResponse](t, b)
			arts, err := f.env.Server.Leases().Artifacts(context.Background(), lease.ArtifactFilter{JobID: id})
			if err != nil {
				t.Fatal(err)
			}
			if len(arts) != n+1 || arts[len(arts)-1].ID != out.ArtifactID {
				t.Errorf("%d artifacts (want %d), the answer's %s stored: %v", len(arts), n+1, out.ArtifactID, arts)
			}
			if got := f.env.Receipts(t); got != rs+1 {
				t.Errorf("%d receipts minted, want 1", got-rs)
			}
		})

		t.Run("rolled back", func(t *testing.T) {
			f.unchanged(t, id, func() {
				n := artifactCount(t, f.env, id)
				faults.arm(false, true, false)
				st, b := post(t, f.node, wire.JobPath(id, "artifacts"), art(""))
				wantErr(t, st, b, http.StatusServiceUnavailable, wire.CodeUnavailable)
				if !strings.Contains(string(b), "nothing was accepted") {
					t.Errorf("a rolled-back request answered %s, want nothing was accepted", b)
				}
				if got := artifactCount(t, f.env, id); got != n {
					t.Errorf("%d artifacts stored by a rolled-back request", got-n)
				}
			})
		})

		t.Run("not learnable", func(t *testing.T) {
			defer func() {
				faults.mu.Lock()
				faults.Store = faults.Store.(brokenNonces).Store
				faults.mu.Unlock()
			}()
			n, rs := artifactCount(t, f.env, id), f.env.Receipts(t)
			faults.arm(true, false, true)
			st, b := post(t, f.node, wire.JobPath(id, "artifacts"), art(""))
			wantErr(t, st, b, http.StatusServiceUnavailable, wire.CodeUnavailable)
			if !strings.Contains(string(b), "may have been accepted") || strings.Contains(string(b), "nothing was accepted") {
				t.Errorf("an unknown outcome answered %s", b)
			}
			if got := artifactCount(t, f.env, id); got != n+1 {
				t.Errorf("%d artifacts stored, want the 1 committed", got-n)
			}
			if got := f.env.Receipts(t); got != rs+1 {
				t.Errorf("%d receipts minted, want 1", got-rs)
			}
		})

		t.Run("learned from the answer", func(t *testing.T) {
			// With a key, the remembered answer tells even when the nonce
			// store cannot.
			defer func() {
				faults.mu.Lock()
				faults.Store = faults.Store.(brokenNonces).Store
				faults.mu.Unlock()
			}()
			n, rs := artifactCount(t, f.env, id), f.env.Receipts(t)
			faults.arm(true, false, true)
			st, b := post(t, f.node, wire.JobPath(id, "artifacts"), art("unknown-outcome-0001"))
			if st != http.StatusCreated {
				t.Fatalf("artifact with a key whose COMMIT's answer was lost: %d %s, want 201", st, b)
			}
			if got := artifactCount(t, f.env, id); got != n+1 {
				t.Errorf("%d artifacts stored, want 1", got-n)
			}
			if got := f.env.Receipts(t); got != rs+1 {
				t.Errorf("%d receipts minted, want 1", got-rs)
			}
		})
	})
}

// TestRetryKeys checks the keys' bounds, a key reused with another body, and
// their scope (route, job, worker).
func TestRetryKeys(t *testing.T) {
	t.Parallel()
	onDialects(t, func(t *testing.T, d string) {
		f := setup(t, d)
		id, tok := f.running(t, "status_check")
		art := func(key, name string) wire.ArtifactRequest {
			return wire.ArtifactRequest{LeaseToken: tok, ArtifactType: "adapter", Name: name, URI: "s3://b/" + name, IdempotencyKey: key}
		}
		path := wire.JobPath(id, "artifacts")

		t.Run("bounds", func(t *testing.T) {
			for name, key := range map[string]string{
				"too short":  "abc",
				"too long":   strings.Repeat("k", wire.MaxIdempotencyKeyBytes+1),
				"a space":    "a key with spaces!",
				"not ascii":  "clé-de-requête-0001",
				"a NUL byte": "key-0000000000000\x00",
			} {
				t.Run(name, func(t *testing.T) {
					t.Parallel()
					f.unchanged(t, id, func() {
						st, b := post(t, f.node, path, art(key, "a.bin"))
						wantErr(t, st, b, http.StatusBadRequest, wire.CodeInvalidRequest)
						if !strings.Contains(string(b), "idempotency_key") {
							t.Errorf("the message does not name the field: %s", b)
						}
					})
				})
			}
			st, b := post(t, f.node, wire.PathLease, wire.LeaseRequest{RequestID: "short"})
			wantErr(t, st, b, http.StatusBadRequest, wire.CodeInvalidRequest)
		})

		key := "artifact-key-000001"
		st, first := post(t, f.node, path, art(key, "a.bin"))
		if st != http.StatusCreated {
			t.Fatalf("artifact: %d %s", st, first)
		}

		t.Run("another body", func(t *testing.T) {
			f.unchanged(t, id, func() {
				st, b := post(t, f.node, path, art(key, "b.bin"))
				wantErr(t, st, b, http.StatusUnprocessableEntity, wire.CodeIdempotencyMismatch)
			})
		})

		t.Run("the same body, spelled another way", func(t *testing.T) {
			f.unchanged(t, id, func() {
				body := `{ "uri": "s3://b/a.bin", "name": "a.bin", "artifact_type": "adapter",
				  "idempotency_key": "` + key + `", "lease_token": "` + tok + `" }`
				st, b := post(t, f.node, path, body)
				if st != http.StatusCreated || string(b) != string(first) {
					t.Errorf("repeat: %d %s, want the first answer %s", st, b, first)
				}
			})
		})

		t.Run("concurrent repeats", func(t *testing.T) {
			// Sent at once, before any answer: one artifact, one answer.
			cid, ctok := f.running(t, "status_check")
			req := art("concurrent-key-0001", "c.bin")
			req.LeaseToken = ctok
			const n = 4
			var (
				wg     sync.WaitGroup
				status [n]int
				bodies [n][]byte
			)
			for i := range n {
				wg.Go(func() { status[i], bodies[i] = post(t, f.node, wire.JobPath(cid, "artifacts"), req) })
			}
			wg.Wait()
			for i := range n {
				if status[i] != http.StatusCreated || string(bodies[i]) != string(bodies[0]) {
					t.Errorf("repeat %d: %d %s, want 201 %s", i, status[i], bodies[i], bodies[0])
				}
			}
			if got := artifactCount(t, f.env, cid); got != 1 {
				t.Errorf("%d artifacts, want 1", got)
			}
		})

		t.Run("another job", func(t *testing.T) {
			id2, tok2 := f.running(t, "status_check")
			req := art(key, "a.bin")
			req.LeaseToken = tok2
			st, b := post(t, f.node, wire.JobPath(id2, "artifacts"), req)
			if st != http.StatusCreated || decode[wire.ArtifactResponse](t, b).ArtifactID == decode[wire.ArtifactResponse](t, first).ArtifactID {
				t.Errorf("the key on another job: %d %s, want an artifact of its own", st, b)
			}
		})

		t.Run("another worker", func(t *testing.T) {
			other := f.env.NewNode(t, "studio-gpu-2")
			other.Register(t, registerRequest())
			at := time.Now().UTC()
			req := wire.AuditRequest{Events: []wire.AuditEvent{{EventType: "reboot", OccurredAt: &at}}, IdempotencyKey: "audit-key-00000001"}
			_, a := post(t, f.node, wire.PathAudit, req)
			st, b := post(t, other, wire.PathAudit, req)
			if st != http.StatusCreated || string(a) == string(b) {
				t.Errorf("one key, two workers: %s and %d %s, want receipts of each", a, st, b)
			}
		})

		t.Run("fail with another body", func(t *testing.T) {
			fid, ftok := f.running(t, "status_check")
			st, first := post(t, f.node, wire.JobPath(fid, "fail"), wire.FailRequest{LeaseToken: ftok, ErrorCode: "oom"})
			if st != http.StatusOK {
				t.Fatalf("fail: %d %s", st, first)
			}
			f.unchanged(t, fid, func() {
				st, b := post(t, f.node, wire.JobPath(fid, "fail"), wire.FailRequest{LeaseToken: ftok, ErrorCode: "oom"})
				if st != http.StatusOK || string(b) != string(first) {
					t.Errorf("fail repeated: %d %s, want the first answer", st, b)
				}
				st, b = post(t, f.node, wire.JobPath(fid, "fail"), wire.FailRequest{LeaseToken: ftok, ErrorCode: "disk"})
				wantErr(t, st, b, http.StatusConflict, wire.CodeInvalidTransition)
				st, b = post(t, f.node, wire.JobPath(fid, "release"), wire.ReleaseRequest{LeaseToken: ftok})
				wantErr(t, st, b, http.StatusConflict, wire.CodeInvalidTransition)
			})
		})

		t.Run("lease past accept_by", func(t *testing.T) {
			f.env.Enqueue(t, lease.NewJob{Type: "status_check"})
			req := wire.LeaseRequest{SupportedJobTypes: []string{"status_check"}, RequestID: "lease-request-00001"}
			_, a := post(t, f.node, wire.PathLease, req)
			_, b := post(t, f.node, wire.PathLease, req)
			if string(a) != string(b) || len(decode[wire.LeaseResponse](t, a).Leases) != 1 {
				t.Fatalf("lease repeated: %s, want the first answer %s", b, a)
			}
			f.env.Clock.Advance(workerapi.DefaultAcceptTimeout + time.Second)
			f.env.Enqueue(t, lease.NewJob{Type: "status_check"})
			_, c := post(t, f.node, wire.PathLease, req)
			if string(c) == string(a) {
				t.Errorf("a repeat past accept_by answered the first answer: %s", c)
			}
		})
	})
}

// TestAnswerTTL checks that an answer is forgotten after Config.AnswerTTL, and the
// maintainer deletes it; a repeat then records again.
func TestAnswerTTL(t *testing.T) {
	t.Parallel()
	onDialects(t, func(t *testing.T, d string) {
		f := setup(t, d, apitest.WithConfig(func(c *workerapi.Config) { c.AnswerTTL = time.Minute }))
		id, tok := f.running(t, "status_check")
		req := wire.StatusRequest{LeaseToken: tok, EventType: "progress", IdempotencyKey: "status-key-0000001"}
		events := func() int {
			evs, err := f.env.Server.Leases().Events(context.Background(), id, 0, 100)
			if err != nil {
				t.Fatal(err)
			}
			return len(evs)
		}
		n := events()
		for range 2 {
			if st, b := post(t, f.node, wire.JobPath(id, "status"), req); st != http.StatusOK {
				t.Fatalf("status: %d %s", st, b)
			}
		}
		if got := events(); got != n+1 {
			t.Fatalf("%d events within the TTL, want 1", got-n)
		}
		f.env.Clock.Advance(time.Minute)
		if err := f.env.Server.MaintainOnce(context.Background()); err != nil {
			t.Fatalf("MaintainOnce: %v", err)
		}
		var left int
		if err := f.env.DB.Bun().NewSelect().Table("nodelane_answers").ColumnExpr("count(*)").Scan(context.Background(), &left); err != nil {
			t.Fatal(err)
		}
		if left != 0 {
			t.Errorf("%d answers left after the maintainer, want 0", left)
		}
		if st, b := post(t, f.node, wire.JobPath(id, "status"), req); st != http.StatusOK {
			t.Fatalf("status after the TTL: %d %s", st, b)
		}
		if got := events(); got != n+2 {
			t.Errorf("%d events, want 2: the key was forgotten", got-n)
		}
	})
}

// TestDispatchUnknownCommit checks that a dispatch whose COMMIT's outcome is unknown
// is settled by looking for its job: committed, the answer is 201 with
// that job (never 503 "nothing was accepted" for a queued job); rolled
// back, 503 "nothing was accepted" and no job.
func TestDispatchUnknownCommit(t *testing.T) {
	t.Parallel()
	onDialects(t, func(t *testing.T, d string) {
		ctx := context.Background()
		faults := &commitFaults{}
		env := newOpEnv(t, d, withCommitFaults(faults))
		jobs := func() []*lease.Job {
			t.Helper()
			js, _, err := env.Server.Leases().List(ctx, lease.JobFilter{Limit: 100})
			if err != nil {
				t.Fatal(err)
			}
			return js
		}

		t.Run("committed", func(t *testing.T) {
			n := len(jobs())
			faults.arm(true, false, false)
			st, m := op(t, env, "POST", "/operator/jobs", obj{"job_type": "status_check"})
			if st != http.StatusCreated {
				t.Fatalf("dispatch whose COMMIT's answer was lost: %d %v, want 201", st, m)
			}
			js := jobs()
			if len(js) != n+1 {
				t.Fatalf("%d jobs queued, want 1", len(js)-n)
			}
			id := m["job"].(obj)["id"].(string)
			if _, err := env.Server.Leases().Get(ctx, id); err != nil {
				t.Errorf("the answer's job %s: %v", id, err)
			}
		})

		t.Run("rolled back", func(t *testing.T) {
			n := len(jobs())
			faults.arm(false, true, false)
			st, m := op(t, env, "POST", "/operator/jobs", obj{"job_type": "status_check"})
			wantOpError(t, "dispatch rolled back", st, m, http.StatusServiceUnavailable, wire.CodeUnavailable)
			if msg, _ := m["error"].(obj)["message"].(string); !strings.Contains(msg, "nothing was accepted") {
				t.Errorf("a rolled-back dispatch answered %q, want nothing was accepted", msg)
			}
			if got := len(jobs()); got != n {
				t.Errorf("%d jobs queued by a rolled-back dispatch", got-n)
			}
		})
	})
}
