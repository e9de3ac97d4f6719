package workerapi_test

import (
	"bufio"
	"context"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"

	"github.com/nodelane/nodelane/internal/apitest"
	"github.com/nodelane/nodelane/internal/testdb"
	"github.com/nodelane/nodelane/internal/waitfor"
	"github.com/nodelane/nodelane/lease"
	"github.com/nodelane/nodelane/workerapi"
	"github.com/nodelane/nodelane/workerapi/wire"
)

// parkLongPolls opens n lease long-polls of node (60 s, for a type that
// is blocked until the runtime is activated) that end with the test, and waits until the Server holds want
// long-polls in all.
func parkLongPolls(t *testing.T, env *apitest.Env, node *apitest.Node, n, want int) {
	t.Helper()
	ctx, cancel := context.WithCancel(t.Context())
	var wg sync.WaitGroup
	t.Cleanup(wg.Wait)
	t.Cleanup(cancel)
	for range n {
		req := node.Request(t, http.MethodPost, wire.PathLease, wire.LeaseRequest{
			SupportedJobTypes: []string{"lora_train"}, MaxJobs: 1, WaitSeconds: wire.MaxWaitSeconds,
		}).WithContext(ctx)
		wg.Go(func() {
			if resp, err := http.DefaultClient.Do(req); err == nil {
				resp.Body.Close()
			}
		})
	}
	env.AwaitLongPolls(t, want)
}

// One node cannot hold every long-poll (issue 29: 520 lease long-polls of
// one node took every connection of -max-conns): past its
// Shares.LongPollsPerNode, a lease or signals long-poll of the node is
// refused 429 too_many_long_polls with Retry-After before it does
// anything (a job it would have leased stays queued), while another
// node's long-poll is admitted and a request that does not wait is
// answered. Once one of its long-polls ends, the node may open another.
func TestLongPollsPerNode(t *testing.T) {
	t.Parallel()
	for _, d := range testdb.Dialects() {
		t.Run(d.Name, func(t *testing.T) {
			t.Parallel()
			env := apitest.New(t, d.Name, apitest.WithConfig(func(c *workerapi.Config) {
				c.Shares.LongPollsPerNode = 2
			}))
			a, b := env.NewNode(t, "node-a"), env.NewNode(t, "node-b")
			a.Register(t, studioGPU())
			b.Register(t, studioGPU())
			parkLongPolls(t, env, a, 2, 2)

			job := env.Enqueue(t, lease.NewJob{Type: "status_check"})
			for _, rq := range []struct {
				path string
				body any
			}{
				{wire.PathLease, wire.LeaseRequest{SupportedJobTypes: []string{"status_check"}, MaxJobs: 1, WaitSeconds: 30}},
				{wire.PathSignals, wire.SignalsRequest{WaitSeconds: ptr(30)}},
			} {
				resp, body := a.Do(t, http.MethodPost, rq.path, rq.body)
				if resp.StatusCode != http.StatusTooManyRequests || resp.Header.Get("Retry-After") == "" ||
					decode[wire.ErrorBody](t, body).Error.Code != wire.CodeTooManyLongPolls {
					t.Fatalf("%s: a third long-poll of node-a: %d Retry-After %q %s, want 429 too_many_long_polls with Retry-After",
						rq.path, resp.StatusCode, resp.Header.Get("Retry-After"), body)
				}
			}
			if got := env.Job(t, job.ID); got.State != lease.StateQueued {
				t.Fatalf("the refused long-poll changed job %s: %s, want queued", job.ID, got.State)
			}
			// A lease that does not wait is no long-poll: it is answered,
			// and leases the job.
			st, body := post(t, a, wire.PathLease, wire.LeaseRequest{SupportedJobTypes: []string{"status_check"}, MaxJobs: 1})
			if st != http.StatusOK || len(decode[wire.LeaseResponse](t, body).Leases) != 1 {
				t.Fatalf("node-a's lease without a wait: %d %s, want 200 with the job", st, body)
			}
			// Another node's long-poll is admitted.
			parkLongPolls(t, env, b, 1, 3)
		})
	}
}

