package main

import (
	"context"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/nodelane/nodelane/internal/apitest"
	"github.com/nodelane/nodelane/workerapi"
)

// host is the host:port of a test server's URL.
func host(t *testing.T, raw string) string {
	t.Helper()
	u, err := url.Parse(raw)
	if err != nil {
		t.Fatal(err)
	}
	return u.Host
}

// TestSlowBodiesAreRefused runs a small attack on a control plane over
// SQLite: 100 connections that announce a 1 MiB body and trickle it,
// without a credential or with an invalid one, are all answered 401 at
// once, before their body, and closed.
func TestSlowBodiesAreRefused(t *testing.T) {
	t.Parallel()
	env := apitest.New(t, "sqlite")
	rep, err := Attack(context.Background(), Config{
		Addr: host(t, env.URL), Conns: 100, BodyLength: 1 << 20,
		Trickle: 200 * time.Millisecond, Duration: 30 * time.Second, OpenWithin: time.Second,
		Memory: func() (Memory, error) { return ReadMemory(os.Getpid()) },
	})
	if err != nil {
		t.Fatal(err)
	}
	var b strings.Builder
	rep.Print(&b)
	t.Logf("\n%s", b.String())
	if rep.Statuses[http.StatusUnauthorized] != 100 || rep.AnsweredClosed != 100 {
		t.Errorf("want 100 connections answered 401 and closed:\n%s", b.String())
	}
	// The answer comes before the body: at most a byte or two of it was
	// sent, far from the 5 the attack's time allows.
	if rep.MaxSent > 2 {
		t.Errorf("a connection sent %d body bytes before its answer", rep.MaxSent)
	}
	if rep.PeakRSS == 0 || rep.Samples == 0 {
		t.Errorf("memory was not read: %+v", rep)
	}
}

// TestSlowHeadersAreClosed checks that a header block trickled past the server's
// ReadHeaderTimeout is closed unanswered.
func TestSlowHeadersAreClosed(t *testing.T) {
	t.Parallel()
	env := apitest.New(t, "sqlite")
	hs := httptest.NewUnstartedServer(env.Server.Handler())
	hs.Config.ReadHeaderTimeout = time.Second
	hs.Start()
	t.Cleanup(hs.Close)
	rep, err := Attack(context.Background(), Config{
		Addr: host(t, hs.URL), Conns: 50, BodyLength: 1 << 20, SlowHeaders: true,
		Trickle: 200 * time.Millisecond, Duration: 30 * time.Second, OpenWithin: time.Second,
	})
	if err != nil {
		t.Fatal(err)
	}
	if rep.ClosedUnanswered != 50 || rep.SlowestSettled > 10*time.Second {
		var b strings.Builder
		rep.Print(&b)
		t.Errorf("want 50 connections closed by the header timeout:\n%s", b.String())
	}
}

func TestBounds(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	for _, tc := range []struct {
		name string
		cfg  Config
		want string
	}{
		{"not loopback", Config{Addr: "192.0.2.1:80", Conns: 1, Trickle: time.Second, Duration: time.Second, BodyLength: 1}, "loopback"},
		{"too many", Config{Addr: "127.0.0.1:1", Conns: maxConns + 1, Trickle: time.Second, Duration: time.Second, BodyLength: 1}, "conns"},
		{"too long", Config{Addr: "127.0.0.1:1", Conns: 1, Trickle: time.Second, Duration: maxDuration + 1, BodyLength: 1}, "duration"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			if _, err := Attack(ctx, tc.cfg); err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("Attack: %v, want an error about %s", err, tc.want)
			}
		})
	}
}

// TestAuthenticatedBodies runs the authenticated-body attack at a small
// scale: 20 register requests with the provisioning token, each sending
// 64 KiB but the last byte, against a budget of 4 such bodies. Those past
// the budget are refused 503 before their body is read; the others are
// cut off by the read timeout; none is left open.
func TestAuthenticatedBodies(t *testing.T) {
	t.Parallel()
	const body = 64 << 10
	env := apitest.New(t, "sqlite", apitest.WithConfig(func(c *workerapi.Config) {
		c.BodyLimit, c.Shares.BodyBytes = body, 4*body
	}))
	hs := httptest.NewUnstartedServer(env.Server.Handler())
	hs.Config.ReadTimeout = 3 * time.Second
	hs.Start()
	t.Cleanup(hs.Close)
	rep, err := Attack(context.Background(), Config{
		Addr: host(t, hs.URL), Conns: 20, BodyLength: body, Attack: AttackAuthenticatedBody, Token: env.ProvisioningToken,
		Trickle: time.Second, Duration: 30 * time.Second, OpenWithin: 500 * time.Millisecond,
	})
	if err != nil {
		t.Fatal(err)
	}
	var b strings.Builder
	rep.Print(&b)
	t.Logf("\n%s", b.String())
	if rep.Open != 0 || rep.Failed != 0 || rep.Statuses[http.StatusServiceUnavailable] < 10 {
		t.Errorf("want every connection settled, most of them 503:\n%s", b.String())
	}
	for st := range rep.Statuses {
		if st < 300 {
			t.Errorf("%d held bodies were answered %d", rep.Statuses[st], st)
		}
	}
}

// TestOneNodeLongPolls runs the long-poll attack at a small scale: one
// node opens 10 lease long-polls against a share of 2; the 8 others are
// refused 429 at once, and the 2 are answered at the end of their wait.
func TestOneNodeLongPolls(t *testing.T) {
	t.Parallel()
	env := apitest.New(t, "sqlite", apitest.WithConfig(func(c *workerapi.Config) {
		c.Shares.LongPollsPerNode, c.MaxWait = 2, 2*time.Second
	}))
	rep, err := Attack(context.Background(), Config{
		Addr: host(t, env.URL), Conns: 10, BodyLength: 1, Attack: AttackLongPoll, Token: env.ProvisioningToken,
		Trickle: time.Second, Duration: 30 * time.Second, OpenWithin: 200 * time.Millisecond,
	})
	if err != nil {
		t.Fatal(err)
	}
	var b strings.Builder
	rep.Print(&b)
	if rep.Statuses[http.StatusTooManyRequests] != 8 || rep.Statuses[http.StatusOK] != 2 || rep.Open != 0 {
		t.Errorf("want 8 long-polls refused 429 and 2 answered 200:\n%s", b.String())
	}
}
