package workerapi_test

import (
	"bytes"
	"context"
	"crypto/ed25519"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"slices"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nodelane/nodelane/credential"
	"github.com/nodelane/nodelane/internal/apitest"
	"github.com/nodelane/nodelane/internal/testdb"
	"github.com/nodelane/nodelane/internal/waitfor"
	"github.com/nodelane/nodelane/lease"
	"github.com/nodelane/nodelane/receipts"
	"github.com/nodelane/nodelane/workerapi"
	"github.com/nodelane/nodelane/workerapi/wire"
)

// The worker routes over real HTTP, through internal/apitest, on SQLite;
// TestWorkerFlow runs the main flows on every dialect.

const (
	sku  = "rtx-4090"
	rate = 1_802_000 // micro-USD per GPU-hour
)

// fx is a control plane with one registered GPU worker.
type fx struct {
	env  *apitest.Env
	node *apitest.Node
}

func setup(t *testing.T, dialect string, opts ...apitest.Option) *fx {
	t.Helper()
	opts = append([]apitest.Option{apitest.WithConfig(func(c *workerapi.Config) {
		c.Prices = receipts.Prices{BySKU: map[string]int64{sku: rate}}
		c.ProofWait = 10 * time.Second
	})}, opts...)
	env := apitest.New(t, dialect, opts...)
	node := env.NewNode(t, "studio-gpu-1")
	node.Register(t, registerRequest())
	return &fx{env: env, node: node}
}

func registerRequest() wire.RegisterRequest {
	return wire.RegisterRequest{
		Name: "Studio-GPU", Hostname: "studio.local", Role: "local_gpu_compute",
		Capabilities: wire.Capabilities{
			GPUs: []wire.GPU{{SKU: sku, VRAMMB: 24576}},
			// A node is granted only the types it registers.
			JobTypes: []string{"status_check", "lora_train", "telemetry_sync"},
		},
		GovernorLimits:           wire.GovernorLimits{MaxJobs: 4, MaxVRAMMB: 24576},
		Tags:                     []string{"lab"},
		Version:                  "worker/1.0.0",
		HeartbeatIntervalSeconds: 30,
	}
}

// post sends a signed POST and returns the status and body.
func post(t *testing.T, n *apitest.Node, path string, body any) (int, []byte) {
	t.Helper()
	resp, b := n.Do(t, http.MethodPost, path, body)
	return resp.StatusCode, b
}

func decode[T any](t *testing.T, b []byte) T {
	t.Helper()
	var v T
	if err := json.Unmarshal(b, &v); err != nil {
		t.Fatalf("decoding %s: %v", b, err)
	}
	return v
}

func asMap(t *testing.T, b []byte) map[string]any { t.Helper(); return decode[map[string]any](t, b) }

func keys(m map[string]any) []string {
	ks := make([]string, 0, len(m))
	for k := range m {
		ks = append(ks, k)
	}
	sort.Strings(ks)
	return ks
}

// wantKeys checks that m has exactly the keys want.
func wantKeys(t *testing.T, what string, m map[string]any, want ...string) {
	t.Helper()
	sort.Strings(want)
	if got := keys(m); !slices.Equal(got, want) {
		t.Errorf("%s: keys %v, want %v", what, got, want)
	}
}

// hasKeys checks that m has at least the keys want.
func hasKeys(t *testing.T, what string, m map[string]any, want ...string) {
	t.Helper()
	for _, k := range want {
		if _, ok := m[k]; !ok {
			t.Errorf("%s: no key %q in %v", what, k, keys(m))
		}
	}
}

// wantTime checks that v is an RFC 3339 UTC time string.
func wantTime(t *testing.T, what string, v any) {
	t.Helper()
	s, ok := v.(string)
	if !ok {
		t.Errorf("%s = %v, want a time string", what, v)
		return
	}
	if _, err := time.Parse(time.RFC3339Nano, s); err != nil || !strings.HasSuffix(s, "Z") {
		t.Errorf("%s = %q, want RFC 3339 in UTC", what, s)
	}
}

// wantErr checks an error answer.
func wantErr(t *testing.T, status int, body []byte, wantStatus int, wantCode string) {
	t.Helper()
	if status != wantStatus {
		t.Errorf("status %d, want %d (%s)", status, wantStatus, body)
		return
	}
	var e map[string]map[string]any
	if err := json.Unmarshal(body, &e); err != nil {
		t.Errorf("error body %s: %v", body, err)
		return
	}
	if code := e["error"]["code"]; code != wantCode {
		t.Errorf("code %v, want %s (%s)", code, wantCode, body)
	}
	if e["error"]["message"] == "" {
		t.Errorf("no message in %s", body)
	}
	wantTime(t, "server_time", e["error"]["server_time"])
}

// state is what a refused request must not change.
type state struct {
	State    lease.State
	Rev      int64
	Receipts int
	Events   int
}

func (f *fx) state(t *testing.T, jobID string) state {
	t.Helper()
	st := state{Receipts: f.env.Receipts(t)}
	if jobID != "" {
		j := f.env.Job(t, jobID)
		evs, err := f.env.Server.Leases().Events(context.Background(), jobID, 0, 1000)
		if err != nil {
			t.Fatal(err)
		}
		st.State, st.Rev, st.Events = j.State, j.Rev, len(evs)
	}
	return st
}

// unchanged runs f and checks that the job and the receipts did not change.
func (f *fx) unchanged(t *testing.T, jobID string, do func()) {
	t.Helper()
	before := f.state(t, jobID)
	do()
	if after := f.state(t, jobID); after != before {
		t.Errorf("state changed: %+v -> %+v", before, after)
	}
}

// leased enqueues a job of jobType and leases it over HTTP.
func (f *fx) leased(t *testing.T, jobType string) (string, string) {
	t.Helper()
	j := f.env.Enqueue(t, lease.NewJob{Type: jobType, Requirements: lease.Requirements{GPUSKU: sku, GPUCount: 1}})
	st, b := post(t, f.node, "/workers/jobs/lease", wire.LeaseRequest{SupportedJobTypes: []string{jobType}})
	if st != http.StatusOK {
		t.Fatalf("lease: %d %s", st, b)
	}
	lr := decode[wire.LeaseResponse](t, b)
	if lr.Job == nil || lr.Job.ID != j.ID {
		t.Fatalf("lease: got %s, want job %s", b, j.ID)
	}
	return j.ID, *lr.LeaseToken
}

// running leases a job and accepts it.
func (f *fx) running(t *testing.T, jobType string) (string, string) {
	t.Helper()
	id, tok := f.leased(t, jobType)
	if st, b := post(t, f.node, "/workers/jobs/"+id+"/accept", wire.TokenRequest{LeaseToken: tok}); st != http.StatusOK {
		t.Fatalf("accept: %d %s", st, b)
	}
	return id, tok
}

