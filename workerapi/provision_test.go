package workerapi_test

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nodelane/nodelane/internal/apitest"
	"github.com/nodelane/nodelane/workerapi"
	"github.com/nodelane/nodelane/workerapi/wire"
)

// Issue 29: the bootstrap provisioning token is short-lived and limited
// in registrations, which the operator sees; a node mints node_audit
// receipts within a quota per hour, and none while it is pending.

// clockedNode is a new node that signs by env's clock, which the test moves.
func clockedNode(t *testing.T, env *apitest.Env, nodeID string) *apitest.Node {
	t.Helper()
	n := env.NewNode(t, nodeID)
	n.Now = env.Clock.Now
	return n
}

// provisioningView returns the listing of a credential of the
// provisioner, as the operator token sees it.
func provisioningView(t *testing.T, env *apitest.Env, operatorToken, id string) obj {
	t.Helper()
	st, m := opCall(t, env, operatorToken, http.MethodGet, "/operator/credentials?principal="+workerapi.ProvisionerPrincipal, nil)
	if st != http.StatusOK {
		t.Fatalf("listing the provisioner's credentials: %d %v", st, m)
	}
	for _, c := range m["credentials"].([]any) {
		if c := c.(obj); c["credential_id"] == id {
			return c
		}
	}
	t.Fatalf("credential %s is not listed: %v", id, m)
	return nil
}

func TestBootstrapProvisioningToken(t *testing.T) {
	t.Parallel()
	onDialects(t, func(t *testing.T, d string) {
		const limit = 2
		env := newOpEnv(t, d, apitest.WithConfig(func(c *workerapi.Config) { c.ProvisioningRegistrations = limit }))
		ctx := context.Background()
		res, err := env.Server.Bootstrap(ctx)
		if err != nil || !res.Created {
			t.Fatalf("Bootstrap = %+v, %v", res, err)
		}
		for _, c := range []struct {
			id      string
			expires time.Time
			ttl     time.Duration
		}{
			{res.ProvisioningCredentialID, res.ProvisioningExpiresAt, workerapi.DefaultProvisioningTokenTTL},
			{res.OperatorCredentialID, res.ExpiresAt, workerapi.BootstrapTTL},
		} {
			cr, err := env.Server.Issuer().Credential(ctx, c.id)
			if err != nil || cr.ExpiresAt.Sub(cr.CreatedAt) != c.ttl || !cr.ExpiresAt.Equal(c.expires) {
				t.Errorf("credential %s: %+v, %v; want it to live %v, until %v", c.id, cr, err, c.ttl, c.expires)
			}
		}
		v := provisioningView(t, env, res.OperatorToken, res.ProvisioningCredentialID)
		if v["registrations"] != 0.0 || v["max_registrations"] != float64(limit) {
			t.Errorf("listed before any registration: %v", v)
		}

		for i := range limit {
			if st, b := registerWith(t, env.NewNode(t, fmt.Sprintf("boot-%d", i)), res.ProvisioningToken); st != http.StatusCreated {
				t.Fatalf("registration %d: %d %s", i+1, st, b)
			}
		}
		v = provisioningView(t, env, res.OperatorToken, res.ProvisioningCredentialID)
		if v["registrations"] != float64(limit) || v["max_registrations"] != float64(limit) {
			t.Errorf("listed after %d registrations: %v", limit, v)
		}
		before := env.Dump(t)
		st, b := registerWith(t, env.NewNode(t, "one-too-many"), res.ProvisioningToken)
		wantErr(t, st, b, http.StatusUnauthorized, wire.CodeTokenExhausted)
		stateUnchanged(t, env, "a registration past the bootstrap token's limit", before)

		// The operator renews it: a fresh provisioning credential, whose
		// registrations are counted too, without a limit when none is set.
		st, m := opCall(t, env, res.OperatorToken, http.MethodPost, "/operator/credentials", obj{
			"principal": workerapi.ProvisionerPrincipal, "scopes": []string{"node:register"}, "ttl_seconds": 86400,
		})
		if st != http.StatusCreated {
			t.Fatalf("renewing the provisioning token: %d %v", st, m)
		}
		if st, b := registerWith(t, env.NewNode(t, "renewed"), m["token"].(string)); st != http.StatusCreated {
			t.Fatalf("registering with the renewed token: %d %s", st, b)
		}
		if v := provisioningView(t, env, res.OperatorToken, m["credential_id"].(string)); v["registrations"] != 1.0 || v["max_registrations"] != nil {
			t.Errorf("the renewed token listed: %v", v)
		}
	})
}

