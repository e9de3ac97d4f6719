package operator_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nodelane/nodelane/internal/apitest"
	"github.com/nodelane/nodelane/lease"
	"github.com/nodelane/nodelane/receipts"
	"github.com/nodelane/nodelane/workerapi"
	"github.com/nodelane/nodelane/workerapi/artifacttest"
	"github.com/nodelane/nodelane/workerapi/operator"
	"github.com/nodelane/nodelane/workerapi/wire"
)

// The Client against a real control plane: internal/apitest's Server on
// SQLite, served over loopback HTTP, and, for answers no real server
// gives, small handlers of the tests' own.

// recorder is an http.RoundTripper that sends through
// http.DefaultTransport and notes each request's method and escaped
// path.
type recorder struct {
	mu   sync.Mutex
	seen []string
}

func (r *recorder) RoundTrip(req *http.Request) (*http.Response, error) {
	r.mu.Lock()
	r.seen = append(r.seen, req.Method+" "+req.URL.EscapedPath())
	r.mu.Unlock()
	return http.DefaultTransport.RoundTrip(req)
}

// requests returns the requests noted so far and forgets them.
func (r *recorder) requests() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := r.seen
	r.seen = nil
	return out
}

// fixture is a control plane and a Client of it with the operator token,
// whose requests are recorded.
type fixture struct {
	env   *apitest.Env
	api   *operator.Client
	rec   *recorder
	store *artifacttest.Memory
}

// newFixture starts a control plane (its maintainer running, so receipts
// are sequenced) that prices rtx-4090 at $1.80 per GPU-hour.
func newFixture(t *testing.T) *fixture {
	t.Helper()
	store := artifacttest.NewMemory()
	env := apitest.New(t, "sqlite", apitest.Started(), apitest.WithConfig(func(c *workerapi.Config) {
		c.Prices = receipts.Prices{BySKU: map[string]int64{"rtx-4090": 1_800_000}}
		c.Artifacts.Store = store
	}))
	rec := &recorder{}
	api, err := operator.New(env.URL, env.OperatorToken, &operator.Config{HTTPClient: &http.Client{Transport: rec}})
	if err != nil {
		t.Fatalf("operator.New: %v", err)
	}
	return &fixture{env: env, api: api, rec: rec, store: store}
}

// node registers a worker node with an rtx-4090 that runs status_check
// and lora_train; its signatures follow the Env's clock.
func (f *fixture) node(t *testing.T, name string) *apitest.Node {
	t.Helper()
	n := f.env.NewNode(t, name)
	n.Now = f.env.Clock.Now
	n.Register(t, wire.RegisterRequest{
		Name: name, Hostname: name + ".local", Role: "local_gpu_compute",
		Capabilities:   wire.Capabilities{GPUs: []wire.GPU{{SKU: "rtx-4090", VRAMMB: 24576}}, JobTypes: []string{"status_check", "lora_train"}},
		GovernorLimits: wire.GovernorLimits{MaxJobs: 2, MaxVRAMMB: 24576},
		Version:        "worker/1.0.0", HeartbeatIntervalSeconds: 30,
	})
	return n
}

// run leases the queued job id on n and runs it to success: a status
// event, logs log lines (in batches of at most MaxLogEntries), an
// artifact, and a completion one minute (of the Env's clock) after the
// accept, so that its charge is not 0.
func (f *fixture) run(t *testing.T, n *apitest.Node, id string, logs int) {
	t.Helper()
	l := apitest.Post[wire.LeaseResponse](t, n, wire.PathLease, wire.LeaseRequest{SupportedJobTypes: []string{"status_check", "lora_train"}, SupportedGPUSKUs: []string{"rtx-4090"}, MaxJobs: 1}, http.StatusOK)
	if l.Job == nil || l.Job.ID != id {
		t.Fatalf("lease = %+v, want job %s", l, id)
	}
	tok := *l.LeaseToken
	apitest.Post[wire.AcceptResponse](t, n, wire.JobPath(id, wire.ActionAccept), wire.TokenRequest{LeaseToken: tok}, http.StatusOK)
	apitest.Post[wire.StatusResponse](t, n, wire.JobPath(id, wire.ActionStatus), wire.StatusRequest{LeaseToken: tok, EventType: "progress", Message: "half way"}, http.StatusOK)
	for seq := 1; seq <= logs; {
		var entries []wire.LogEntry
		for ; seq <= logs && len(entries) < wire.MaxLogEntries; seq++ {
			entries = append(entries, wire.LogEntry{Seq: int64(seq), Message: "line " + strings.Repeat("x", seq%7)})
		}
		apitest.Post[wire.LogsResponse](t, n, wire.JobPath(id, wire.ActionLogs), map[string]any{"lease_token": tok, "entries": entries}, http.StatusOK)
	}
	sum := strings.Repeat("ab", 32)
	size := int64(4)
	apitest.Post[wire.ArtifactResponse](t, n, wire.JobPath(id, wire.ActionArtifacts), wire.ArtifactRequest{
		LeaseToken: tok, ArtifactType: "adapter", Name: "adapter.safetensors", URI: "file:///models/adapter.safetensors",
		ChecksumSHA256: &sum, SizeBytes: &size,
	}, http.StatusCreated)
	f.env.Clock.Advance(time.Minute)
	done := apitest.Post[wire.CompleteResponse](t, n, wire.JobPath(id, wire.ActionComplete), wire.CompleteRequest{LeaseToken: tok, Metrics: json.RawMessage(`{"loss":0.12}`)}, http.StatusOK)
	if done.Job.State != "succeeded" {
		t.Fatalf("complete = %+v", done)
	}
}

// stored leases a new job on n and records an artifact of it whose bytes
// are data, stored in two parts, declaring sum as their sha256; it
// returns the artifact's id.
func (f *fixture) stored(t *testing.T, n *apitest.Node, data []byte, sum string) string {
	t.Helper()
	ctx := context.Background()
	j, err := f.env.Server.Leases().Enqueue(ctx, lease.NewJob{Type: "status_check", Requirements: lease.Requirements{GPUSKU: "rtx-4090", GPUCount: 1}})
	if err != nil {
		t.Fatal(err)
	}
	l := apitest.Post[wire.LeaseResponse](t, n, wire.PathLease, wire.LeaseRequest{SupportedJobTypes: []string{"status_check"}, SupportedGPUSKUs: []string{"rtx-4090"}, MaxJobs: 1}, http.StatusOK)
	if l.Job == nil || l.Job.ID != j.ID {
		t.Fatalf("lease = %+v, want job %s", l, j.ID)
	}
	half := int64(len(data)+1) / 2
	prefix := "jobs/" + j.ID + "/u/"
	for i, part := range [][]byte{data[:half], data[half:]} {
		if err := f.store.Put(ctx, fmt.Sprintf("%s%06d", prefix, i+1), bytes.NewReader(part), nil); err != nil {
			t.Fatal(err)
		}
	}
	a, err := f.env.Server.Leases().AddArtifact(ctx, lease.Ref{JobID: j.ID, WorkerID: n.WorkerID, Token: *l.LeaseToken}, lease.Artifact{
		Type: "adapter", Name: "adapter.safetensors", SHA256: sum, SizeBytes: int64(len(data)), Object: prefix, PartSize: half,
	})
	if err != nil {
		t.Fatal(err)
	}
	return a.ID
}