func TestRegister(t *testing.T) {
	t.Parallel()
	env := apitest.New(t, "sqlite")
	node := env.NewNode(t, "studio-gpu-1")
	req := registerRequest()
	req.NodeID, req.PublicKey = node.NodeID, node.PublicKey
	r := node.Request(t, http.MethodPost, "/workers/register", req)
	r.Header.Set("Authorization", "Bearer "+env.ProvisioningToken)
	resp, b := node.Raw(t, r)
	if resp.StatusCode != http.StatusCreated {
		t.Fatalf("register: %d %s", resp.StatusCode, b)
	}
	m := asMap(t, b)
	wantKeys(t, "register", m, "worker_id", "worker_token", "status", "policy_version", "poll_interval_seconds",
		"next_heartbeat_seconds", "server_time", "token_expires_at", "ended_jobs", "pending_job_types", "pending_tags")
	if m["status"] != "registered" || m["policy_version"] != 1.0 || m["poll_interval_seconds"] != 300.0 || m["next_heartbeat_seconds"] != 30.0 {
		t.Errorf("register answer %s", b)
	}
	if tok, _ := m["worker_token"].(string); !strings.HasPrefix(tok, "nlc_") {
		t.Errorf("worker_token %v", m["worker_token"])
	}
	wantTime(t, "server_time", m["server_time"])
	wantTime(t, "token_expires_at", m["token_expires_at"])
	out := decode[wire.RegisterResponse](t, b)
	if d := out.TokenExpiresAt.Sub(out.ServerTime); d < 29*24*time.Hour || d > 31*24*time.Hour {
		t.Errorf("token lives %v, want 30 days", d)
	}
	node.Token, node.WorkerID = out.WorkerToken, out.WorkerID
	if n := env.Receipts(t); n != 1 {
		t.Errorf("%d receipts after registration, want 1 (worker_registered)", n)
	}
	w, err := env.Server.Leases().Worker(context.Background(), out.WorkerID)
	if err != nil || w.NodeID != node.NodeID || w.Hostname != "studio.local" || w.Governor.MaxJobs != 4 || len(w.Capabilities.GPUs) != 1 {
		t.Errorf("worker record %+v, %v", w, err)
	}
	p, err := env.Server.Issuer().Principal(context.Background(), out.WorkerID)
	if err != nil || p.Kind != credential.KindNode || p.KeyID != credential.KeyID(node.Key.Public().(ed25519.PublicKey)) {
		t.Errorf("principal %+v, %v", p, err)
	}
	if st, b := post(t, node, "/workers/heartbeat", wire.HeartbeatRequest{Status: "idle"}); st != http.StatusOK {
		t.Fatalf("heartbeat with the new token: %d %s", st, b)
	}

	t.Run("same key rotates the token", func(t *testing.T) {
		old := node.Token
		again := node.Register(t, req)
		if again.WorkerID != out.WorkerID || again.WorkerToken == old {
			t.Errorf("re-register: %+v", again)
		}
		stale := *node
		stale.Token = old
		st, b := post(t, &stale, "/workers/heartbeat", wire.HeartbeatRequest{Status: "idle"})
		wantErr(t, st, b, http.StatusUnauthorized, wire.CodeTokenRevoked)
		if st, b := post(t, node, "/workers/heartbeat", wire.HeartbeatRequest{Status: "idle"}); st != http.StatusOK {
			t.Errorf("heartbeat with the rotated token: %d %s", st, b)
		}
		// The answer to a re-registration is 200.
		r := node.Request(t, http.MethodPost, "/workers/register", req)
		r.Header.Set("Authorization", "Bearer "+env.ProvisioningToken)
		resp, b = node.Raw(t, r)
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("re-register: %d %s", resp.StatusCode, b)
		}
		node.Token = decode[wire.RegisterResponse](t, b).WorkerToken
	})

	provisioned := func(n *apitest.Node, body any) (int, []byte) {
		r := n.Request(t, http.MethodPost, "/workers/register", body)
		r.Header.Set("Authorization", "Bearer "+env.ProvisioningToken)
		resp, b := n.Raw(t, r)
		return resp.StatusCode, b
	}
	f := &fx{env: env, node: node}

	t.Run("another key", func(t *testing.T) {
		other := env.NewNode(t, node.NodeID)
		r := req
		r.PublicKey = other.PublicKey
		f.unchanged(t, "", func() {
			st, b := provisioned(other, r)
			wantErr(t, st, b, http.StatusConflict, wire.CodeNodeExists)
		})
	})

	t.Run("invalid bodies", func(t *testing.T) {
		other := env.NewNode(t, "other-node")
		short := base64.RawURLEncoding.EncodeToString(make([]byte, 31))
		cases := []struct {
			name string
			body any
		}{
			{"malformed JSON", `{"node_id": "x",`},
			{"wrong type", `{"node_id": 5, "public_key": "` + other.PublicKey + `"}`},
			{"no public_key", `{"node_id": "other-node"}`},
			{"short public_key", `{"node_id": "other-node", "public_key": "` + short + `"}`},
			{"padded public_key", `{"node_id": "other-node", "public_key": "` + base64.URLEncoding.EncodeToString(other.Key.Public().(ed25519.PublicKey)) + `"}`},
			{"no node_id", `{"public_key": "` + other.PublicKey + `"}`},
			{"negative max_jobs", `{"node_id": "other-node", "public_key": "` + other.PublicKey + `", "governor_limits": {"max_jobs": -1}}`},
			{"negative vram", `{"node_id": "other-node", "public_key": "` + other.PublicKey + `", "capabilities": {"gpus": [{"sku": "a", "vram_mb": -1}]}}`},
			{"trailing data", `{"node_id": "other-node", "public_key": "` + other.PublicKey + `"} {}`},
		}
		for _, c := range cases {
			t.Run(c.name, func(t *testing.T) {
				t.Parallel()
				f.unchanged(t, "", func() {
					st, b := provisioned(other, c.body)
					wantErr(t, st, b, http.StatusBadRequest, wire.CodeInvalidRequest)
				})
			})
		}
	})

	t.Run("signed by another key", func(t *testing.T) {
		other, signer := env.NewNode(t, "other-node"), env.NewNode(t, "x")
		r := req
		r.NodeID, r.PublicKey = other.NodeID, other.PublicKey
		f.unchanged(t, "", func() {
			st, b := provisioned(signer, r)
			wantErr(t, st, b, http.StatusUnauthorized, wire.CodeBadSignature)
		})
	})

	t.Run("worker token lacks node:register", func(t *testing.T) {
		other := env.NewNode(t, "other-node")
		r := req
		r.NodeID, r.PublicKey = other.NodeID, other.PublicKey
		rq := other.Request(t, http.MethodPost, "/workers/register", r)
		rq.Header.Set("Authorization", "Bearer "+node.Token)
		f.unchanged(t, "", func() {
			resp, b := other.Raw(t, rq)
			wantErr(t, resp.StatusCode, b, http.StatusForbidden, wire.CodeInsufficientScope)
		})
	})

	t.Run("banned", func(t *testing.T) {
		if _, err := env.Server.Issuer().Ban(context.Background(), out.WorkerID, "stolen"); err != nil {
			t.Fatal(err)
		}
		f.unchanged(t, "", func() {
			st, b := provisioned(node, req)
			wantErr(t, st, b, http.StatusForbidden, wire.CodeWorkerBanned)
			st, b = post(t, node, "/workers/heartbeat", wire.HeartbeatRequest{Status: "idle"})
			wantErr(t, st, b, http.StatusForbidden, wire.CodeWorkerBanned)
		})
	})
}

func TestHeartbeat(t *testing.T) {
	t.Parallel()
	f := setup(t, "sqlite")
	id, _ := f.leased(t, "status_check")
	st, b := post(t, f.node, "/workers/heartbeat", map[string]any{
		"status": "busy", "capabilities": nil, "current_jobs": []string{id, "job-unknown"},
		"metrics": map[string]any{"gpu_util": 0.93, "vram_used_mb": 20100},
	})
	if st != http.StatusOK {
		t.Fatalf("heartbeat: %d %s", st, b)
	}
	m := asMap(t, b)
	wantKeys(t, "heartbeat", m, "ok", "worker_id", "server_time", "next_heartbeat_seconds", "heartbeat_deadline", "policy_version", "leases", "lost_jobs", "cancel_jobs", "ended_jobs", "drain")
	if m["ok"] != true || m["worker_id"] != f.node.WorkerID || m["next_heartbeat_seconds"] != 30.0 || m["policy_version"] != 1.0 {
		t.Errorf("heartbeat answer %s", b)
	}
	wantTime(t, "server_time", m["server_time"])
	ls, _ := m["leases"].([]any)
	if len(ls) != 1 {
		t.Fatalf("leases %v", m["leases"])
	}
	wantKeys(t, "leases[0]", ls[0].(map[string]any), "job_id", "expires_at")
	if ls[0].(map[string]any)["job_id"] != id {
		t.Errorf("leases %v", ls)
	}
	if lost, _ := m["lost_jobs"].([]any); len(lost) != 1 || lost[0] != "job-unknown" {
		t.Errorf("lost_jobs %v", m["lost_jobs"])
	}
	if c, ok := m["cancel_jobs"].([]any); !ok || len(c) != 0 {
		t.Errorf("cancel_jobs %v, want []", m["cancel_jobs"])
	}
	w, err := f.env.Server.Leases().Worker(context.Background(), f.node.WorkerID)
	if err != nil || w.Status != "busy" || !bytes.Contains(w.Metrics, []byte("0.93")) {
		t.Errorf("worker after heartbeat: %+v %v", w, err)
	}

	t.Run("cancel requested", func(t *testing.T) {
		if _, err := f.env.Server.Leases().Cancel(context.Background(), id); err != nil {
			t.Fatal(err)
		}
		_, b := post(t, f.node, "/workers/heartbeat", wire.HeartbeatRequest{Status: "busy", CurrentJobs: []string{id}})
		if out := decode[wire.HeartbeatResponse](t, b); !slices.Equal(out.CancelJobs, []string{id}) {
			t.Errorf("cancel_jobs %v", out.CancelJobs)
		}
	})

	t.Run("capabilities replace", func(t *testing.T) {
		caps := wire.Capabilities{JobTypes: []string{"telemetry_sync"}}
		if st, b := post(t, f.node, "/workers/heartbeat", wire.HeartbeatRequest{Status: "idle", Capabilities: &caps}); st != http.StatusOK {
			t.Fatalf("%d %s", st, b)
		}
		w, _ := f.env.Server.Leases().Worker(context.Background(), f.node.WorkerID)
		if !slices.Equal(w.Capabilities.JobTypes, caps.JobTypes) || len(w.Capabilities.GPUs) != 0 || w.Status != "idle" {
			t.Errorf("worker %+v", w)
		}
	})

	t.Run("invalid", func(t *testing.T) {
		big := `{"status":"idle","metrics":{"x":"` + strings.Repeat("a", 16<<10) + `"}}`
		for name, body := range map[string]string{
			"no status":        `{}`,
			"unknown status":   `{"status":"asleep"}`,
			"metrics array":    `{"status":"idle","metrics":[1]}`,
			"metrics too big":  big,
			"wrong type":       `{"status":"idle","current_jobs":"job"}`,
			"malformed":        `{"status":`,
			"negative vram_mb": `{"status":"idle","capabilities":{"gpus":[{"sku":"a","vram_mb":-1}]}}`,
		} {
			t.Run(name, func(t *testing.T) {
				t.Parallel()
				f.unchanged(t, id, func() {
					st, b := post(t, f.node, "/workers/heartbeat", body)
					wantErr(t, st, b, http.StatusBadRequest, wire.CodeInvalidRequest)
				})
			})
		}
	})
}

