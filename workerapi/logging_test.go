package workerapi_test

import (
	"encoding/json"
	"log/slog"
	"net/http"
	"regexp"
	"strings"
	"sync"
	"testing"

	"github.com/nodelane/nodelane/internal/syncbuf"

	"github.com/nodelane/nodelane/credential"
	"github.com/nodelane/nodelane/internal/apitest"
	"github.com/nodelane/nodelane/lease"
	"github.com/nodelane/nodelane/workerapi"
	"github.com/nodelane/nodelane/workerapi/wire"
)

type recordedMetrics struct {
	mu   sync.Mutex
	seen []workerapi.RequestInfo
}

func (m *recordedMetrics) ObserveRequest(ri workerapi.RequestInfo) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.seen = append(m.seen, ri)
}

var leaseTokenPattern = regexp.MustCompile(`nll_[0-9A-Za-z]{49}`)

// Requests are logged with their request id and route, refusals with
// their code, and no log line ever holds a credential or lease token;
// the metrics hook sees every request.
func TestLoggingAndMetrics(t *testing.T) {
	t.Parallel()
	var logs syncbuf.Buffer
	metrics := &recordedMetrics{}
	env := apitest.New(t, "sqlite", apitest.WithConfig(func(c *workerapi.Config) {
		c.Logger = slog.New(slog.NewJSONHandler(&logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
		c.Metrics = metrics
	}))
	n := env.NewNode(t, "node")
	reg := n.Register(t, studioGPU())
	job := env.Enqueue(t, lease.NewJob{Type: "status_check"})
	l := nodeCall[wire.LeaseResponse](t, n, "lease", "/workers/jobs/lease", wire.LeaseRequest{MaxJobs: 1}, http.StatusOK)
	tok := *l.LeaseToken
	path := "/workers/jobs/" + job.ID
	nodeCall[wire.AcceptResponse](t, n, "accept", path+"/accept", wire.TokenRequest{LeaseToken: tok}, http.StatusOK)
	nodeCall[wire.CompleteResponse](t, n, "complete", path+"/complete", wire.CompleteRequest{LeaseToken: tok}, http.StatusOK)
	// Refusals that carry tokens in the request.
	resp, body := n.Do(t, http.MethodPost, path+"/fail", wire.FailRequest{LeaseToken: tok, ErrorCode: "late"})
	wantCode(t, "fail after complete", resp.StatusCode, body, http.StatusConflict, wire.CodeInvalidTransition)
	code, body := env.Bearer(t, reg.WorkerToken+"x", http.MethodGet, "/operator/jobs", nil)
	wantCode(t, "a mangled token", code, body, http.StatusUnauthorized, wire.CodeInvalidToken)
	code, _ = env.Operator(t, http.MethodGet, "/operator/jobs/"+job.ID, nil)
	if code != http.StatusOK {
		t.Fatalf("job read: %d", code)
	}

	text := logs.String()
	for _, s := range []string{reg.WorkerToken, env.OperatorToken, env.ProvisioningToken, tok} {
		if strings.Contains(text, s) {
			t.Fatalf("a token appears in the logs")
		}
	}
	if m := credential.TokenPattern.FindString(text); m != "" {
		t.Fatalf("a credential-shaped string appears in the logs: %.8s…", m)
	}
	if m := leaseTokenPattern.FindString(text); m != "" {
		t.Fatalf("a lease-token-shaped string appears in the logs: %.8s…", m)
	}
	// Every request line has a request id and a route; refusals a code.
	var requests, refusals int
	for _, line := range strings.Split(strings.TrimSpace(text), "\n") {
		var rec map[string]any
		if err := json.Unmarshal([]byte(line), &rec); err != nil {
			t.Fatalf("log line is not JSON: %s", line)
		}
		switch rec["msg"] {
		case "request", "request refused":
			requests++
			if id, _ := rec["request_id"].(string); id == "" || rec["route"] == nil || rec["status"] == nil {
				t.Fatalf("request log line without request_id, route or status: %s", line)
			}
			if rec["msg"] == "request refused" {
				refusals++
				if rec["code"] == nil {
					t.Fatalf("refusal without its code: %s", line)
				}
			}
		}
	}
	if requests < 7 || refusals != 2 {
		t.Fatalf("%d request lines and %d refusals logged, want ≥ 7 and 2:\n%s", requests, refusals, text)
	}
	metrics.mu.Lock()
	defer metrics.mu.Unlock()
	if len(metrics.seen) != requests {
		t.Fatalf("metrics saw %d requests, the log %d", len(metrics.seen), requests)
	}
	found := false
	for _, ri := range metrics.seen {
		if ri.Route == "/workers/jobs/{id}/fail" && ri.Status == http.StatusConflict && ri.Code == wire.CodeInvalidTransition {
			found = true
		}
	}
	if !found {
		t.Fatalf("metrics did not see the refused fail: %+v", metrics.seen)
	}
}