// The long-polls of all nodes together are capped too
// (Shares.LongPolls): past it one more is refused 503 server_busy with
// Retry-After, and it is admitted again once one ends.
func TestLongPollsInAll(t *testing.T) {
	t.Parallel()
	env := apitest.New(t, "sqlite", apitest.WithConfig(func(c *workerapi.Config) {
		c.Shares.LongPollsPerNode, c.Shares.LongPolls = 2, 3
	}))
	a, b := env.NewNode(t, "node-a"), env.NewNode(t, "node-b")
	a.Register(t, studioGPU())
	b.Register(t, studioGPU())
	parkLongPolls(t, env, a, 2, 2)
	ctx, cancel := context.WithCancel(t.Context())
	req := b.Request(t, http.MethodPost, wire.PathSignals, wire.SignalsRequest{WaitSeconds: ptr(wire.MaxSignalsWaitSeconds)}).WithContext(ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		if resp, err := http.DefaultClient.Do(req); err == nil {
			resp.Body.Close()
		}
	}()
	env.AwaitLongPolls(t, 3)
	resp, body := b.Do(t, http.MethodPost, wire.PathSignals, wire.SignalsRequest{WaitSeconds: ptr(10)})
	if resp.StatusCode != http.StatusServiceUnavailable || resp.Header.Get("Retry-After") == "" ||
		decode[wire.ErrorBody](t, body).Error.Code != wire.CodeServerBusy {
		t.Fatalf("a fourth long-poll: %d %s, want 503 server_busy with Retry-After", resp.StatusCode, body)
	}
	cancel()
	<-done
	env.AwaitLongPolls(t, 2)
	ctx2, cancel2 := context.WithCancel(t.Context())
	defer cancel2()
	req = b.Request(t, http.MethodPost, wire.PathSignals, wire.SignalsRequest{WaitSeconds: ptr(wire.MaxSignalsWaitSeconds)}).WithContext(ctx2)
	done2 := make(chan struct{})
	go func() {
		defer close(done2)
		if resp, err := http.DefaultClient.Do(req); err == nil {
			resp.Body.Close()
		}
	}()
	env.AwaitLongPolls(t, 3)
	cancel2()
	<-done2
}