// TestPipeline runs the framing, credential, scope and signature checks
// on a worker route that changes a job, and checks that a refused
// request changes nothing.
func TestPipeline(t *testing.T) {
	t.Parallel()
	f := setup(t, "sqlite")
	id, tok := f.running(t, "status_check")
	path := "/workers/jobs/" + id + "/status"
	body := wire.StatusRequest{LeaseToken: tok, EventType: "progress", Message: "50%", Payload: json.RawMessage(`{"step":5}`)}
	ctx := context.Background()
	is := f.env.Server.Issuer()

	mintFor := func(t *testing.T, ttl time.Duration, scopes ...credential.Scope) (string, *credential.Credential) {
		tok, c, err := is.Mint(ctx, f.node.WorkerID, scopes, ttl)
		if err != nil {
			t.Fatal(err)
		}
		return tok, c
	}
	cases := []struct {
		name   string
		req    func(t *testing.T) *http.Request
		status int
		code   string
	}{
		{"wrong content type", func(t *testing.T) *http.Request {
			r := f.node.Request(t, http.MethodPost, path, body)
			r.Header.Set("Content-Type", "text/plain")
			return r
		}, http.StatusUnsupportedMediaType, wire.CodeUnsupportedMediaType},
		{"oversized body", func(t *testing.T) *http.Request {
			big := `{"lease_token":"` + tok + `","event_type":"x","message":"` + strings.Repeat("a", 1<<20) + `"}`
			return f.node.Request(t, http.MethodPost, path, big)
		}, http.StatusRequestEntityTooLarge, wire.CodePayloadTooLarge},
		{"no credential", func(t *testing.T) *http.Request {
			r := f.node.Request(t, http.MethodPost, path, body)
			r.Header.Del("Authorization")
			return r
		}, http.StatusUnauthorized, wire.CodeMissingCredential},
		{"invalid token", func(t *testing.T) *http.Request {
			r := f.node.Request(t, http.MethodPost, path, body)
			r.Header.Set("Authorization", "Bearer nlc_notatoken")
			return r
		}, http.StatusUnauthorized, wire.CodeInvalidToken},
		{"expired token", func(t *testing.T) *http.Request {
			tk, _ := mintFor(t, time.Minute, credential.ScopeNodeHeartbeat)
			f.env.Clock.Advance(2 * time.Minute)
			t.Cleanup(func() { f.env.Clock.Advance(-2 * time.Minute) })
			r := f.node.Request(t, http.MethodPost, path, body)
			r.Header.Set("Authorization", "Bearer "+tk)
			return r
		}, http.StatusUnauthorized, wire.CodeTokenExpired},
		{"revoked token", func(t *testing.T) *http.Request {
			tk, c := mintFor(t, time.Hour, credential.ScopeNodeHeartbeat)
			if _, err := is.Revoke(ctx, c.ID); err != nil {
				t.Fatal(err)
			}
			r := f.node.Request(t, http.MethodPost, path, body)
			r.Header.Set("Authorization", "Bearer "+tk)
			return r
		}, http.StatusUnauthorized, wire.CodeTokenRevoked},
		{"provisioning token", func(t *testing.T) *http.Request {
			r := f.node.Request(t, http.MethodPost, path, body)
			r.Header.Set("Authorization", "Bearer "+f.env.ProvisioningToken)
			return r
		}, http.StatusForbidden, wire.CodeInsufficientScope},
		{"operator token", func(t *testing.T) *http.Request {
			r := f.node.Request(t, http.MethodPost, path, body)
			r.Header.Set("Authorization", "Bearer "+f.env.OperatorToken)
			return r
		}, http.StatusForbidden, wire.CodeInsufficientScope},
		{"node token of another scope", func(t *testing.T) *http.Request {
			tk, _ := mintFor(t, time.Hour, credential.ScopeNodePoll)
			r := f.node.Request(t, http.MethodPost, path, body)
			r.Header.Set("Authorization", "Bearer "+tk)
			return r
		}, http.StatusForbidden, wire.CodeInsufficientScope},
		{"no signature", func(t *testing.T) *http.Request {
			r := f.node.Request(t, http.MethodPost, path, body)
			r.Header.Del("Signature")
			return r
		}, http.StatusUnauthorized, wire.CodeMissingSignature},
		{"no content digest", func(t *testing.T) *http.Request {
			r := f.node.Request(t, http.MethodPost, path, body)
			r.Header.Del("Content-Digest")
			return r
		}, http.StatusUnauthorized, wire.CodeMissingSignature},
		{"malformed signature", func(t *testing.T) *http.Request {
			r := f.node.Request(t, http.MethodPost, path, body)
			r.Header.Set("Signature-Input", "nodelane=(\"@method\");created=1")
			return r
		}, http.StatusUnauthorized, wire.CodeMalformedSignature},
		{"tampered body", func(t *testing.T) *http.Request {
			r := f.node.Request(t, http.MethodPost, path, body)
			b := apitest.Body(t, wire.StatusRequest{LeaseToken: tok, EventType: "progress", Message: "99%"})
			r.Body, r.ContentLength = nil, int64(len(b))
			r.GetBody = func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(b)), nil }
			return r
		}, http.StatusUnauthorized, wire.CodeBadDigest},
		{"tampered query", func(t *testing.T) *http.Request {
			r := f.node.Request(t, http.MethodPost, path, body)
			r.URL.RawQuery = "x=1"
			return r
		}, http.StatusUnauthorized, wire.CodeBadSignature},
		{"another node's key", func(t *testing.T) *http.Request {
			other := f.env.NewNode(t, "x")
			other.Token = f.node.Token
			return other.Request(t, http.MethodPost, path, body)
		}, http.StatusUnauthorized, wire.CodeBadSignature},
		{"stale timestamp", func(t *testing.T) *http.Request {
			f.env.Clock.Advance(10 * time.Minute)
			t.Cleanup(func() { f.env.Clock.Advance(-10 * time.Minute) })
			return f.node.Request(t, http.MethodPost, path, body)
		}, http.StatusUnauthorized, wire.CodeStaleTimestamp},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			r := c.req(t)
			f.unchanged(t, id, func() {
				resp, b := f.env.Raw(t, r)
				wantErr(t, resp.StatusCode, b, c.status, c.code)
			})
		})
	}

	t.Run("replayed byte for byte", func(t *testing.T) {
		r := f.node.Request(t, http.MethodPost, path, body)
		if resp, b := f.env.Raw(t, r); resp.StatusCode != http.StatusOK {
			t.Fatalf("first: %d %s", resp.StatusCode, b)
		}
		f.unchanged(t, id, func() {
			resp, b := f.env.Raw(t, r)
			wantErr(t, resp.StatusCode, b, http.StatusUnauthorized, wire.CodeReplayedNonce)
		})
	})

	t.Run("a refused operation consumes its nonce", func(t *testing.T) {
		r := f.node.Request(t, http.MethodPost, path, `{"lease_token":"`+tok+`"}`) // no event_type
		f.unchanged(t, id, func() {
			resp, b := f.env.Raw(t, r)
			wantErr(t, resp.StatusCode, b, http.StatusBadRequest, wire.CodeInvalidRequest)
			resp, b = f.env.Raw(t, r)
			wantErr(t, resp.StatusCode, b, http.StatusUnauthorized, wire.CodeReplayedNonce)
		})
	})

	t.Run("banned", func(t *testing.T) {
		if _, err := is.Ban(ctx, f.node.WorkerID, "test"); err != nil {
			t.Fatal(err)
		}
		defer is.Unban(ctx, f.node.WorkerID)
		f.unchanged(t, id, func() {
			st, b := post(t, f.node, path, body)
			wantErr(t, st, b, http.StatusForbidden, wire.CodeWorkerBanned)
		})
	})

	t.Run("unknown route and method", func(t *testing.T) {
		st, b := post(t, f.node, "/workers/nothing", body)
		wantErr(t, st, b, http.StatusNotFound, wire.CodeNotFound)
		resp, b := f.node.Do(t, http.MethodGet, path, nil)
		wantErr(t, resp.StatusCode, b, http.StatusMethodNotAllowed, wire.CodeMethodNotAllowed)
	})
}

