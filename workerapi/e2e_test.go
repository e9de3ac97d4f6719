package workerapi_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/nodelane/nodelane/bunstore"
	"github.com/nodelane/nodelane/credential"
	"github.com/nodelane/nodelane/internal/apitest"
	"github.com/nodelane/nodelane/internal/testdb"
	"github.com/nodelane/nodelane/internal/waitfor"
	"github.com/nodelane/nodelane/lease"
	"github.com/nodelane/nodelane/receipts"
	"github.com/nodelane/nodelane/workerapi"
	"github.com/nodelane/nodelane/workerapi/wire"
)

// The end-to-end suite runs real HTTP over loopback against bunstore on
// SQLite and PostgreSQL.

func forDialects(t *testing.T, f func(t *testing.T, dialect string)) {
	for _, d := range testdb.Dialects() {
		t.Run(d.Name, func(t *testing.T) {
			t.Parallel()
			f(t, d.Name)
		})
	}
}

func decodeAs[T any](t *testing.T, what string, code, want int, body []byte) T {
	t.Helper()
	if code != want {
		t.Fatalf("%s: status %d, want %d: %s", what, code, want, body)
	}
	var v T
	if err := json.Unmarshal(body, &v); err != nil {
		t.Fatalf("%s: %v in %s", what, err, body)
	}
	return v
}

func nodeCall[T any](t *testing.T, n *apitest.Node, what, path string, body any, want int) T {
	t.Helper()
	resp, b := n.Do(t, http.MethodPost, path, body)
	return decodeAs[T](t, what, resp.StatusCode, want, b)
}

func wantCode(t *testing.T, what string, code int, body []byte, status int, errCode string) {
	t.Helper()
	var e wire.ErrorBody
	if code != status || json.Unmarshal(body, &e) != nil || e.Error.Code != errCode {
		t.Fatalf("%s: %d %s, want %d %s", what, code, body, status, errCode)
	}
}

func studioGPU() wire.RegisterRequest {
	return wire.RegisterRequest{
		Name: "Studio-GPU", Hostname: "studio.local", Role: "local_gpu_compute",
		Capabilities:   wire.Capabilities{GPUs: []wire.GPU{{SKU: "rtx-4090", VRAMMB: 24576}}, JobTypes: []string{"status_check", "lora_train"}},
		GovernorLimits: wire.GovernorLimits{MaxJobs: 2, MaxVRAMMB: 24576},
		Version:        "worker/1.0.0", HeartbeatIntervalSeconds: 30,
	}
}

func loraJob() wire.DispatchRequest {
	return wire.DispatchRequest{
		JobType:      "lora_train",
		Payload:      json.RawMessage(`{"base_model":"llama-3-8b","steps":100}`),
		Requirements: wire.Requirements{GPUSKU: "rtx-4090", GPUCount: 1, MinVRAMMB: 16000},
		MaxAttempts:  3,
	}
}

