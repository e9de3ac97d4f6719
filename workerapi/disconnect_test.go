package workerapi_test

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/nodelane/nodelane/internal/syncbuf"

	"github.com/nodelane/nodelane/internal/apitest"
	"github.com/nodelane/nodelane/workerapi"
	"github.com/nodelane/nodelane/workerapi/wire"
)

// notifyingMetrics passes each RequestInfo on a channel.
type notifyingMetrics chan workerapi.RequestInfo

func (m notifyingMetrics) ObserveRequest(ri workerapi.RequestInfo) { m <- ri }

// A client that hangs up on a long-poll is logged at INFO and reported to
// Metrics as StatusClientClosedRequest, not as a failure answered 503.
func TestClientDisconnect(t *testing.T) {
	t.Parallel()
	var logs syncbuf.Buffer
	metrics := make(notifyingMetrics, 16)
	env := apitest.New(t, "sqlite", apitest.WithConfig(func(c *workerapi.Config) {
		c.Logger = slog.New(slog.NewJSONHandler(&logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
		c.Metrics = metrics
	}))
	n := env.NewNode(t, "node")
	n.Register(t, studioGPU())
	<-metrics // the registration

	// A server of its own in front of the Server's handler, to know when
	// the long-poll's request has arrived whole.
	arrived := make(chan struct{}, 1)
	h := env.Server.Handler()
	hs := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, err := io.ReadAll(r.Body)
		if err != nil {
			t.Error(err)
			return
		}
		r.Body = io.NopCloser(bytes.NewReader(body))
		arrived <- struct{}{}
		h.ServeHTTP(w, r)
	}))
	defer hs.Close()

	// Nothing is queued: the lease waits its whole wait_seconds.
	req := n.Request(t, http.MethodPost, wire.PathLease, wire.LeaseRequest{MaxJobs: 1, WaitSeconds: wire.MaxWaitSeconds})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	req = req.WithContext(ctx)
	req.URL.Host = strings.TrimPrefix(hs.URL, "http://")
	done := make(chan error, 1)
	go func() {
		resp, err := http.DefaultClient.Do(req)
		if err == nil {
			resp.Body.Close()
		}
		done <- err
	}()
	<-arrived
	cancel()
	if err := <-done; err == nil {
		t.Fatal("the canceled request was answered")
	}
	ri := <-metrics
	if ri.Route != wire.PathLease || ri.Status != workerapi.StatusClientClosedRequest || ri.Code != workerapi.CodeClientClosedRequest {
		t.Fatalf("metrics saw %+v, want status %d", ri, workerapi.StatusClientClosedRequest)
	}
	// The log line comes before the metrics call: it is written by now.
	var found bool
	for _, line := range strings.Split(strings.TrimSpace(logs.String()), "\n") {
		var rec map[string]any
		if err := json.Unmarshal([]byte(line), &rec); err != nil {
			t.Fatalf("log line is not JSON: %s", line)
		}
		if rec["level"] != "INFO" && rec["level"] != "DEBUG" {
			t.Errorf("logged at %v: %s", rec["level"], line)
		}
		if rec["msg"] == "request canceled by its client" {
			found = true
		}
	}
	if !found {
		t.Errorf("no line says the client canceled:\n%s", logs.String())
	}
}