func TestLease(t *testing.T) {
	t.Parallel()
	f := setup(t, "sqlite")
	j := f.env.Enqueue(t, lease.NewJob{Type: "status_check", Requirements: lease.Requirements{GPUSKU: sku, GPUCount: 1}})
	st, b := post(t, f.node, "/workers/jobs/lease", map[string]any{
		"supported_job_types": []string{"status_check", "lora_train"}, "supported_gpu_skus": []string{sku}, "max_jobs": 1, "wait_seconds": 0,
	})
	if st != http.StatusOK {
		t.Fatalf("lease: %d %s", st, b)
	}
	m := asMap(t, b)
	wantKeys(t, "lease", m, "lease_id", "lease_token", "job", "expires_at", "accept_by", "message", "leases", "server_time")
	job := m["job"].(map[string]any)
	hasKeys(t, "job", job, "id", "job_type", "payload", "requirements", "state", "attempt", "max_attempts", "priority",
		"created_at", "receipt_id", "cancel_requested")
	wantKeys(t, "requirements", job["requirements"].(map[string]any), "gpu_sku", "gpu_count", "min_vram_mb", "max_runtime_seconds", "tags")
	if job["id"] != j.ID || job["state"] != "leased" || job["attempt"] != 1.0 || job["receipt_id"] != nil ||
		job["cancel_requested"] != false || m["message"] != "leased 1 job" {
		t.Errorf("lease answer %s", b)
	}
	if tok, _ := m["lease_token"].(string); !strings.HasPrefix(tok, "nll_") {
		t.Errorf("lease_token %v", m["lease_token"])
	}
	wantTime(t, "expires_at", m["expires_at"])
	wantTime(t, "accept_by", m["accept_by"])
	ls := m["leases"].([]any)
	if len(ls) != 1 {
		t.Fatalf("leases %v", ls)
	}
	wantKeys(t, "leases[0]", ls[0].(map[string]any), "lease_id", "lease_token", "job", "expires_at", "accept_by")
	if ls[0].(map[string]any)["lease_token"] != m["lease_token"] {
		t.Errorf("leases[0] is not the top-level grant")
	}
	stored := f.env.Job(t, j.ID)
	if stored.State != lease.StateLeased || stored.Lease.PriceMicroUSD != rate || stored.Lease.SKU != sku || stored.Lease.PolicyVersion != 1 {
		t.Errorf("stored lease %+v", stored.Lease)
	}

	t.Run("none", func(t *testing.T) {
		f.env.Enqueue(t, lease.NewJob{Type: "lora_train"})
		st, b := post(t, f.node, "/workers/jobs/lease", wire.LeaseRequest{SupportedJobTypes: []string{"status_check", "lora_train"}})
		if st != http.StatusOK {
			t.Fatalf("%d %s", st, b)
		}
		m := asMap(t, b)
		wantKeys(t, "empty lease", m, "lease_id", "lease_token", "job", "expires_at", "accept_by", "message", "leases", "server_time")
		for _, k := range []string{"lease_id", "lease_token", "job", "expires_at", "accept_by"} {
			if m[k] != nil {
				t.Errorf("%s = %v, want null", k, m[k])
			}
		}
		if ls, ok := m["leases"].([]any); !ok || len(ls) != 0 {
			t.Errorf("leases = %v, want []", m["leases"])
		}
		msg, _ := m["message"].(string)
		if !strings.HasPrefix(msg, "no eligible job") || !strings.Contains(msg, "lora_train is blocked: the runtime is not activated") {
			t.Errorf("message %q", msg)
		}
	})

	t.Run("several", func(t *testing.T) {
		a := f.env.Enqueue(t, lease.NewJob{Type: "telemetry_sync"})
		f.env.Enqueue(t, lease.NewJob{Type: "telemetry_sync"})
		f.env.Enqueue(t, lease.NewJob{Type: "telemetry_sync"})
		// The governor allows 4 live leases; one is held.
		_, b := post(t, f.node, "/workers/jobs/lease", wire.LeaseRequest{SupportedJobTypes: []string{"telemetry_sync"}, MaxJobs: 5})
		out := decode[wire.LeaseResponse](t, b)
		if len(out.Leases) != 3 || out.Job.ID != a.ID || out.Leases[0].Job.ID != a.ID || *out.LeaseToken != out.Leases[0].LeaseToken ||
			out.Message != "leased 3 jobs" {
			t.Errorf("lease of 5 under a governor of 4: %s", b)
		}
		_, b = post(t, f.node, "/workers/jobs/lease", wire.LeaseRequest{SupportedJobTypes: []string{"telemetry_sync"}})
		if msg := decode[wire.LeaseResponse](t, b).Message; !strings.Contains(msg, "max_jobs") {
			t.Errorf("message at the governor's limit: %q", msg)
		}
	})

	t.Run("invalid", func(t *testing.T) {
		for name, body := range map[string]string{
			"max_jobs 0":    `{"max_jobs":0}`,
			"max_jobs 33":   `{"max_jobs":33}`,
			"negative wait": `{"wait_seconds":-1}`,
			"wrong type":    `{"supported_job_types":"status_check"}`,
			"fractional":    `{"max_jobs":1.5}`,
			"malformed":     `{`,
			"empty":         ``,
		} {
			t.Run(name, func(t *testing.T) {
				t.Parallel()
				f.unchanged(t, j.ID, func() {
					st, b := post(t, f.node, "/workers/jobs/lease", body)
					wantErr(t, st, b, http.StatusBadRequest, wire.CodeInvalidRequest)
				})
			})
		}
	})
}

// TestLongPoll checks a lease long-poll's wake-ups and its end, each case
// on a control plane of its own.
func TestLongPoll(t *testing.T) {
	t.Parallel()
	t.Run("wakes on dispatch", func(t *testing.T) {
		t.Parallel()
		f := setup(t, "sqlite")
		var (
			wg         sync.WaitGroup
			st         int
			b          []byte
			dispatched time.Time
			answered   time.Time
		)
		wg.Add(1)
		go func() {
			defer wg.Done()
			resp, body := f.node.Do(t, http.MethodPost, "/workers/jobs/lease", wire.LeaseRequest{SupportedJobTypes: []string{"status_check"}, WaitSeconds: 20})
			st, b, answered = resp.StatusCode, body, time.Now()
		}()
		f.env.AwaitLongPolls(t, 1)
		dispatched = time.Now()
		j, _, _, err := f.env.Server.Dispatch(context.Background(), lease.NewJob{Type: "status_check"})
		if err != nil {
			t.Fatal(err)
		}
		wg.Wait()
		out := decode[wire.LeaseResponse](t, b)
		if st != http.StatusOK || out.Job == nil || out.Job.ID != j.ID {
			t.Fatalf("long-poll: %d %s", st, b)
		}
		if taken := answered.Sub(dispatched); taken > 5*time.Second {
			t.Errorf("woke %v after the dispatch", taken)
		}
		if n := f.env.Server.LongPolls(); n != 0 {
			t.Errorf("%d long-polls still counted after the answer", n)
		}
	})
	t.Run("empty after the wait", func(t *testing.T) {
		t.Parallel()
		f := setup(t, "sqlite")
		start := time.Now()
		st, b := post(t, f.node, "/workers/jobs/lease", wire.LeaseRequest{SupportedJobTypes: []string{"status_check"}, WaitSeconds: 1})
		taken := time.Since(start)
		out := decode[wire.LeaseResponse](t, b)
		if st != http.StatusOK || out.Job != nil || len(out.Leases) != 0 || out.LeaseToken != nil {
			t.Fatalf("empty long-poll: %d %s", st, b)
		}
		if taken < time.Second || taken > 4*time.Second {
			t.Errorf("returned after %v, want about 1 s", taken)
		}
		// It says why, as an answer without a wait does (the attempts
		// during the wait do not; the answer does once).
		_, b0 := post(t, f.node, "/workers/jobs/lease", wire.LeaseRequest{SupportedJobTypes: []string{"status_check"}})
		if want := decode[wire.LeaseResponse](t, b0).Message; want == "" || out.Message != want {
			t.Errorf("the empty long-poll says %q, an answer without a wait %q", out.Message, want)
		}
	})
	t.Run("a job whose backoff ends", func(t *testing.T) {
		t.Parallel()
		f := setup(t, "sqlite")
		j := f.env.Enqueue(t, lease.NewJob{Type: "telemetry_sync", ScheduledAt: time.Now().Add(1500 * time.Millisecond)})
		st, b := post(t, f.node, "/workers/jobs/lease", wire.LeaseRequest{SupportedJobTypes: []string{"telemetry_sync"}, WaitSeconds: 10})
		out := decode[wire.LeaseResponse](t, b)
		if st != http.StatusOK || out.Job == nil || out.Job.ID != j.ID {
			t.Fatalf("long-poll for a scheduled job: %d %s", st, b)
		}
	})
	t.Run("capped by MaxWait", func(t *testing.T) {
		t.Parallel()
		env := apitest.New(t, "sqlite", apitest.WithConfig(func(c *workerapi.Config) { c.MaxWait = 500 * time.Millisecond }))
		n := env.NewNode(t, "n")
		n.Register(t, registerRequest())
		start := time.Now()
		resp, b := n.Do(t, http.MethodPost, "/workers/jobs/lease", wire.LeaseRequest{WaitSeconds: 60})
		if resp.StatusCode != http.StatusOK || time.Since(start) > 3*time.Second {
			t.Errorf("capped long-poll: %d after %v: %s", resp.StatusCode, time.Since(start), b)
		}
	})
}