// The seed story: a node registers and polls; an operator dispatches
// lora_train, which stays queued and says why; the operator activates the
// runtime; the node leases, accepts, heartbeats, logs, reports a
// checkpoint artifact and completes; the receipts verify offline;
// deactivation stops new blocked leases.
func TestSeedStory(t *testing.T) {
	t.Parallel()
	forDialects(t, func(t *testing.T, dialect string) {
		env := apitest.New(t, dialect, apitest.WithConfig(func(c *workerapi.Config) {
			c.Prices = receipts.Prices{BySKU: map[string]int64{"rtx-4090": 1_802_000}}
		}))
		node := env.NewNode(t, "studio-gpu-1")
		reg := node.Register(t, studioGPU())
		if reg.Status != "registered" || reg.WorkerToken == "" {
			t.Fatalf("register = %+v", reg)
		}
		poll := wire.LeaseRequest{SupportedJobTypes: []string{"status_check", "lora_train"}, SupportedGPUSKUs: []string{"rtx-4090"}, MaxJobs: 1}
		if got := nodeCall[wire.LeaseResponse](t, node, "empty poll", "/workers/jobs/lease", poll, http.StatusOK); got.Job != nil || len(got.Leases) != 0 {
			t.Fatalf("poll of an empty queue leased %+v", got)
		}

		code, body := env.Operator(t, http.MethodPost, "/operator/jobs", loraJob())
		d := decodeAs[wire.DispatchResponse](t, "dispatch", code, http.StatusCreated, body)
		if d.Leasable || d.Reason == "" || d.Job.State != "queued" {
			t.Fatalf("dispatch of lora_train before activation = %+v", d)
		}
		got := nodeCall[wire.LeaseResponse](t, node, "blocked poll", "/workers/jobs/lease", poll, http.StatusOK)
		if got.Job != nil || got.Message == "" {
			t.Fatalf("a blocked job was leased, or the message is empty: %+v", got)
		}
		code, body = env.Operator(t, http.MethodGet, "/operator/jobs/"+d.Job.ID, nil)
		if detail := decodeAs[wire.JobDetailResponse](t, "job", code, http.StatusOK, body); detail.Reason != d.Reason {
			t.Fatalf("job read says %q, dispatch said %q", detail.Reason, d.Reason)
		}

		code, body = env.Operator(t, http.MethodPost, "/operator/envelope/activate", map[string]any{"reason": "training window"})
		if code != http.StatusOK {
			t.Fatalf("activate: %d %s", code, body)
		}
		code, body = env.Operator(t, http.MethodGet, "/operator/jobs/"+d.Job.ID, nil)
		if detail := decodeAs[wire.JobDetailResponse](t, "job", code, http.StatusOK, body); !detail.Leasable {
			t.Fatalf("after activation the job is still not leasable: %q", detail.Reason)
		}

		l := nodeCall[wire.LeaseResponse](t, node, "lease", "/workers/jobs/lease", poll, http.StatusOK)
		if l.Job == nil || l.Job.ID != d.Job.ID || l.LeaseToken == nil {
			t.Fatalf("lease after activation = %+v", l)
		}
		jobPath := "/workers/jobs/" + d.Job.ID
		tok := *l.LeaseToken
		a := nodeCall[wire.AcceptResponse](t, node, "accept", jobPath+"/accept", wire.TokenRequest{LeaseToken: tok}, http.StatusOK)
		if a.Job.State != "running" {
			t.Fatalf("accept = %+v", a)
		}
		hb := nodeCall[wire.HeartbeatResponse](t, node, "heartbeat", "/workers/heartbeat",
			wire.HeartbeatRequest{Status: "busy", CurrentJobs: []string{d.Job.ID}, Metrics: json.RawMessage(`{"gpu_util":0.93,"vram_used_mb":20100}`)}, http.StatusOK)
		if len(hb.Leases) != 1 || hb.Leases[0].JobID != d.Job.ID || len(hb.LostJobs) != 0 {
			t.Fatalf("heartbeat = %+v", hb)
		}
		nodeCall[wire.StatusResponse](t, node, "status", jobPath+"/status", wire.StatusRequest{LeaseToken: tok, EventType: "progress", Message: "50%", Payload: json.RawMessage(`{"step":50}`)}, http.StatusOK)
		lg := nodeCall[wire.LogsResponse](t, node, "logs", jobPath+"/logs", map[string]any{"lease_token": tok, "entries": []wire.LogEntry{{Seq: 1, Message: "epoch 1"}, {Seq: 2, Message: "epoch 2"}}}, http.StatusOK)
		if lg.Accepted != 2 {
			t.Fatalf("logs = %+v", lg)
		}
		sum := "9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08"
		size := int64(4)
		art := nodeCall[wire.ArtifactResponse](t, node, "artifact", jobPath+"/artifacts", wire.ArtifactRequest{
			LeaseToken: tok, ArtifactType: "adapter", Name: "adapter.safetensors", URI: "file:///models/adapter.safetensors",
			ChecksumSHA256: &sum, SizeBytes: &size, Metadata: json.RawMessage(`{"rank":8}`),
		}, http.StatusCreated)
		done := nodeCall[wire.CompleteResponse](t, node, "complete", jobPath+"/complete", wire.CompleteRequest{LeaseToken: tok, Metrics: json.RawMessage(`{"loss":0.12}`), WaitForProofs: true}, http.StatusOK)
		if done.Job.State != "succeeded" || done.ReceiptID == "" || done.Checkpoint == "" || len(done.Receipts) != 2 || len(done.Proofs) != 2 {
			t.Fatalf("complete = %+v", done)
		}

		// Offline verification: only the verifier key, the receipt, its
		// proof and the signed checkpoint.
		key, origin := env.Server.ReceiptVerifierKey(), env.Config.Origin
		kinds := map[receipts.Kind]bool{}
		for i, r := range done.Receipts {
			rc, err := receipts.Verify(key, origin, r.Body, done.Proofs[i], []byte(done.Checkpoint))
			if err != nil {
				t.Fatalf("receipt %s does not verify offline: %v", r.ID, err)
			}
			kinds[rc.Kind] = true
			if rc.JobID != d.Job.ID {
				t.Fatalf("receipt %s is about job %q", r.ID, rc.JobID)
			}
		}
		if !kinds[receipts.KindJobCompleted] || !kinds[receipts.KindJobCharged] {
			t.Fatalf("completion receipts are %v", kinds)
		}
		code, body = env.Operator(t, http.MethodGet, "/operator/receipts/"+art.ReceiptID, nil)
		ar := decodeAs[wire.ReceiptResponse](t, "artifact receipt", code, http.StatusOK, body)
		if ar.Proof == nil || ar.Checkpoint == nil {
			t.Fatalf("artifact receipt has no proof: %s", body)
		}
		rc, err := receipts.Verify(key, origin, ar.Receipt.Body, *ar.Proof, []byte(*ar.Checkpoint))
		if err != nil || rc.Kind != receipts.KindArtifactReported || rc.ArtifactID != art.ArtifactID {
			t.Fatalf("artifact receipt: %+v, %v", rc, err)
		}
		code, body = env.Operator(t, http.MethodGet, "/operator/artifacts?job_id="+d.Job.ID, nil)
		arts := decodeAs[struct {
			Artifacts []map[string]any `json:"artifacts"`
		}](t, "artifacts", code, http.StatusOK, body)
		if len(arts.Artifacts) != 1 || arts.Artifacts[0]["status"] != wire.ArtifactTrained {
			t.Fatalf("the adapter does not show as trained: %s", body)
		}

		// Deactivation stops new blocked leases.
		code, body = env.Operator(t, http.MethodPost, "/operator/envelope/deactivate", map[string]any{"reason": "window over"})
		if code != http.StatusOK {
			t.Fatalf("deactivate: %d %s", code, body)
		}
		code, body = env.Operator(t, http.MethodPost, "/operator/jobs", loraJob())
		d2 := decodeAs[wire.DispatchResponse](t, "dispatch", code, http.StatusCreated, body)
		if got := nodeCall[wire.LeaseResponse](t, node, "poll after deactivation", "/workers/jobs/lease", poll, http.StatusOK); got.Job != nil {
			t.Fatalf("leased %s after deactivation", got.Job.ID)
		}
		if j := env.Job(t, d2.Job.ID); j.State != lease.StateQueued {
			t.Fatalf("job after deactivation is %s", j.State)
		}
	})
}

