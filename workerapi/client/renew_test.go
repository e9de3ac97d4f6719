package client_test

import (
	"context"
	"net/http"
	"path/filepath"
	"testing"
	"time"

	"github.com/nodelane/nodelane/credential"
	"github.com/nodelane/nodelane/internal/apitest"
	"github.com/nodelane/nodelane/internal/waitfor"
	"github.com/nodelane/nodelane/lease"
	"github.com/nodelane/nodelane/workerapi/client"
	"github.com/nodelane/nodelane/workerapi/wire"
)

// TestClientRenewsWithoutProvisioningToken checks that a node registered once, whose
// provisioning token was then revoked and is not given to its Runner,
// renews its worker token itself (POST /workers/token) and works past the
// first token's expiry.
func TestClientRenewsWithoutProvisioningToken(t *testing.T) {
	t.Parallel()
	p := newClProxy(t)
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "id.json")
	id, err := client.LoadOrCreateIdentity(path)
	if err != nil {
		t.Fatal(err)
	}
	// Days pass for the node too: its clock is the server's (a client
	// follows a server clock that jumps by at most MaxClockOffset).
	c, err := client.New(p.URL, &client.Config{Identity: id, RetryBase: 10 * time.Millisecond, RetryMax: 100 * time.Millisecond,
		Now: p.env.Clock.Now})
	if err != nil {
		t.Fatal(err)
	}
	prov, provID := p.env.Credential(t, apitest.ProvisionerID, credential.ScopeNodeRegister)
	if _, err := c.Register(ctx, prov, clRegistration("node-self-renew")); err != nil {
		t.Fatal(err)
	}
	// The provisioning token is gone from the box, and dead on the server.
	if _, err := p.env.Server.Issuer().Revoke(ctx, provID); err != nil {
		t.Fatal(err)
	}
	first, firstExp := id.Token(), id.TokenExpiresAt()

	w, err := client.NewRunner(c, &client.RunnerConfig{
		MaxConcurrent: 1, WaitSeconds: 1, IdlePoll: 100 * time.Millisecond,
		HeartbeatInterval: 100 * time.Millisecond, DrainTimeout: time.Second, DrainGrace: time.Second,
	})
	if err != nil {
		t.Fatal(err)
	}
	w.Handle("status_check", func(context.Context, *wire.Job, *client.Reporter) error { return nil })
	wctx, cancel := context.WithCancel(ctx)
	stopped := make(chan error, 1)
	go func() { stopped <- w.Run(wctx) }()
	t.Cleanup(func() {
		cancel()
		select {
		case <-stopped:
		case <-time.After(20 * time.Second):
			t.Error("the worker did not stop")
		}
	})

	p.reset()
	p.env.Clock.Advance(28 * 24 * time.Hour) // 2 days before the token expires: due
	waitfor.Until(t, "the token to be renewed", func() bool { return id.Token() != first })
	if !id.TokenExpiresAt().After(firstExp) {
		t.Errorf("renewed token expires %v, not after %v", id.TokenExpiresAt(), firstExp)
	}
	if got := p.requests(wire.PathToken); len(got) == 0 || got[len(got)-1].status != http.StatusOK {
		t.Errorf("renewal requests %+v, want a 200", got)
	}
	if regs := p.requests(wire.PathRegister); len(regs) != 0 {
		t.Errorf("the worker registered again (%+v): it should renew with its key", regs)
	}
	reload, err := client.LoadOrCreateIdentity(path)
	if err != nil {
		t.Fatal(err)
	}
	if reload.Token() != id.Token() || !reload.TokenExpiresAt().Equal(id.TokenExpiresAt()) || reload.WorkerID() != id.WorkerID() {
		t.Errorf("the identity file does not hold the renewed token")
	}

	// Past the first token's expiry the worker works on.
	p.env.Clock.Advance(3 * 24 * time.Hour)
	p.reset()
	waitfor.Until(t, "two heartbeats answered 200 after the first token expired", func() bool { return p.okHeartbeats() >= 2 })
	j := p.env.Enqueue(t, lease.NewJob{Type: "status_check"})
	waitfor.Until(t, "the job to succeed after the renewal", func() bool {
		return p.env.Job(t, j.ID).State == lease.StateSucceeded
	})
}

// TestClientRenewTokenAnswerLost checks that, when the answer to a renewal is
// lost after the server renewed, the client's retry, with the old token, gets the
// first answer: the token the server minted then, and no other.
func TestClientRenewTokenAnswerLost(t *testing.T) {
	t.Parallel()
	p := newClProxy(t)
	ctx := context.Background()
	c := newClClient(t, p.URL, nil)
	clRegister(t, p, c, "node-lost")
	old := c.Identity().Token()
	p.inject(clFault{suffix: wire.PathToken, n: 1, status: http.StatusServiceUnavailable, after: true})
	out, err := c.RenewToken(ctx)
	if err != nil {
		t.Fatalf("RenewToken: %v", err)
	}
	if out.WorkerToken == old || c.Identity().Token() != out.WorkerToken || !c.Identity().TokenExpiresAt().Equal(out.TokenExpiresAt) {
		t.Fatalf("the identity does not hold the renewed token")
	}
	got := p.requests(wire.PathToken)
	if len(got) != 2 || got[0].status != http.StatusServiceUnavailable || got[1].status != http.StatusOK {
		t.Fatalf("renewal requests %+v, want a lost answer then a 200", got)
	}
	if _, err := c.Heartbeat(ctx, wire.HeartbeatRequest{Status: "idle"}); err != nil {
		t.Fatalf("heartbeat with the renewed token: %v", err)
	}
	// One new token was minted: the old one lives in its grace, and the
	// retry got the first renewal's.
	cs, err := p.env.Server.Issuer().Credentials(ctx, c.Identity().WorkerID())
	if err != nil {
		t.Fatal(err)
	}
	live := 0
	for _, cr := range cs {
		if cr.RevokedAt == nil {
			live++
		}
	}
	if len(cs) != 2 || live != 2 {
		t.Errorf("%d credentials, %d not revoked; want 2 (old in its grace, the one renewal) and 2", len(cs), live)
	}
	// A renewal without a token is refused in the client.
	empty := newClClient(t, p.URL, nil)
	if _, err := empty.RenewToken(ctx); err == nil {
		t.Error("RenewToken without a worker token succeeded")
	}
}