func TestAccept(t *testing.T) {
	t.Parallel()
	f := setup(t, "sqlite")
	id, tok := f.leased(t, "status_check")
	path := "/workers/jobs/" + id + "/accept"

	t.Run("invalid", func(t *testing.T) {
		for name, body := range map[string]string{
			"no token":        `{}`,
			"malformed token": `{"lease_token":"nll_short"}`,
			"bad checksum":    `{"lease_token":"` + tok[:len(tok)-1] + flip(tok[len(tok)-1]) + `"}`,
			"wrong type":      `{"lease_token":5}`,
		} {
			// In turn: the accept below must come within accept_by.
			t.Run(name, func(t *testing.T) {
				f.unchanged(t, id, func() {
					st, b := post(t, f.node, path, body)
					wantErr(t, st, b, http.StatusBadRequest, wire.CodeInvalidRequest)
				})
			})
		}
	})
	t.Run("unknown job", func(t *testing.T) {
		// As for a job the caller holds no lease on: probing ids reveals
		// nothing (limits_test.go, TestProbingRevealsNothing).
		st, b := post(t, f.node, "/workers/jobs/job-nope/accept", wire.TokenRequest{LeaseToken: tok})
		wantErr(t, st, b, http.StatusConflict, wire.CodeLeaseLost)
	})

	st, b := post(t, f.node, path, wire.TokenRequest{LeaseToken: tok})
	if st != http.StatusOK {
		t.Fatalf("accept: %d %s", st, b)
	}
	m := asMap(t, b)
	wantKeys(t, "accept", m, "job", "expires_at")
	if job := m["job"].(map[string]any); job["state"] != "running" || job["id"] != id {
		t.Errorf("accept answer %s", b)
	}
	wantTime(t, "expires_at", m["expires_at"])
	// Accepting again under the same lease changes nothing.
	f.unchanged(t, id, func() {
		if st, b := post(t, f.node, path, wire.TokenRequest{LeaseToken: tok}); st != http.StatusOK {
			t.Errorf("accept again: %d %s", st, b)
		}
	})

	t.Run("stale token after re-lease", func(t *testing.T) {
		id, old := f.leased(t, "telemetry_sync")
		if st, b := post(t, f.node, "/workers/jobs/"+id+"/release", wire.ReleaseRequest{LeaseToken: old}); st != http.StatusOK {
			t.Fatalf("release: %d %s", st, b)
		}
		_, b := post(t, f.node, "/workers/jobs/lease", wire.LeaseRequest{SupportedJobTypes: []string{"telemetry_sync"}})
		if out := decode[wire.LeaseResponse](t, b); out.Job == nil || out.Job.ID != id || *out.LeaseToken == old {
			t.Fatalf("re-lease: %s", b)
		}
		f.unchanged(t, id, func() {
			st, b := post(t, f.node, "/workers/jobs/"+id+"/accept", wire.TokenRequest{LeaseToken: old})
			wantErr(t, st, b, http.StatusConflict, wire.CodeLeaseLost)
		})
	})

	t.Run("another worker's lease", func(t *testing.T) {
		other := f.env.NewNode(t, "other")
		other.Register(t, registerRequest())
		id, tok := f.leased(t, "telemetry_sync")
		f.unchanged(t, id, func() {
			st, b := post(t, other, "/workers/jobs/"+id+"/accept", wire.TokenRequest{LeaseToken: tok})
			wantErr(t, st, b, http.StatusConflict, wire.CodeLeaseLost)
		})
	})

	t.Run("blocked by the envelope", func(t *testing.T) {
		if st, b := f.env.Operator(t, http.MethodPost, "/operator/envelope/activate", map[string]any{"reason": "test"}); st != http.StatusOK {
			t.Fatalf("activate: %d %s", st, b)
		}
		id, tok := f.leased(t, "lora_train")
		if st, b := f.env.Operator(t, http.MethodPost, "/operator/envelope/deactivate", map[string]any{"reason": "test"}); st != http.StatusOK {
			t.Fatalf("deactivate: %d %s", st, b)
		}
		f.unchanged(t, id, func() {
			st, b := post(t, f.node, "/workers/jobs/"+id+"/accept", wire.TokenRequest{LeaseToken: tok})
			wantErr(t, st, b, http.StatusForbidden, wire.CodeBlockedByEnvelope)
		})
	})
}

func flip(c byte) string {
	if c == 'A' {
		return "B"
	}
	return "A"
}

func TestStatusAndLogs(t *testing.T) {
	t.Parallel()
	f := setup(t, "sqlite")
	id, tok := f.running(t, "status_check")
	before := f.env.Job(t, id).Lease.ExpiresAt
	f.env.Clock.Advance(time.Second)
	defer f.env.Clock.Advance(-time.Second)

	st, b := post(t, f.node, "/workers/jobs/"+id+"/status", map[string]any{
		"lease_token": tok, "event_type": "progress", "message": "50%", "payload": map[string]any{"step": 5},
	})
	if st != http.StatusOK {
		t.Fatalf("status: %d %s", st, b)
	}
	m := asMap(t, b)
	wantKeys(t, "status", m, "ok", "expires_at", "cancel_requested")
	if m["ok"] != true || m["cancel_requested"] != false {
		t.Errorf("status answer %s", b)
	}
	if out := decode[wire.StatusResponse](t, b); !out.ExpiresAt.After(before) {
		t.Errorf("status did not extend the lease: %v, was %v", out.ExpiresAt, before)
	}

	logs := "/workers/jobs/" + id + "/logs"
	st, b = post(t, f.node, logs, map[string]any{"lease_token": tok, "message": "epoch 1", "payload": map[string]any{}, "seq": 1})
	if st != http.StatusOK {
		t.Fatalf("logs: %d %s", st, b)
	}
	m = asMap(t, b)
	wantKeys(t, "logs", m, "ok", "accepted", "duplicates", "expires_at")
	if m["ok"] != true || m["accepted"] != 1.0 || m["duplicates"] != 0.0 {
		t.Errorf("logs answer %s", b)
	}
	st, b = post(t, f.node, logs, map[string]any{"lease_token": tok, "entries": []map[string]any{
		{"seq": 1, "message": "again"}, {"seq": 2, "message": "epoch 2", "payload": map[string]any{"loss": 0.1}}, {"seq": 3, "message": "epoch 3"},
	}})
	if out := decode[wire.LogsResponse](t, b); st != http.StatusOK || out.Accepted != 2 || out.Duplicates != 1 {
		t.Errorf("batch: %d %s", st, b)
	}
	evs, err := f.env.Server.Leases().Events(context.Background(), id, 0, 100)
	if err != nil || len(evs) != 4 || evs[0].Kind != lease.EventStatus || evs[0].Type != "progress" || evs[3].Seq != 3 {
		t.Errorf("events %v %v", evs, err)
	}

	t.Run("invalid", func(t *testing.T) {
		for name, c := range map[string]struct{ path, body string }{
			"status without event_type": {"/status", `{"lease_token":"` + tok + `"}`},
			"status without token":      {"/status", `{"event_type":"progress"}`},
			"status payload not object": {"/status", `{"lease_token":"` + tok + `","event_type":"p","payload":[1]}`},
			"logs both forms":           {"/logs", `{"lease_token":"` + tok + `","seq":4,"message":"m","entries":[{"seq":5,"message":"n"}]}`},
			"logs neither form":         {"/logs", `{"lease_token":"` + tok + `"}`},
			"logs seq 0":                {"/logs", `{"lease_token":"` + tok + `","seq":0,"message":"m"}`},
			"logs batch seq 0":          {"/logs", `{"lease_token":"` + tok + `","entries":[{"seq":0,"message":"m"}]}`},
			"logs message without seq":  {"/logs", `{"lease_token":"` + tok + `","message":"m"}`},
			"logs seq a string":         {"/logs", `{"lease_token":"` + tok + `","seq":"4","message":"m"}`},
		} {
			t.Run(name, func(t *testing.T) {
				t.Parallel()
				f.unchanged(t, id, func() {
					st, b := post(t, f.node, "/workers/jobs/"+id+c.path, c.body)
					wantErr(t, st, b, http.StatusBadRequest, wire.CodeInvalidRequest)
				})
			})
		}
	})
	t.Run("cancel requested", func(t *testing.T) {
		if _, err := f.env.Server.Leases().Cancel(context.Background(), id); err != nil {
			t.Fatal(err)
		}
		_, b := post(t, f.node, "/workers/jobs/"+id+"/status", wire.StatusRequest{LeaseToken: tok, EventType: "progress"})
		if !decode[wire.StatusResponse](t, b).CancelRequested {
			t.Errorf("status answer %s", b)
		}
	})
}

func TestArtifacts(t *testing.T) {
	t.Parallel()
	f := setup(t, "sqlite")
	id, tok := f.running(t, "status_check")
	path := "/workers/jobs/" + id + "/artifacts"
	sum := strings.Repeat("ab", 32)
	n := f.env.Receipts(t)
	st, b := post(t, f.node, path, map[string]any{
		"lease_token": tok, "artifact_type": "adapter", "name": "adapter.safetensors", "uri": "s3://bucket/a",
		"checksum_sha256": sum, "size_bytes": 123, "metadata": map[string]any{"rank": 8},
	})
	if st != http.StatusCreated {
		t.Fatalf("artifacts: %d %s", st, b)
	}
	m := asMap(t, b)
	wantKeys(t, "artifacts", m, "artifact_id", "receipt_id", "stored")
	out := decode[wire.ArtifactResponse](t, b)
	if f.env.Receipts(t) != n+1 {
		t.Errorf("no artifact_reported receipt")
	}
	arts, err := f.env.Server.Leases().Artifacts(context.Background(), lease.ArtifactFilter{JobID: id})
	if err != nil || len(arts) != 1 || arts[0].ID != out.ArtifactID || arts[0].ReceiptID != out.ReceiptID || arts[0].SHA256 != sum {
		t.Fatalf("artifacts %+v %v", arts, err)
	}
	r := receiptOf(t, f.env, out.ReceiptID)
	if r.Kind != receipts.KindArtifactReported || r.ArtifactID != out.ArtifactID || r.ChecksumSHA256 != sum || r.SizeBytes != 123 ||
		r.JobID != id || r.WorkerID != f.node.WorkerID || r.LeaseEpoch != 1 || r.MetadataSHA256 == "" {
		t.Errorf("receipt %+v", r)
	}
	if !strings.HasPrefix(out.ReceiptID, "rcp_") || len(out.ReceiptID) != 36 {
		t.Errorf("receipt id %q is not in the log's form", out.ReceiptID)
	}

	for name, body := range map[string]string{
		"uppercase checksum": `{"lease_token":"` + tok + `","artifact_type":"a","name":"n","uri":"u","checksum_sha256":"` + strings.ToUpper(sum) + `","size_bytes":1}`,
		"short checksum":     `{"lease_token":"` + tok + `","artifact_type":"a","name":"n","uri":"u","checksum_sha256":"abcd","size_bytes":1}`,
		"negative size":      `{"lease_token":"` + tok + `","artifact_type":"a","name":"n","uri":"u","checksum_sha256":"` + sum + `","size_bytes":-1}`,
		"no name":            `{"lease_token":"` + tok + `","artifact_type":"a","uri":"u","checksum_sha256":"` + sum + `","size_bytes":1}`,
		"metadata a string":  `{"lease_token":"` + tok + `","artifact_type":"a","name":"n","uri":"u","checksum_sha256":"` + sum + `","size_bytes":1,"metadata":"x"}`,
		"no token":           `{"artifact_type":"a","name":"n","uri":"u","checksum_sha256":"` + sum + `","size_bytes":1}`,
	} {
		t.Run(name, func(t *testing.T) {
			f.unchanged(t, id, func() {
				st, b := post(t, f.node, path, body)
				wantErr(t, st, b, http.StatusBadRequest, wire.CodeInvalidRequest)
			})
		})
	}
	// checksum_sha256 and size_bytes are optional, as in the v0.2 contract.
	t.Run("no checksum or size", func(t *testing.T) {
		st, b := post(t, f.node, path, `{"lease_token":"`+tok+`","artifact_type":"log","name":"n","uri":"u"}`)
		if st != http.StatusCreated {
			t.Fatalf("artifact without checksum and size: %d %s", st, b)
		}
	})
}