// TestCompleteWithoutWaitingE2E checks that completions that do not ask
// for their proofs are answered at once with their receipts and no
// proofs, that the background sequencer integrates those receipts all the
// same, and that each then comes with its proof from GET
// /operator/receipts/{id}, verified offline against its signed checkpoint.
func TestCompleteWithoutWaitingE2E(t *testing.T) {
	t.Parallel()
	forDialects(t, func(t *testing.T, dialect string) {
		env := apitest.New(t, dialect, apitest.Started())
		node := env.NewNode(t, "studio-gpu-1")
		node.Register(t, studioGPU())
		poll := wire.LeaseRequest{MaxJobs: 1, Accept: true}
		answered := map[string][]byte{} // receipt id -> body answered by complete
		for range 5 {
			job := env.Enqueue(t, lease.NewJob{Type: "status_check"})
			l := nodeCall[wire.LeaseResponse](t, node, "lease", "/workers/jobs/lease", poll, http.StatusOK)
			if l.Job == nil || l.Job.ID != job.ID {
				t.Fatalf("lease = %+v", l)
			}
			done := nodeCall[wire.CompleteResponse](t, node, "complete", "/workers/jobs/"+job.ID+"/complete", wire.CompleteRequest{LeaseToken: *l.LeaseToken}, http.StatusOK)
			if done.Job.State != wire.JobStateSucceeded || len(done.Receipts) != 2 || done.Proofs == nil || len(done.Proofs) != 0 || done.Checkpoint != "" {
				t.Fatalf("complete = %+v, want its receipts and no proofs", done)
			}
			for _, r := range done.Receipts {
				answered[r.ID] = r.Body
			}
		}
		waitSequenced(t, env, slices.Collect(maps.Keys(answered))...)
		key, origin := env.Server.ReceiptVerifierKey(), env.Config.Origin
		for id, body := range answered {
			code, b := env.Operator(t, http.MethodGet, "/operator/receipts/"+id, nil)
			got := decodeAs[wire.ReceiptResponse](t, "receipt "+id, code, http.StatusOK, b)
			if got.Proof == nil || got.Checkpoint == nil || !bytes.Equal(got.Receipt.Body, body) {
				t.Fatalf("receipt %s: %s, want the body complete answered with a proof", id, b)
			}
			if rc, err := receipts.Verify(key, origin, got.Receipt.Body, *got.Proof, []byte(*got.Checkpoint)); err != nil || rc.ID != id {
				t.Fatalf("receipt %s does not verify offline: %+v, %v", id, rc, err)
			}
		}
	})
}