func TestBootstrapProvisioningTokenExpires(t *testing.T) {
	t.Parallel()
	onDialects(t, func(t *testing.T, d string) {
		env := newOpEnv(t, d)
		res, err := env.Server.Bootstrap(context.Background())
		if err != nil || !res.Created {
			t.Fatalf("Bootstrap = %+v, %v", res, err)
		}
		env.Clock.Advance(workerapi.DefaultProvisioningTokenTTL - time.Second)
		if st, b := registerWith(t, clockedNode(t, env, "on-time"), res.ProvisioningToken); st != http.StatusCreated {
			t.Fatalf("a registration within 24 h: %d %s", st, b)
		}
		if v := provisioningView(t, env, res.OperatorToken, res.ProvisioningCredentialID); v["registrations"] != 1.0 ||
			v["max_registrations"] != float64(workerapi.DefaultProvisioningRegistrations) {
			t.Errorf("listed: %v", v)
		}
		env.Clock.Advance(time.Second)
		before := env.Dump(t)
		st, b := registerWith(t, clockedNode(t, env, "too-late"), res.ProvisioningToken)
		wantErr(t, st, b, http.StatusUnauthorized, wire.CodeTokenExpired)
		stateUnchanged(t, env, "a registration after 24 h", before)
	})
}

// TestProvisioningConfigRefused: New refuses an invalid setting of the
// provisioning token or of the audit quota, naming it.
func TestProvisioningConfigRefused(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct {
		name, want string
		change     func(*workerapi.Config)
	}{
		{"negative ttl", "ProvisioningTokenTTL", func(c *workerapi.Config) { c.ProvisioningTokenTTL = -time.Second }},
		{"negative registrations", "ProvisioningRegistrations", func(c *workerapi.Config) { c.ProvisioningRegistrations = -1 }},
		{"too many registrations", "ProvisioningRegistrations", func(c *workerapi.Config) { c.ProvisioningRegistrations = wire.MaxRegistrations + 1 }},
		{"negative audit quota", "AuditReceiptsPerHour", func(c *workerapi.Config) { c.AuditReceiptsPerHour = -1 }},
		{"audit quota below a batch", "AuditReceiptsPerHour", func(c *workerapi.Config) { c.AuditReceiptsPerHour = wire.MaxAuditEvents - 1 }},
	} {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			st, cfg := sqliteStores(t)
			tt.change(&cfg)
			if _, err := workerapi.New(st, cfg); !errors.Is(err, workerapi.ErrConfig) || !strings.Contains(err.Error(), tt.want) {
				t.Errorf("New: %v, want ErrConfig naming %s", err, tt.want)
			}
		})
	}
}

// auditEvents is an audit request of n events.
func auditEvents(n int) string {
	evs := make([]string, n)
	for i := range evs {
		evs[i] = fmt.Sprintf(`{"event_type":"e","message":"%d","occurred_at":"2026-11-30T09:00:00Z"}`, i)
	}
	return `{"events":[` + strings.Join(evs, ",") + `]}`
}