// receiptOf decodes a stored receipt.
func receiptOf(t *testing.T, env *apitest.Env, id string) *receipts.Receipt {
	t.Helper()
	st, err := env.DB.ReceiptStore().GetReceipt(context.Background(), id)
	if err != nil {
		t.Fatalf("receipt %s: %v", id, err)
	}
	r, err := st.Receipt()
	if err != nil {
		t.Fatalf("receipt %s: %v", id, err)
	}
	return r
}

// completeFlow completes a job that ran 1234 ms on one rtx-4090, waiting
// for its proofs, and checks the answer, its receipts and proofs, and that
// completing again, without asking to wait, returns the same JSON.
func completeFlow(t *testing.T, f *fx) {
	t.Helper()
	f.env.Clock.Set(time.Now().UTC().Truncate(time.Millisecond))
	defer f.env.Clock.Follow()
	id, tok := f.running(t, "status_check")
	f.env.Clock.Advance(1234 * time.Millisecond)
	n := f.env.Receipts(t)
	path := "/workers/jobs/" + id + "/complete"
	r := f.node.Request(t, http.MethodPost, path, map[string]any{
		"lease_token": tok, "output_uri": nil, "metrics": map[string]any{"loss": 0.12}, "final_message": "done",
		"wait_for_proofs": true,
	})
	resp, b := f.env.Raw(t, r)
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("complete: %d %s", resp.StatusCode, b)
	}
	m := asMap(t, b)
	wantKeys(t, "complete", m, "job", "actual_ms", "actual_hours", "actual_cost_usd", "receipt_id", "receipts", "proofs", "checkpoint")
	if m["actual_ms"] != 1234.0 || m["actual_hours"] != "0.000343" || m["actual_cost_usd"] != "0.000618" {
		t.Errorf("money: %v %v %v", m["actual_ms"], m["actual_hours"], m["actual_cost_usd"])
	}
	job := m["job"].(map[string]any)
	if job["state"] != "succeeded" || job["receipt_id"] != m["receipt_id"] {
		t.Errorf("job %v", job)
	}
	out := decode[wire.CompleteResponse](t, b)
	if len(out.Receipts) != 2 || len(out.Proofs) != 2 || out.Checkpoint == "" {
		t.Fatalf("receipts %d, proofs %d, checkpoint %q", len(out.Receipts), len(out.Proofs), out.Checkpoint)
	}
	for i, wr := range m["receipts"].([]any) {
		wantKeys(t, fmt.Sprintf("receipts[%d]", i), wr.(map[string]any), "id", "kind", "index", "body")
		wantKeys(t, fmt.Sprintf("proofs[%d]", i), m["proofs"].([]any)[i].(map[string]any), "index", "tree_size", "hashes")
	}
	if out.Receipts[0].ID != out.ReceiptID || out.Receipts[0].Kind != receipts.KindJobCompleted ||
		out.Receipts[1].Kind != receipts.KindJobCharged || out.Receipts[1].ID != out.ReceiptID+".charge" {
		t.Errorf("receipts %+v", out.Receipts)
	}
	if f.env.Receipts(t) != n+2 {
		t.Errorf("%d receipts minted, want 2", f.env.Receipts(t)-n)
	}
	for i, wr := range out.Receipts {
		rc, err := receipts.Verify(f.env.Server.ReceiptVerifierKey(), f.env.Config.Origin, wr.Body, out.Proofs[i], []byte(out.Checkpoint))
		if err != nil {
			t.Fatalf("receipt %s does not verify: %v", wr.ID, err)
		}
		if wr.Index == nil || *wr.Index != out.Proofs[i].Index {
			t.Errorf("receipt %s index %v, proof %d", wr.ID, wr.Index, out.Proofs[i].Index)
		}
		switch rc.Kind {
		case receipts.KindJobCompleted:
			if rc.JobID != id || rc.WorkerID != f.node.WorkerID || rc.Attempt != 1 || rc.LeaseEpoch != 1 || rc.MetricsSHA256 == "" ||
				rc.EndedAt.Sub(rc.StartedAt) != 1234*time.Millisecond {
				t.Errorf("job_completed %+v", rc)
			}
		case receipts.KindJobCharged:
			if rc.ActualMS != 1234 || rc.CostMicros != 618 || rc.GPUCount != 1 || rc.RateMicros != rate || rc.GPUSKU != sku {
				t.Errorf("job_charged %+v", rc)
			}
		}
	}

	// Completing again: the same answer, nothing minted, nothing changed.
	f.unchanged(t, id, func() {
		resp, again := f.node.Do(t, http.MethodPost, path, map[string]any{"lease_token": tok})
		if resp.StatusCode != http.StatusOK || !bytes.Equal(again, b) {
			t.Errorf("complete again: %d\n%s\nwant\n%s", resp.StatusCode, again, b)
		}
	})
	// The request itself replayed is refused.
	f.unchanged(t, id, func() {
		resp, b := f.env.Raw(t, r)
		wantErr(t, resp.StatusCode, b, http.StatusUnauthorized, wire.CodeReplayedNonce)
	})
	// Fail after complete.
	f.unchanged(t, id, func() {
		st, b := post(t, f.node, "/workers/jobs/"+id+"/fail", wire.FailRequest{LeaseToken: tok, ErrorCode: "oom"})
		wantErr(t, st, b, http.StatusConflict, wire.CodeInvalidTransition)
	})
}

// TestCompleteWithoutWaiting checks that a complete that does not ask for
// its proofs answers at once with its receipts, without index, proof or
// checkpoint, and sequences nothing; that completing again without asking
// answers the same until the receipts are sequenced, and then with their
// proofs; and that a wait_for_proofs that is not a boolean is refused.
func TestCompleteWithoutWaiting(t *testing.T) {
	t.Parallel()
	f := setup(t, "sqlite")
	ctx := context.Background()
	id, tok := f.running(t, "status_check")
	path := "/workers/jobs/" + id + "/complete"
	f.unchanged(t, id, func() {
		st, b := post(t, f.node, path, `{"lease_token":"`+tok+`","wait_for_proofs":1}`)
		wantErr(t, st, b, http.StatusBadRequest, wire.CodeInvalidRequest)
		if !strings.Contains(string(b), `\"wait_for_proofs\" must be bool`) {
			t.Errorf("the message does not name wait_for_proofs: %s", b)
		}
	})
	st, first := post(t, f.node, path, map[string]any{"lease_token": tok})
	if st != http.StatusOK {
		t.Fatalf("complete: %d %s", st, first)
	}
	m := asMap(t, first)
	wantKeys(t, "complete", m, "job", "actual_ms", "actual_hours", "actual_cost_usd", "receipt_id", "receipts", "proofs", "checkpoint")
	if ps, ok := m["proofs"].([]any); !ok || len(ps) != 0 || m["checkpoint"] != "" {
		t.Fatalf("proofs %v, checkpoint %v: want [] and \"\"", m["proofs"], m["checkpoint"])
	}
	out := decode[wire.CompleteResponse](t, first)
	if out.Job.State != wire.JobStateSucceeded || len(out.Receipts) != 2 || out.Receipts[0].ID != out.ReceiptID || out.Receipts[1].ID != out.ReceiptID+".charge" {
		t.Fatalf("complete = %+v", out)
	}
	for _, r := range out.Receipts {
		if r.Index != nil {
			t.Errorf("receipt %s answered with index %d", r.ID, *r.Index)
		}
		// The request sequenced nothing: no Start, and it did not wait.
		if got, err := f.env.DB.ReceiptStore().GetReceipt(ctx, r.ID); err != nil || got.Sequenced || !bytes.Equal(got.Body, r.Body) {
			t.Fatalf("receipt %s as stored: %+v, %v", r.ID, got, err)
		}
	}
	// Completing again before they are sequenced: the same answer.
	f.unchanged(t, id, func() {
		if st, again := post(t, f.node, path, map[string]any{"lease_token": tok}); st != http.StatusOK || !bytes.Equal(again, first) {
			t.Errorf("complete again: %d\n%s\nwant\n%s", st, again, first)
		}
	})
	if _, err := f.env.Server.Sequence(ctx); err != nil {
		t.Fatal(err)
	}
	// Once they are: the proofs, without asking to wait, and the same
	// again when asking.
	var withProofs []byte
	f.unchanged(t, id, func() {
		st, withProofs = post(t, f.node, path, map[string]any{"lease_token": tok})
	})
	again := decode[wire.CompleteResponse](t, withProofs)
	if st != http.StatusOK || len(again.Proofs) != 2 || again.Checkpoint == "" {
		t.Fatalf("complete after sequencing: %d %s", st, withProofs)
	}
	for i, r := range again.Receipts {
		if !bytes.Equal(r.Body, out.Receipts[i].Body) || r.ID != out.Receipts[i].ID {
			t.Errorf("receipt %d: %s, first %s", i, r.ID, out.Receipts[i].ID)
		}
		if _, err := receipts.Verify(f.env.Server.ReceiptVerifierKey(), f.env.Config.Origin, r.Body, again.Proofs[i], []byte(again.Checkpoint)); err != nil {
			t.Errorf("receipt %s: %v", r.ID, err)
		}
	}
	f.unchanged(t, id, func() {
		st, b := post(t, f.node, path, map[string]any{"lease_token": tok, "wait_for_proofs": true})
		if st != http.StatusOK || !bytes.Equal(b, withProofs) {
			t.Errorf("complete again, waiting: %d\n%s\nwant\n%s", st, b, withProofs)
		}
	})
}