// A worker stalls past its TTL; the job goes to another worker; the first
// worker's late complete gets 409 lease_lost and no second receipt exists.
func TestLeaseLossE2E(t *testing.T) {
	t.Parallel()
	forDialects(t, func(t *testing.T, dialect string) {
		env := apitest.New(t, dialect, apitest.WithConfig(func(c *workerapi.Config) {
			c.Lease.LeaseTTL = time.Second
			c.Lease.RetryBase = time.Millisecond
			c.Lease.RetryMax = time.Millisecond
		}))
		a, b := env.NewNode(t, "node-a"), env.NewNode(t, "node-b")
		a.Register(t, studioGPU())
		b.Register(t, studioGPU())
		job := env.Enqueue(t, lease.NewJob{Type: "status_check"})
		poll := wire.LeaseRequest{MaxJobs: 1}
		la := nodeCall[wire.LeaseResponse](t, a, "lease a", "/workers/jobs/lease", poll, http.StatusOK)
		path := "/workers/jobs/" + job.ID
		nodeCall[wire.AcceptResponse](t, a, "accept a", path+"/accept", wire.TokenRequest{LeaseToken: *la.LeaseToken}, http.StatusOK)
		env.Clock.Advance(1100 * time.Millisecond) // a stalls past its TTL
		if err := env.Server.MaintainOnce(context.Background()); err != nil {
			t.Fatal(err)
		}
		env.Clock.Advance(5 * time.Millisecond) // the backoff
		lb := nodeCall[wire.LeaseResponse](t, b, "lease b", "/workers/jobs/lease", poll, http.StatusOK)
		if lb.Job == nil || lb.Job.ID != job.ID || lb.Job.Attempt != 2 {
			t.Fatalf("b's lease = %+v", lb)
		}
		nodeCall[wire.AcceptResponse](t, b, "accept b", path+"/accept", wire.TokenRequest{LeaseToken: *lb.LeaseToken}, http.StatusOK)
		nodeCall[wire.CompleteResponse](t, b, "complete b", path+"/complete", wire.CompleteRequest{LeaseToken: *lb.LeaseToken}, http.StatusOK)
		before := env.Receipts(t)
		resp, body := a.Do(t, http.MethodPost, path+"/complete", wire.CompleteRequest{LeaseToken: *la.LeaseToken})
		wantCode(t, "a's late complete", resp.StatusCode, body, http.StatusConflict, wire.CodeLeaseLost)
		if after := env.Receipts(t); after != before {
			t.Fatalf("the late complete minted %d receipts", after-before)
		}
		// The log lists sequenced receipts, and completions do not wait
		// for theirs: sequence what is pending first.
		if _, err := env.Server.Sequence(context.Background()); err != nil {
			t.Fatal(err)
		}
		code, rb := env.Operator(t, http.MethodGet, "/operator/receipts?limit=1000", nil)
		list := decodeAs[wire.ReceiptListResponse](t, "receipts", code, http.StatusOK, rb)
		completions := 0
		for _, r := range list.Receipts {
			if r.Kind == receipts.KindJobCompleted {
				completions++
			}
		}
		if completions != 1 {
			t.Fatalf("%d job_completed receipts, want 1", completions)
		}
	})
}

