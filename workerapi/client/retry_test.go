package client_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"sync"
	"testing"
	"time"

	"github.com/nodelane/nodelane/internal/apitest"
	"github.com/nodelane/nodelane/lease"
	"github.com/nodelane/nodelane/workerapi/client"
	"github.com/nodelane/nodelane/workerapi/wire"
)

// errLost is the error the dropper returns for an answer it drops.
var errLost = errors.New("injected: the answer was lost after the control plane committed")

// dropper is an http.RoundTripper that, for each path armed, lets the
// request reach the control plane, reads its whole answer (so the request
// ran to its end and committed), and drops it: the client gets errLost,
// as when a connection breaks after COMMIT, and retries as it would (a new
// signature and nonce, the same body). It keeps every answer, so that a
// test can compare the retry's with the one dropped.
type dropper struct {
	base http.RoundTripper

	mu      sync.Mutex
	armed   map[string]bool
	dropped map[string][]byte
	answers map[string][][]byte
}

func newDropper() *dropper {
	return &dropper{
		base:  http.DefaultTransport.(*http.Transport).Clone(),
		armed: map[string]bool{}, dropped: map[string][]byte{}, answers: map[string][][]byte{},
	}
}

func (d *dropper) RoundTrip(r *http.Request) (*http.Response, error) {
	resp, err := d.base.RoundTrip(r)
	if err != nil {
		return nil, err
	}
	b, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	if err != nil {
		return nil, err
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	p := r.URL.Path
	d.answers[p] = append(d.answers[p], b)
	if d.armed[p] {
		delete(d.armed, p)
		d.dropped[p] = b
		return nil, errLost
	}
	resp.Body = io.NopCloser(bytes.NewReader(b))
	return resp, nil
}

// lose drops the next answer on path, runs call, and returns the answer
// dropped and the answer the client got in the end (its retry's).
func (d *dropper) lose(t *testing.T, path string, call func() error) (dropped, final []byte) {
	t.Helper()
	d.mu.Lock()
	d.armed[path] = true
	n := len(d.answers[path])
	d.mu.Unlock()
	if err := call(); err != nil {
		t.Fatalf("%s after a lost answer: %v", path, err)
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	as := d.answers[path][n:]
	if d.armed[path] || len(as) != 2 {
		t.Fatalf("%s: %d answers, want the one dropped and its retry's", path, len(as))
	}
	return d.dropped[path], as[1]
}

// sameAnswer checks that the retry's answer is the first one, byte for
// byte.
func sameAnswer(t *testing.T, what string, dropped, final []byte) {
	t.Helper()
	if !bytes.Equal(dropped, final) {
		t.Errorf("%s: the retry answered\n%s\nnot the first answer\n%s", what, final, dropped)
	}
}

// count counts the rows of table that match where.
func count(t *testing.T, env *apitest.Env, table, where string, args ...any) int {
	t.Helper()
	n, err := env.DB.Bun().NewSelect().Table(table).Where(where, args...).Count(context.Background())
	if err != nil {
		t.Fatalf("counting %s: %v", table, err)
	}
	return int(n)
}

// TestRetryAfterLostAnswer is issue 12's acceptance test: on every worker
// route that changes state, the answer is dropped after the control plane
// committed, the Go client retries as it does (a new nonce, the same body
// and key), and the retry gets the first answer while the database holds
// one of each artifact, event, receipt and state change. Real HTTP over
// loopback, on SQLite and PostgreSQL.
func TestRetryAfterLostAnswer(t *testing.T) {
	t.Parallel()
	for _, d := range []string{"sqlite", "postgres"} {
		t.Run(d, func(t *testing.T) {
			t.Parallel()
			testRetryAfterLostAnswer(t, d)
		})
	}
}

func testRetryAfterLostAnswer(t *testing.T, dialect string) {
	env := apitest.New(t, dialect)
	dr := newDropper()
	c := newClClient(t, env.URL, func(cfg *client.Config) { cfg.HTTPClient = &http.Client{Transport: dr} })
	ctx := context.Background()
	if _, err := c.Register(ctx, env.ProvisioningToken, clRegistration("gpu-retry")); err != nil {
		t.Fatalf("Register: %v", err)
	}
	worker := c.Identity().WorkerID()
	receipts := env.Receipts(t)
	wantReceipts := func(what string, n int) {
		t.Helper()
		if got := env.Receipts(t); got != receipts+n {
			t.Errorf("%s minted %d receipts, want %d", what, got-receipts, n)
		}
		receipts = env.Receipts(t)
	}

	// heartbeat: nothing to duplicate; its answer is made anew.
	dr.lose(t, wire.PathHeartbeat, func() error {
		_, err := c.Heartbeat(ctx, wire.HeartbeatRequest{Status: "idle"})
		return err
	})

	// token: the retry, with the old token, gets the same new token.
	oldToken := c.Identity().Token()
	var renewed *wire.RenewTokenResponse
	dropped, final := dr.lose(t, wire.PathToken, func() (err error) {
		renewed, err = c.RenewToken(ctx)
		return err
	})
	sameAnswer(t, "token", dropped, final)
	wantReceipts("token", 1)
	if c.Identity().Token() != renewed.WorkerToken || renewed.WorkerToken == oldToken {
		t.Errorf("the client did not take the renewed token")
	}
	if n := count(t, env, "nodelane_credentials", "principal_id = ?", worker); n != 2 {
		t.Errorf("the worker has %d credentials, want 2 (registration, one renewal)", n)
	}

	// lease: the retry gets the same grant, and leases no second job.
	jobs := make([]*lease.Job, 5)
	for i := range jobs {
		jobs[i] = env.Enqueue(t, lease.NewJob{Type: "status_check"})
	}
	var lr *wire.LeaseResponse
	dropped, final = dr.lose(t, wire.PathLease, func() (err error) {
		lr, err = c.Lease(ctx, wire.LeaseRequest{SupportedJobTypes: []string{"status_check"}, MaxJobs: 1})
		return err
	})
	sameAnswer(t, "lease", dropped, final)
	if len(lr.Leases) != 1 {
		t.Fatalf("lease granted %d jobs, want 1", len(lr.Leases))
	}
	if n := count(t, env, "nodelane_jobs", "state = ?", lease.StateLeased); n != 1 {
		t.Errorf("%d jobs are leased after the retried lease, want 1", n)
	}
	job, tok := lr.Leases[0].Job.ID, lr.Leases[0].LeaseToken

	// accept: repeating it changes nothing.
	dropped, final = dr.lose(t, wire.JobPath(job, "accept"), func() error {
		_, err := c.Accept(ctx, job, wire.TokenRequest{LeaseToken: tok})
		return err
	})
	sameAnswer(t, "accept", dropped, final)

	// status: one event.
	dropped, final = dr.lose(t, wire.JobPath(job, "status"), func() error {
		_, err := c.Status(ctx, job, wire.StatusRequest{LeaseToken: tok, EventType: "progress", Message: "50%"})
		return err
	})
	sameAnswer(t, "status", dropped, final)
	if n := count(t, env, "nodelane_job_events", "job_id = ? AND kind = ?", job, lease.EventStatus); n != 1 {
		t.Errorf("%d status events, want 1", n)
	}

	// logs: one line, and the first answer's counts.
	seq, msg := int64(1), "epoch 1"
	dropped, final = dr.lose(t, wire.JobPath(job, "logs"), func() error {
		_, err := c.Logs(ctx, job, wire.LogsRequest{LeaseToken: tok, Seq: &seq, Message: &msg})
		return err
	})
	sameAnswer(t, "logs", dropped, final)
	if n := count(t, env, "nodelane_job_events", "job_id = ? AND kind = ?", job, lease.EventLog); n != 1 {
		t.Errorf("%d log events, want 1", n)
	}

	// artifacts: one artifact, one receipt.
	dropped, final = dr.lose(t, wire.JobPath(job, "artifacts"), func() error {
		_, err := c.Artifact(ctx, job, wire.ArtifactRequest{LeaseToken: tok, ArtifactType: "adapter", Name: "a.bin", URI: "s3://b/a.bin"})
		return err
	})
	sameAnswer(t, "artifacts", dropped, final)
	wantReceipts("artifacts", 1)
	if n := count(t, env, "nodelane_artifacts", "job_id = ?", job); n != 1 {
		t.Errorf("%d artifacts, want 1", n)
	}

	// complete: the same completion and receipts, minted once.
	dropped, final = dr.lose(t, wire.JobPath(job, "complete"), func() error {
		_, err := c.Complete(ctx, job, wire.CompleteRequest{LeaseToken: tok})
		return err
	})
	sameCompletion(t, "complete", dropped, final)
	wantReceipts("complete", 2)

	// The other jobs, leased and accepted one at a time.
	take := func() (string, string) {
		t.Helper()
		lr, err := c.Lease(ctx, wire.LeaseRequest{SupportedJobTypes: []string{"status_check"}, Accept: true})
		if err != nil || len(lr.Leases) != 1 {
			t.Fatalf("lease: %v, %+v", err, lr)
		}
		return lr.Leases[0].Job.ID, lr.Leases[0].LeaseToken
	}

	// complete many.
	bj, btok := take()
	dropped, final = dr.lose(t, wire.PathCompleteBatch, func() error {
		_, err := c.CompleteBatch(ctx, wire.CompleteBatchRequest{Completions: []wire.Completion{{JobID: bj, CompleteRequest: wire.CompleteRequest{LeaseToken: btok}}}})
		return err
	})
	sameCompletion(t, "complete many", dropped, final)
	wantReceipts("complete many", 2)

	// fail: requeued once, one job_failed receipt.
	fj, ftok := take()
	dropped, final = dr.lose(t, wire.JobPath(fj, "fail"), func() error {
		_, err := c.Fail(ctx, fj, wire.FailRequest{LeaseToken: ftok, ErrorCode: "oom", Retryable: true})
		return err
	})
	sameAnswer(t, "fail", dropped, final)
	wantReceipts("fail", 1)
	if j := env.Job(t, fj); j.State != lease.StateQueued || j.Attempt != 2 {
		t.Errorf("failed job: %s, attempt %d; want queued, attempt 2", j.State, j.Attempt)
	}

	// release: back in the queue, the attempt not used; its lease's end
	// is one job_failed receipt, however often the request is resent.
	rj, rtok := take()
	dropped, final = dr.lose(t, wire.JobPath(rj, "release"), func() error {
		_, err := c.Release(ctx, rj, wire.ReleaseRequest{LeaseToken: rtok, Reason: "preempted"})
		return err
	})
	sameAnswer(t, "release", dropped, final)
	wantReceipts("release", 1)
	if j := env.Job(t, rj); j.State != lease.StateQueued || j.Attempt != 1 {
		t.Errorf("released job: %s, attempt %d; want queued, attempt 1", j.State, j.Attempt)
	}

	// audit: one receipt per event.
	at := time.Now().UTC()
	dropped, final = dr.lose(t, wire.PathAudit, func() error {
		_, err := c.Audit(ctx, wire.AuditRequest{Events: []wire.AuditEvent{
			{EventType: "driver_update", OccurredAt: &at}, {EventType: "reboot", OccurredAt: &at}}})
		return err
	})
	sameAnswer(t, "audit", dropped, final)
	wantReceipts("audit", 2)
}

// sameCompletion compares two answers of complete, or of complete many,
// but for their proofs and checkpoint, which a repeat gives against the
// latest checkpoint.
func sameCompletion(t *testing.T, what string, dropped, final []byte) {
	t.Helper()
	strip := func(b []byte) string {
		var m map[string]any
		if err := json.Unmarshal(b, &m); err != nil {
			t.Fatalf("%s: %v: %s", what, err, b)
		}
		var rm func(v any)
		rm = func(v any) {
			switch v := v.(type) {
			case map[string]any:
				delete(v, "proofs")
				delete(v, "checkpoint")
				if rs, ok := v["receipts"].([]any); ok {
					for _, r := range rs {
						delete(r.(map[string]any), "index")
					}
				}
				for _, x := range v {
					rm(x)
				}
			case []any:
				for _, x := range v {
					rm(x)
				}
			}
		}
		rm(m)
		out, _ := json.Marshal(m)
		return string(out)
	}
	if a, b := strip(dropped), strip(final); a != b {
		t.Errorf("%s: the retry answered\n%s\nnot the first answer\n%s", what, b, a)
	}
}