func TestAuditQuota(t *testing.T) {
	t.Parallel()
	onDialects(t, func(t *testing.T, d string) {
		const quota = wire.MaxAuditEvents + 10
		env := newOpEnv(t, d, apitest.WithConfig(func(c *workerapi.Config) { c.AuditReceiptsPerHour = quota }))
		env.Clock.Set(env.Clock.Now()) // fixed: Retry-After is exact
		node := clockedNode(t, env, "noisy")
		node.Register(t, registerRequest())
		other := clockedNode(t, env, "quiet")
		other.Register(t, registerRequest())
		for _, n := range []int{wire.MaxAuditEvents, 10} {
			if st, b := post(t, node, wire.PathAudit, auditEvents(n)); st != http.StatusCreated {
				t.Fatalf("%d events within the quota: %d %s", n, st, b)
			}
		}
		env.Clock.Advance(time.Hour - 90*time.Second)
		before := env.Dump(t)
		resp, b := node.Do(t, http.MethodPost, wire.PathAudit, auditEvents(1))
		wantErr(t, resp.StatusCode, b, http.StatusTooManyRequests, wire.CodeQuotaExceeded)
		if ra := resp.Header.Get("Retry-After"); ra != "90" {
			t.Errorf("Retry-After %q, want 90 (the hour's end)", ra)
		}
		stateUnchanged(t, env, "an audit past the quota", before)
		// Another node has a quota of its own.
		if st, b := post(t, other, wire.PathAudit, auditEvents(1)); st != http.StatusCreated {
			t.Fatalf("another node's audit: %d %s", st, b)
		}
		// The next hour, the quota is whole again.
		env.Clock.Advance(90 * time.Second)
		if st, b := post(t, node, wire.PathAudit, auditEvents(wire.MaxAuditEvents)); st != http.StatusCreated {
			t.Fatalf("an audit the next hour: %d %s", st, b)
		}
	})
}

func TestAuditPendingNode(t *testing.T) {
	t.Parallel()
	onDialects(t, func(t *testing.T, d string) {
		env := newOpEnv(t, d, apitest.WithConfig(func(c *workerapi.Config) { c.ApproveNodes = true }))
		node := env.NewNode(t, "pending")
		if reg := node.Register(t, registerRequest()); reg.Status != wire.RegisterStatusPending {
			t.Fatalf("register status %q, want pending", reg.Status)
		}
		before := env.Dump(t)
		st, b := post(t, node, wire.PathAudit, auditEvents(1))
		wantErr(t, st, b, http.StatusForbidden, wire.CodeApprovalPending)
		stateUnchanged(t, env, "a pending node's audit", before)
		mustOp(t, env, http.StatusOK, http.MethodPost, "/operator/workers/"+node.WorkerID+"/approve", nil)
		if st, b := post(t, node, wire.PathAudit, auditEvents(1)); st != http.StatusCreated {
			t.Fatalf("the approved node's audit: %d %s", st, b)
		}
	})
}

// TestAuditQuotaReplicas: audits of one node racing through two replicas
// of one database never mint past the node's quota.
func TestAuditQuotaReplicas(t *testing.T) {
	t.Parallel()
	onDialects(t, func(t *testing.T, d string) {
		const quota, events, requests = wire.MaxAuditEvents + 50, 60, 6
		env := newOpEnv(t, d, apitest.WithConfig(func(c *workerapi.Config) { c.AuditReceiptsPerHour = quota }))
		replica := env.Replica(t)
		node := env.NewNode(t, "racer")
		node.Register(t, registerRequest())
		before := env.Receipts(t)
		var (
			wg    sync.WaitGroup
			mu    sync.Mutex
			codes = map[int]int{}
		)
		start := make(chan struct{})
		for i := range requests {
			n := node
			if i%2 == 1 {
				n = node.On(replica)
			}
			wg.Go(func() {
				<-start
				st, _ := post(t, n, wire.PathAudit, auditEvents(events))
				mu.Lock()
				codes[st]++
				mu.Unlock()
			})
		}
		close(start)
		wg.Wait()
		fit := quota / events
		if codes[http.StatusCreated] != fit || codes[http.StatusTooManyRequests] != requests-fit {
			t.Errorf("answers %v, want %d × 201 and %d × 429", codes, fit, requests-fit)
		}
		if n := env.Receipts(t) - before; n != fit*events {
			t.Errorf("%d receipts minted, want %d", n, fit*events)
		}
	})
}