// An operator's cancel reaches the running worker through its next
// heartbeat, and the worker's fail ends the job canceled.
func TestCancelReachesWorker(t *testing.T) {
	t.Parallel()
	forDialects(t, func(t *testing.T, dialect string) {
		env := apitest.New(t, dialect)
		n := env.NewNode(t, "node")
		n.Register(t, studioGPU())
		job := env.Enqueue(t, lease.NewJob{Type: "status_check"})
		l := nodeCall[wire.LeaseResponse](t, n, "lease", "/workers/jobs/lease", wire.LeaseRequest{MaxJobs: 1}, http.StatusOK)
		path := "/workers/jobs/" + job.ID
		tok := *l.LeaseToken
		nodeCall[wire.AcceptResponse](t, n, "accept", path+"/accept", wire.TokenRequest{LeaseToken: tok}, http.StatusOK)
		hb := wire.HeartbeatRequest{Status: "busy", CurrentJobs: []string{job.ID}}
		if got := nodeCall[wire.HeartbeatResponse](t, n, "heartbeat", "/workers/heartbeat", hb, http.StatusOK); len(got.CancelJobs) != 0 {
			t.Fatalf("cancel before any was asked: %+v", got)
		}
		if code, body := env.Operator(t, http.MethodPost, "/operator/jobs/"+job.ID+"/cancel", nil); code != http.StatusOK {
			t.Fatalf("cancel: %d %s", code, body)
		}
		got := nodeCall[wire.HeartbeatResponse](t, n, "heartbeat", "/workers/heartbeat", hb, http.StatusOK)
		if len(got.CancelJobs) != 1 || got.CancelJobs[0] != job.ID {
			t.Fatalf("heartbeat after cancel = %+v", got)
		}
		st := nodeCall[wire.StatusResponse](t, n, "status", path+"/status", wire.StatusRequest{LeaseToken: tok, EventType: "progress"}, http.StatusOK)
		if !st.CancelRequested {
			t.Fatal("status answer does not announce the cancel")
		}
		f := nodeCall[wire.FailResponse](t, n, "fail", path+"/fail", wire.FailRequest{LeaseToken: tok, ErrorCode: "canceled", Retryable: true}, http.StatusOK)
		if f.Job.State != "canceled" || f.Requeued {
			t.Fatalf("fail after cancel = %+v", f)
		}
	})
}

// Mounted under a prefix with http.StripPrefix, the handler still
// verifies signatures, which cover the request-target as sent.
func TestMountedUnderPrefix(t *testing.T) {
	t.Parallel()
	env := apitest.New(t, "sqlite")
	mux := http.NewServeMux()
	mux.Handle("/api/nl/", http.StripPrefix("/api/nl", env.Server.WorkerHandler()))
	srv := httptest.NewServer(mux)
	t.Cleanup(srv.Close)
	prefixed := *env
	prefixed.URL = srv.URL + "/api/nl"
	n := env.NewNode(t, "prefixed").On(&prefixed)
	n.Register(t, studioGPU())
	got := nodeCall[wire.HeartbeatResponse](t, n, "heartbeat", "/workers/heartbeat?trace=1", wire.HeartbeatRequest{Status: "idle"}, http.StatusOK)
	if !got.OK {
		t.Fatalf("heartbeat under a prefix = %+v", got)
	}
	// The same request sent to the unprefixed path no longer matches its
	// signature.
	req := n.Request(t, http.MethodPost, "/workers/heartbeat", wire.HeartbeatRequest{Status: "idle"})
	req.URL.Path = "/workers/heartbeat"
	req.URL.Host = srv.Listener.Addr().String()
	plain := *env
	resp, body := plain.Raw(t, mustRewrite(t, req, env.URL))
	wantCode(t, "signature for a prefixed path sent elsewhere", resp.StatusCode, body, http.StatusUnauthorized, wire.CodeBadSignature)
}

func mustRewrite(t *testing.T, req *http.Request, base string) *http.Request {
	t.Helper()
	r2 := req.Clone(context.Background())
	u, err := r2.URL.Parse(base + "/workers/heartbeat")
	if err != nil {
		t.Fatal(err)
	}
	r2.URL = u
	r2.Host = ""
	return r2
}

// pgNotifiers gives each replica a bunstore Notifier on its database.
func pgNotifiers() apitest.Option {
	return apitest.WithNotifier(func(t testing.TB, db *bunstore.DB) workerapi.Notifier {
		n, err := db.Notifier(context.Background(), nil)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { n.Close() })
		return n
	})
}