func TestComplete(t *testing.T) {
	t.Parallel()
	f := setup(t, "sqlite")
	completeFlow(t, f)

	t.Run("before accept", func(t *testing.T) {
		id, tok := f.leased(t, "status_check")
		f.unchanged(t, id, func() {
			st, b := post(t, f.node, "/workers/jobs/"+id+"/complete", wire.CompleteRequest{LeaseToken: tok})
			wantErr(t, st, b, http.StatusConflict, wire.CodeInvalidTransition)
		})
	})
	// The nonce is recorded after the handler ran (http.go, signed); a
	// replay still answers as a replay, whatever the handler would say.
	t.Run("accept replayed after complete", func(t *testing.T) {
		id, tok := f.leased(t, "status_check")
		accept := f.node.Request(t, http.MethodPost, "/workers/jobs/"+id+"/accept", wire.TokenRequest{LeaseToken: tok})
		if resp, b := f.env.Raw(t, accept); resp.StatusCode != http.StatusOK {
			t.Fatalf("accept: %d %s", resp.StatusCode, b)
		}
		if st, b := post(t, f.node, "/workers/jobs/"+id+"/complete", wire.CompleteRequest{LeaseToken: tok}); st != http.StatusOK {
			t.Fatalf("complete: %d %s", st, b)
		}
		f.unchanged(t, id, func() {
			resp, b := f.env.Raw(t, accept)
			wantErr(t, resp.StatusCode, b, http.StatusUnauthorized, wire.CodeReplayedNonce)
		})
		// A fresh accept of the same job is the handler's to refuse.
		f.unchanged(t, id, func() {
			st, b := post(t, f.node, "/workers/jobs/"+id+"/accept", wire.TokenRequest{LeaseToken: tok})
			wantErr(t, st, b, http.StatusConflict, wire.CodeInvalidTransition)
		})
	})
	t.Run("invalid", func(t *testing.T) {
		id, tok := f.running(t, "status_check")
		for name, body := range map[string]string{
			"no token":                 `{}`,
			"metrics an array":         `{"lease_token":"` + tok + `","metrics":[1]}`,
			"output_uri number":        `{"lease_token":"` + tok + `","output_uri":5}`,
			"wait_for_proofs a string": `{"lease_token":"` + tok + `","wait_for_proofs":"yes"}`,
		} {
			t.Run(name, func(t *testing.T) {
				f.unchanged(t, id, func() {
					st, b := post(t, f.node, "/workers/jobs/"+id+"/complete", body)
					wantErr(t, st, b, http.StatusBadRequest, wire.CodeInvalidRequest)
				})
			})
		}
	})
	t.Run("expired lease", func(t *testing.T) {
		id, tok := f.running(t, "status_check")
		f.env.Clock.Advance(11 * time.Minute)
		if err := f.env.Server.MaintainOnce(context.Background()); err != nil {
			t.Fatal(err)
		}
		f.env.Clock.Advance(-11 * time.Minute)
		f.unchanged(t, id, func() {
			st, b := post(t, f.node, "/workers/jobs/"+id+"/complete", wire.CompleteRequest{LeaseToken: tok})
			wantErr(t, st, b, http.StatusConflict, wire.CodeLeaseLost)
		})
	})
}

func TestFailAndRelease(t *testing.T) {
	t.Parallel()
	f := setup(t, "sqlite")
	t.Run("retryable", func(t *testing.T) {
		id, tok := f.running(t, "status_check")
		n := f.env.Receipts(t)
		st, b := post(t, f.node, "/workers/jobs/"+id+"/fail", map[string]any{
			"lease_token": tok, "error_code": "oom", "message": "out of memory", "payload": map[string]any{"vram": 1}, "retryable": true,
		})
		if st != http.StatusOK {
			t.Fatalf("fail: %d %s", st, b)
		}
		m := asMap(t, b)
		wantKeys(t, "fail", m, "job", "requeued", "receipt_id")
		out := decode[wire.FailResponse](t, b)
		if !out.Requeued || out.Job.State != "queued" || out.Job.Attempt != 2 || out.Job.ReceiptID != nil {
			t.Errorf("fail answer %s", b)
		}
		if f.env.Receipts(t) != n+1 {
			t.Errorf("no job_failed receipt")
		}
		r := receiptOf(t, f.env, out.ReceiptID)
		if r.Kind != receipts.KindJobFailed || r.Outcome != receipts.OutcomeRequeued || r.ErrorCode != "oom" || r.Attempt != 1 ||
			r.PayloadSHA256 == "" || r.StartedAt.IsZero() {
			t.Errorf("receipt %+v", r)
		}
		// The lease is gone.
		f.unchanged(t, id, func() {
			st, b := post(t, f.node, "/workers/jobs/"+id+"/fail", wire.FailRequest{LeaseToken: tok, ErrorCode: "oom"})
			wantErr(t, st, b, http.StatusConflict, wire.CodeLeaseLost)
		})
	})
	t.Run("not retryable", func(t *testing.T) {
		id, tok := f.running(t, "status_check")
		_, b := post(t, f.node, "/workers/jobs/"+id+"/fail", wire.FailRequest{LeaseToken: tok, ErrorCode: "bad_input"})
		out := decode[wire.FailResponse](t, b)
		if out.Requeued || out.Job.State != "failed" || out.Job.ReceiptID == nil || *out.Job.ReceiptID != out.ReceiptID {
			t.Errorf("fail answer %s", b)
		}
	})
	t.Run("no error_code", func(t *testing.T) {
		// error_code is optional, as in the v0.2 contract.
		id, tok := f.running(t, "status_check")
		_, b := post(t, f.node, "/workers/jobs/"+id+"/fail", `{"lease_token":"`+tok+`","message":"gave up"}`)
		out := decode[wire.FailResponse](t, b)
		if out.Job.State != "failed" || out.Job.LastError == nil || out.Job.LastError.Code != "unspecified" {
			t.Errorf("fail without error_code: %s", b)
		}
	})
	t.Run("canceled", func(t *testing.T) {
		id, tok := f.running(t, "status_check")
		if _, err := f.env.Server.Leases().Cancel(context.Background(), id); err != nil {
			t.Fatal(err)
		}
		_, b := post(t, f.node, "/workers/jobs/"+id+"/fail", wire.FailRequest{LeaseToken: tok, ErrorCode: "canceled", Retryable: true})
		out := decode[wire.FailResponse](t, b)
		if out.Requeued || out.Job.State != "canceled" || receiptOf(t, f.env, out.ReceiptID).Outcome != receipts.OutcomeCanceled {
			t.Errorf("fail answer %s", b)
		}
	})
	t.Run("invalid", func(t *testing.T) {
		id, tok := f.running(t, "status_check")
		for name, body := range map[string]string{
			"retryable a string": `{"lease_token":"` + tok + `","error_code":"x","retryable":"yes"}`,
			"payload a number":   `{"lease_token":"` + tok + `","error_code":"x","payload":1}`,
		} {
			t.Run(name, func(t *testing.T) {
				t.Parallel()
				f.unchanged(t, id, func() {
					st, b := post(t, f.node, "/workers/jobs/"+id+"/fail", body)
					wantErr(t, st, b, http.StatusBadRequest, wire.CodeInvalidRequest)
				})
			})
		}
	})
	t.Run("release", func(t *testing.T) {
		id, tok := f.running(t, "telemetry_sync")
		n := f.env.Receipts(t)
		st, b := post(t, f.node, "/workers/jobs/"+id+"/release", map[string]any{"lease_token": tok, "reason": "spot preemption"})
		if st != http.StatusOK {
			t.Fatalf("release: %d %s", st, b)
		}
		wantKeys(t, "release", asMap(t, b), "job")
		out := decode[wire.JobResponse](t, b)
		if out.Job.State != "queued" || out.Job.Attempt != 1 {
			t.Errorf("release answer %s", b)
		}
		if got := f.env.Receipts(t); got != n+1 {
			t.Errorf("release minted %d receipts, want 1", got-n)
		}
		f.unchanged(t, id, func() {
			st, b := post(t, f.node, "/workers/jobs/"+id+"/release", wire.ReleaseRequest{LeaseToken: tok})
			wantErr(t, st, b, http.StatusConflict, wire.CodeLeaseLost)
		})
		// It is leasable again at once.
		_, b = post(t, f.node, "/workers/jobs/lease", wire.LeaseRequest{SupportedJobTypes: []string{"telemetry_sync"}})
		if lr := decode[wire.LeaseResponse](t, b); lr.Job == nil || lr.Job.ID != id {
			t.Errorf("lease after release: %s", b)
		}
	})
}

