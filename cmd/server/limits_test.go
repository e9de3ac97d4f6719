package main

import (
	"flag"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nodelane/nodelane/internal/apitest"
	"github.com/nodelane/nodelane/workerapi"
	"github.com/nodelane/nodelane/workerapi/wire"
)

func parseLimits(t *testing.T, args ...string) *httpLimits {
	t.Helper()
	fs := flag.NewFlagSet("server", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	hl := httpLimitFlags(fs)
	if err := fs.Parse(args); err != nil {
		t.Fatal(err)
	}
	return hl
}

// The probes find a connection whatever one node's long-polls hold
// (issue 29: 520 lease long-polls of one node took every connection of
// -max-conns 512, and /healthz timed out after 70 s). With -max-conns 4
// and -max-long-polls-per-node 2, a node that opens 10 long-polls holds 2
// and is refused the others 429 with Retry-After; another node's
// long-poll is admitted up to the cap of all long-polls (three quarters
// of -max-conns: 3), one more is 503; and GET /healthz is answered
// meanwhile.
func TestProbesWhileLongPollsHoldTheirShare(t *testing.T) {
	t.Parallel()
	hl := parseLimits(t, "-max-conns", "4", "-max-long-polls-per-node", "2")
	if err := hl.check(); err != nil {
		t.Fatal(err)
	}
	env := apitest.New(t, "sqlite", apitest.WithConfig(func(c *workerapi.Config) { c.Shares = hl.shares() }))
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	api := env.Server.Handler()
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/healthz" {
			w.WriteHeader(http.StatusOK)
			return
		}
		api.ServeHTTP(w, r)
	})}
	hl.apply(srv)
	go srv.Serve(limitListener(ln, hl.maxConns))
	t.Cleanup(func() { srv.Close() })

	// send sends a signed request of node on a connection of its own, to
	// srv (the signature covers the Host the node signed, which it keeps).
	send := func(n *apitest.Node, path string, body any) (*http.Response, error) {
		req := n.Request(t, http.MethodPost, path, body).WithContext(t.Context())
		req.URL.Host = ln.Addr().String()
		c := &http.Client{Transport: &http.Transport{DisableKeepAlives: true}}
		resp, err := c.Do(req)
		if err == nil {
			resp.Body.Close()
		}
		return resp, err
	}
	poll := wire.LeaseRequest{SupportedJobTypes: []string{"status_check"}, MaxJobs: 1, WaitSeconds: wire.MaxWaitSeconds}
	a, b, c := env.NewNode(t, "node-a"), env.NewNode(t, "node-b"), env.NewNode(t, "node-c")
	for _, n := range []*apitest.Node{a, b, c} {
		n.Register(t, wire.RegisterRequest{Name: n.NodeID, Hostname: "h", Role: "local_gpu_compute",
			Capabilities: wire.Capabilities{JobTypes: []string{"status_check"}}, Version: "1", HeartbeatIntervalSeconds: 30})
	}

	var (
		wg      sync.WaitGroup
		mu      sync.Mutex
		refused int
	)
	t.Cleanup(wg.Wait) // after srv.Close ends the long-polls
	for range 10 {
		wg.Go(func() {
			resp, err := send(a, wire.PathLease, poll)
			if err == nil && resp.StatusCode == http.StatusTooManyRequests && resp.Header.Get("Retry-After") != "" {
				mu.Lock()
				refused++
				mu.Unlock()
			}
		})
	}
	env.AwaitLongPolls(t, 2)
	wg.Go(func() { send(b, wire.PathLease, poll) })
	env.AwaitLongPolls(t, 3)
	resp, err := send(c, wire.PathLease, poll)
	if err != nil || resp.StatusCode != http.StatusServiceUnavailable {
		t.Errorf("a long-poll past the cap of all: %v %v, want 503", resp, err)
	}

	hc := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{DisableKeepAlives: true}}
	hr, err := hc.Get("http://" + ln.Addr().String() + "/healthz")
	if err != nil {
		t.Fatalf("GET /healthz while the nodes hold their long-polls: %v", err)
	}
	hr.Body.Close()
	if hr.StatusCode != http.StatusOK {
		t.Fatalf("GET /healthz: %d", hr.StatusCode)
	}
	mu.Lock()
	defer mu.Unlock()
	if refused != 8 {
		t.Errorf("%d of node-a's 8 long-polls past its 2 were refused 429 with Retry-After, want all", refused)
	}
}

func TestSharesFlags(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		args []string
		want workerapi.Shares
	}{
		{nil, workerapi.Shares{BodyBytes: workerapi.DefaultBodyBytes, LongPollsPerNode: workerapi.DefaultLongPollsPerNode, LongPolls: 384}},
		{[]string{"-max-conns", "0"}, workerapi.Shares{BodyBytes: workerapi.DefaultBodyBytes, LongPollsPerNode: workerapi.DefaultLongPollsPerNode, LongPolls: -1}},
		{[]string{"-max-long-polls", "100", "-max-long-polls-per-node", "8", "-body-budget", "2097152"}, workerapi.Shares{BodyBytes: 2 << 20, LongPollsPerNode: 8, LongPolls: 100}},
	} {
		hl := parseLimits(t, tc.args...)
		if err := hl.check(); err != nil {
			t.Errorf("%q: %v", tc.args, err)
		}
		if got := hl.shares(); got != tc.want {
			t.Errorf("%q: shares %+v, want %+v", tc.args, got, tc.want)
		}
	}
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"-max-long-polls", "512"}, "under -max-conns"},
		{[]string{"-max-long-polls", "-1"}, "-max-long-polls must not be negative"},
		{[]string{"-max-long-polls-per-node", "0"}, "-max-long-polls-per-node must be positive"},
		{[]string{"-body-budget", "1000"}, "-body-budget must be at least"},
	} {
		if err := parseLimits(t, tc.args...).check(); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%q: %v, want an error about %s", tc.args, err, tc.want)
		}
	}
}