// Two handler instances on one PostgreSQL: a long-poll on one wakes when
// a job is dispatched on the other, and a request replayed to the other
// instance is refused.
func TestTwoInstancesPostgres(t *testing.T) {
	t.Parallel()
	notifier := pgNotifiers()
	one := apitest.New(t, "postgres", notifier)
	two := one.Replica(t)
	n := one.NewNode(t, "node")
	n.Register(t, studioGPU())
	onTwo := n.On(two)

	type result struct {
		l   wire.LeaseResponse
		err error
	}
	done := make(chan result, 1)
	go func() {
		resp, body := onTwo.Do(t, http.MethodPost, "/workers/jobs/lease", wire.LeaseRequest{MaxJobs: 1, WaitSeconds: 20})
		var r result
		if resp.StatusCode != http.StatusOK {
			r.err = fmt.Errorf("status %d: %s", resp.StatusCode, body)
		} else {
			r.err = json.Unmarshal(body, &r.l)
		}
		done <- r
	}()
	two.AwaitLongPolls(t, 1)
	code, body := one.Operator(t, http.MethodPost, "/operator/jobs", wire.DispatchRequest{JobType: "status_check"})
	d := decodeAs[wire.DispatchResponse](t, "dispatch on one", code, http.StatusCreated, body)
	woken := time.Now()
	r := waitfor.Receive(t, "the long-poll on two", done)
	if r.err != nil || r.l.Job == nil || r.l.Job.ID != d.Job.ID {
		t.Fatalf("long-poll on two = %+v, %v", r.l, r.err)
	}
	if waited := time.Since(woken); waited > 10*time.Second {
		t.Fatalf("the long-poll took %v after the dispatch: it was not woken", waited)
	}

	req := n.Request(t, http.MethodPost, "/workers/heartbeat", wire.HeartbeatRequest{Status: "idle"})
	if resp, body := one.Raw(t, req); resp.StatusCode != http.StatusOK {
		t.Fatalf("heartbeat on one: %d %s", resp.StatusCode, body)
	}
	resp, rbody := two.Raw(t, req)
	wantCode(t, "the same request replayed to two", resp.StatusCode, rbody, http.StatusUnauthorized, wire.CodeReplayedNonce)
}

// Two instances on one PostgreSQL, each caching credentials, principals
// and the envelope state for an hour: a ban, an unban and a revocation
// made through one take effect on the other within 1 s, because each
// change is announced on the Notifiers' channel (bunstore's read cache).
func TestTwoInstancesCachePostgres(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	notifier := pgNotifiers()
	one := apitest.New(t, "postgres", notifier, apitest.WithDBConfig(&bunstore.Config{CacheTTL: time.Hour}))
	two := one.Replica(t)
	n := one.NewNode(t, "node")
	n.Register(t, studioGPU())
	onTwo := n.On(two)

	heartbeat := func() (int, []byte) {
		resp, body := onTwo.Do(t, http.MethodPost, "/workers/heartbeat", wire.HeartbeatRequest{Status: "idle"})
		return resp.StatusCode, body
	}
	// within polls the heartbeat on two until it answers status, for at
	// most 1 s.
	within := func(what string, status int, code string) {
		t.Helper()
		var (
			st   int
			body []byte
		)
		defer func() {
			if t.Failed() {
				t.Logf("two's last answer: %d %s", st, body)
			}
		}()
		waitfor.Within(t, time.Second, fmt.Sprintf("two to answer %d %s after %s on one", status, code, what), func() bool {
			st, body = heartbeat()
			return st == status && (code == "" || strings.Contains(string(body), `"`+code+`"`))
		})
	}
	if st, body := heartbeat(); st != http.StatusOK { // two now holds the node's entries
		t.Fatalf("heartbeat on two: %d %s", st, body)
	}

	code, body := one.Operator(t, http.MethodPost, "/operator/workers/"+n.WorkerID+"/ban", map[string]string{"reason": "test"})
	if code != http.StatusOK {
		t.Fatalf("ban on one: %d %s", code, body)
	}
	within("a ban", http.StatusForbidden, wire.CodeWorkerBanned)
	code, body = one.Operator(t, http.MethodPost, "/operator/workers/"+n.WorkerID+"/unban", map[string]string{"reason": "test"})
	if code != http.StatusOK {
		t.Fatalf("unban on one: %d %s", code, body)
	}
	within("an unban", http.StatusOK, "")

	creds, err := one.DB.CredentialStore().ListCredentials(ctx, credential.CredentialFilter{PrincipalID: n.WorkerID, Limit: 10})
	if err != nil || len(creds) != 1 {
		t.Fatalf("the node's credentials: %d, %v", len(creds), err)
	}
	code, body = one.Operator(t, http.MethodPost, "/operator/credentials/"+creds[0].ID+"/revoke", map[string]string{"reason": "test"})
	if code != http.StatusOK {
		t.Fatalf("revoke on one: %d %s", code, body)
	}
	within("a revocation", http.StatusUnauthorized, wire.CodeTokenRevoked)
}