func TestAudit(t *testing.T) {
	t.Parallel()
	f := setup(t, "sqlite")
	n := f.env.Receipts(t)
	at := time.Date(2026, 11, 30, 9, 0, 0, 0, time.UTC)
	st, b := post(t, f.node, "/workers/audit", map[string]any{"events": []map[string]any{
		{"event_type": "driver_update", "message": "550 -> 560", "payload": map[string]any{"from": "550"}, "occurred_at": at},
		{"event_type": "reboot", "occurred_at": at},
	}})
	if st != http.StatusCreated {
		t.Fatalf("audit: %d %s", st, b)
	}
	wantKeys(t, "audit", asMap(t, b), "receipt_ids")
	out := decode[wire.AuditResponse](t, b)
	if len(out.ReceiptIDs) != 2 || f.env.Receipts(t) != n+2 {
		t.Fatalf("audit answer %s", b)
	}
	r := receiptOf(t, f.env, out.ReceiptIDs[0])
	want, _ := receipts.PayloadSHA256(json.RawMessage(`{"from":"550"}`))
	if r.Kind != receipts.KindNodeAudit || r.EventType != "driver_update" || !r.OccurredAt.Equal(at) || r.PayloadSHA256 != want ||
		r.WorkerID != f.node.WorkerID || r.NodeID != f.node.NodeID {
		t.Errorf("receipt %+v", r)
	}

	events := func(n int) string {
		evs := make([]string, n)
		for i := range evs {
			evs[i] = `{"event_type":"e","occurred_at":"2026-11-30T09:00:00Z"}`
		}
		return `{"events":[` + strings.Join(evs, ",") + `]}`
	}
	if st, b := post(t, f.node, "/workers/audit", events(100)); st != http.StatusCreated {
		t.Errorf("100 events: %d %s", st, b)
	}
	for name, body := range map[string]string{
		"no events":       `{"events":[]}`,
		"101 events":      events(101),
		"no event_type":   `{"events":[{"occurred_at":"2026-11-30T09:00:00Z"}]}`,
		"no occurred_at":  `{"events":[{"event_type":"e"}]}`,
		"bad occurred_at": `{"events":[{"event_type":"e","occurred_at":"yesterday"}]}`,
		"payload array":   `{"events":[{"event_type":"e","occurred_at":"2026-11-30T09:00:00Z","payload":[]}]}`,
	} {
		t.Run(name, func(t *testing.T) {
			f.unchanged(t, "", func() {
				st, b := post(t, f.node, "/workers/audit", body)
				wantErr(t, st, b, http.StatusBadRequest, wire.CodeInvalidRequest)
			})
		})
	}
	t.Run("wrong scope", func(t *testing.T) {
		tok, _, err := f.env.Server.Issuer().Mint(context.Background(), f.node.WorkerID, []credential.Scope{credential.ScopeNodeHeartbeat}, time.Hour)
		if err != nil {
			t.Fatal(err)
		}
		r := f.node.Request(t, http.MethodPost, "/workers/audit", events(1))
		r.Header.Set("Authorization", "Bearer "+tok)
		f.unchanged(t, "", func() {
			resp, b := f.env.Raw(t, r)
			wantErr(t, resp.StatusCode, b, http.StatusForbidden, wire.CodeInsufficientScope)
		})
	})
}

// recorder records hook events.
type recorder struct {
	mu       sync.Mutex
	changes  []workerapi.JobEvent
	receipts []receipts.Stored
}

func (r *recorder) JobChanged(_ context.Context, e workerapi.JobEvent) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.changes = append(r.changes, e)
}

func (r *recorder) ReceiptMinted(_ context.Context, s receipts.Stored) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.receipts = append(r.receipts, s)
}

func TestHooks(t *testing.T) {
	t.Parallel()
	rec := &recorder{}
	f := setup(t, "sqlite", apitest.Started(), apitest.WithConfig(func(c *workerapi.Config) { c.Hooks = rec }))
	id, tok := f.running(t, "status_check")
	if st, b := post(t, f.node, "/workers/jobs/"+id+"/artifacts", wire.ArtifactRequest{
		LeaseToken: tok, ArtifactType: "log", Name: "n", URI: "u", ChecksumSHA256: ptr(strings.Repeat("0", 64)), SizeBytes: ptr(int64(1)),
	}); st != http.StatusCreated {
		t.Fatalf("%d %s", st, b)
	}
	if st, b := post(t, f.node, "/workers/jobs/"+id+"/complete", wire.CompleteRequest{LeaseToken: tok}); st != http.StatusOK {
		t.Fatalf("%d %s", st, b)
	}
	waitfor.Until(t, "the hooks to hear 3 job changes and 4 receipts", func() bool {
		rec.mu.Lock()
		defer rec.mu.Unlock()
		return len(rec.changes) >= 3 && len(rec.receipts) >= 4
	})
	rec.mu.Lock()
	defer rec.mu.Unlock()
	var trans []string
	for _, c := range rec.changes {
		if c.Job.ID == id {
			trans = append(trans, string(c.From)+">"+string(c.Job.State))
		}
	}
	// queued>leased (lease), leased>running (accept), running>succeeded (complete).
	if want := []string{"queued>leased", "leased>running", "running>succeeded"}; !slices.Equal(trans, want) {
		t.Errorf("job changes %v, want %v", trans, want)
	}
	last := rec.changes[len(rec.changes)-1]
	if len(last.Artifacts) != 1 || last.Job.ReceiptID == "" {
		t.Errorf("terminal event %+v", last)
	}
	var kinds []receipts.Kind
	for _, r := range rec.receipts {
		kinds = append(kinds, r.Kind)
	}
	// worker_registered, artifact_reported, job_completed, job_charged.
	if want := []receipts.Kind{receipts.KindWorkerRegistered, receipts.KindArtifactReported, receipts.KindJobCompleted, receipts.KindJobCharged}; !slices.Equal(kinds, want) {
		t.Errorf("receipts %v, want %v", kinds, want)
	}
}

func ptr[T any](v T) *T { return &v }

// TestWorkerFlow runs the main flows on every dialect, across two
// replicas of one database.
func TestWorkerFlow(t *testing.T) {
	t.Parallel()
	for _, d := range testdb.Dialects() {
		t.Run(d.Name, func(t *testing.T) {
			t.Parallel()
			f := setup(t, d.Name)
			other := f.env.Replica(t)
			// The node registered on one replica works on the other.
			on := f.node.On(other)
			if st, b := post(t, on, "/workers/heartbeat", wire.HeartbeatRequest{Status: "idle"}); st != http.StatusOK {
				t.Fatalf("heartbeat on the replica: %d %s", st, b)
			}
			// A nonce used on one replica is refused on the other.
			r := f.node.Request(t, http.MethodPost, "/workers/heartbeat", wire.HeartbeatRequest{Status: "idle"})
			if resp, b := f.env.Raw(t, r); resp.StatusCode != http.StatusOK {
				t.Fatalf("heartbeat: %d %s", resp.StatusCode, b)
			}
			// Sent to the other replica for the same authority, as a load
			// balancer would.
			again := r.Clone(context.Background())
			u, err := url.Parse(other.URL + r.URL.Path)
			if err != nil {
				t.Fatal(err)
			}
			again.URL, again.Host = u, r.URL.Host
			resp, b := other.Raw(t, again)
			wantErr(t, resp.StatusCode, b, http.StatusUnauthorized, wire.CodeReplayedNonce)

			completeFlow(t, f)

			id, tok := f.running(t, "status_check")
			if st, b := post(t, on, "/workers/jobs/"+id+"/logs", wire.LogsRequest{LeaseToken: tok, Entries: []wire.LogEntry{{Seq: 1, Message: "m"}}}); st != http.StatusOK {
				t.Errorf("logs on the replica: %d %s", st, b)
			}
			_, b = post(t, f.node, "/workers/jobs/"+id+"/fail", wire.FailRequest{LeaseToken: tok, ErrorCode: "oom", Retryable: true})
			if out := decode[wire.FailResponse](t, b); !out.Requeued {
				t.Errorf("fail: %s", b)
			}

			// A long-poll on one replica wakes when the other dispatches.
			done := make(chan []byte)
			go func() {
				resp, b := on.Do(t, http.MethodPost, "/workers/jobs/lease", wire.LeaseRequest{SupportedJobTypes: []string{"telemetry_sync"}, WaitSeconds: 20})
				if resp.StatusCode != http.StatusOK {
					t.Errorf("long-poll: %d %s", resp.StatusCode, b)
				}
				done <- b
			}()
			other.AwaitLongPolls(t, 1)
			j, _, _, err := f.env.Server.Dispatch(context.Background(), lease.NewJob{Type: "telemetry_sync"})
			if err != nil {
				t.Fatal(err)
			}
			b = waitfor.Receive(t, "the long-poll's answer", done)
			if lr := decode[wire.LeaseResponse](t, b); lr.Job == nil || lr.Job.ID != j.ID {
				t.Errorf("long-poll answer %s", b)
			}

			audit := `{"events":[{"event_type":"e","occurred_at":"2026-11-30T09:00:00Z"}]}`
			if st, b := post(t, on, "/workers/audit", audit); st != http.StatusCreated {
				t.Errorf("audit: %d %s", st, b)
			}
		})
	}
}