// registerHead writes to a connection of its own the header block of a
// register request with the provisioning token and well-formed signature
// fields, announcing n bytes of body, and returns the connection.
func registerHead(t *testing.T, env *apitest.Env, n int) net.Conn {
	t.Helper()
	conn, err := net.Dial("tcp", strings.TrimPrefix(env.URL, "http://"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	req := env.NewNode(t, "node-x").Request(t, http.MethodPost, wire.PathRegister, studioGPU())
	req.Header.Set("Authorization", "Bearer "+env.ProvisioningToken)
	fmt.Fprintf(conn, "POST %s HTTP/1.1\r\nHost: %s\r\nContent-Length: %d\r\n", wire.PathRegister, req.Host, n)
	if err := req.Header.Write(conn); err != nil {
		t.Fatal(err)
	}
	if _, err := conn.Write([]byte("\r\n")); err != nil {
		t.Fatal(err)
	}
	return conn
}

// holdBody sends a register request (registerHead) whose body is n bytes
// and sends all but the last, and returns the connection, open. The
// Server reserves the n bytes as it starts reading the body
// (Server.BodyBytes).
func holdBody(t *testing.T, env *apitest.Env, n int) net.Conn {
	t.Helper()
	conn := registerHead(t, env, n)
	if _, err := conn.Write([]byte(strings.Repeat(" ", n-1))); err != nil {
		t.Fatal(err)
	}
	return conn
}

// Bodies read after authentication are bounded in total (issue 29: 500
// register requests with the provisioning token, each sending 1 MiB and
// holding the last byte, took the server from 32 to 962 MB): once
// Shares.BodyBytes are reserved by bodies being read, a request with a
// body waits, then is refused 503 server_busy with Retry-After before a
// byte of its body is read, and nothing of it is kept (the node is not
// registered); readiness is answered meanwhile. Once a held body's
// request ends its bytes are given back, and the same request succeeds.
func TestBodyBudget(t *testing.T) {
	t.Parallel()
	const limit = 64 << 10
	for _, d := range testdb.Dialects() {
		t.Run(d.Name, func(t *testing.T) {
			t.Parallel()
			env := apitest.New(t, d.Name, apitest.WithConfig(func(c *workerapi.Config) {
				c.BodyLimit, c.Shares.BodyBytes = limit, 2*limit
			}))
			hog := holdBody(t, env, limit)
			holdBody(t, env, limit)
			waitfor.Until(t, "two bodies' bytes reserved", func() bool { return env.Server.BodyBytes() == 2*limit })

			// Headers only: the answer comes without a byte of the body.
			conn := registerHead(t, env, 100)
			resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
			if err != nil {
				t.Fatal(err)
			}
			resp.Body.Close()
			if resp.StatusCode != http.StatusServiceUnavailable || resp.Header.Get("Retry-After") == "" {
				t.Fatalf("a body past the budget: %d Retry-After %q, want 503 with Retry-After, before the body", resp.StatusCode, resp.Header.Get("Retry-After"))
			}

			c := env.NewNode(t, "node-c")
			r := c.Request(t, http.MethodPost, wire.PathRegister, func() wire.RegisterRequest {
				req := studioGPU()
				req.NodeID, req.PublicKey = c.NodeID, c.PublicKey
				return req
			}())
			r.Header.Set("Authorization", "Bearer "+env.ProvisioningToken)
			resp, body := env.Raw(t, r)
			if resp.StatusCode != http.StatusServiceUnavailable || decode[wire.ErrorBody](t, body).Error.Code != wire.CodeServerBusy {
				t.Fatalf("a register past the budget: %d %s, want 503 server_busy", resp.StatusCode, body)
			}
			if st, body := env.Operator(t, http.MethodGet, "/operator/workers", nil); st != http.StatusOK || strings.Contains(string(body), "node-c") {
				t.Fatalf("after the refused register: %d %s, want no node-c", st, body)
			}
			ready := httptest.NewServer(env.Server.ReadyHandler())
			defer ready.Close()
			rr, err := http.Get(ready.URL)
			if err != nil {
				t.Fatal(err)
			}
			rr.Body.Close()
			if rr.StatusCode != http.StatusOK {
				t.Errorf("readiness while the budget is spent: %d, want 200", rr.StatusCode)
			}

			hog.Close()
			waitfor.Until(t, "the closed body's bytes given back", func() bool { return env.Server.BodyBytes() == limit })
			c.Register(t, studioGPU())
		})
	}
}

func TestSharesConfig(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name string
		sh   workerapi.Shares
		want string
	}{
		{"negative body bytes", workerapi.Shares{BodyBytes: -1}, "Shares.BodyBytes"},
		{"under the body limit", workerapi.Shares{BodyBytes: workerapi.DefaultBodyLimit - 1}, "BodyLimit"},
		{"negative per node", workerapi.Shares{LongPollsPerNode: -1}, "Shares.LongPollsPerNode"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			_, err := tc.sh.WithDefaults(workerapi.DefaultBodyLimit)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("WithDefaults: %v, want an error naming %s", err, tc.want)
			}
		})
	}
	sh, err := workerapi.Shares{LongPolls: -1}.WithDefaults(workerapi.DefaultBodyLimit)
	if err != nil || sh.BodyBytes != workerapi.DefaultBodyBytes || sh.LongPollsPerNode != workerapi.DefaultLongPollsPerNode || sh.LongPolls != -1 {
		t.Errorf("WithDefaults: %+v %v", sh, err)
	}
}
