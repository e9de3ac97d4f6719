package workerapi_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"sync"
	"testing"
	"time"

	"github.com/nodelane/nodelane/credential"
	"github.com/nodelane/nodelane/internal/apitest"
	"github.com/nodelane/nodelane/receipts"
	"github.com/nodelane/nodelane/workerapi/wire"
)

// Least privilege for nodes, over real HTTP on every dialect: a ban
// follows the key, provisioning tokens are limited in registrations, and
// a node renews its own token (POST /workers/token).

// registerWith sends a signed registration of n with the bearer token.
func registerWith(t *testing.T, n *apitest.Node, token string) (int, []byte) {
	t.Helper()
	req := registerRequest()
	req.NodeID, req.PublicKey = n.NodeID, n.PublicKey
	r := n.Request(t, http.MethodPost, "/workers/register", req)
	r.Header.Set("Authorization", "Bearer "+token)
	resp, b := n.Raw(t, r)
	return resp.StatusCode, b
}

// sameKey returns a node with n's key under another node id, unregistered.
func sameKey(n *apitest.Node, nodeID string) *apitest.Node {
	c := *n
	c.NodeID, c.Token, c.WorkerID = nodeID, "", ""
	return &c
}

// credentialOf returns the stored credential of a token.
func credentialOf(t *testing.T, env *apitest.Env, token string, scope credential.Scope) *credential.Credential {
	t.Helper()
	_, c, err := env.Server.Issuer().Verify(context.Background(), token, scope)
	if err != nil {
		t.Fatalf("verifying a token: %v", err)
	}
	return c
}

// registeredReceipt returns the worker_registered receipt of a worker.
func registeredReceipt(t *testing.T, env *apitest.Env, workerID string) *receipts.Receipt {
	t.Helper()
	return lastReceipt(t, env, receipts.KindWorkerRegistered, workerID)
}

func TestBanFollowsKey(t *testing.T) {
	t.Parallel()
	onDialects(t, func(t *testing.T, d string) {
		env := apitest.New(t, d)
		node := env.NewNode(t, "gpu-a")
		reg := node.Register(t, registerRequest())
		// A twin registered with the same key before the ban.
		twin := sameKey(node, "gpu-a-twin")
		twin.Register(t, registerRequest())
		st, m := op(t, env, http.MethodPost, "/operator/workers/"+reg.WorkerID+"/ban", obj{"reason": "stolen key"})
		if st != http.StatusOK {
			t.Fatalf("ban: %d %v", st, m)
		}

		// The same key under a new node id: refused before anything is
		// created (worker, principal, credential, receipt).
		again := sameKey(node, "gpu-a-reborn")
		before := env.Dump(t)
		st, b := registerWith(t, again, env.ProvisioningToken)
		wantErr(t, st, b, http.StatusForbidden, wire.CodeWorkerBanned)
		stateUnchanged(t, env, "registering a banned key under a new node id", before)
		// Under its own node id too.
		st, b = registerWith(t, sameKey(node, node.NodeID), env.ProvisioningToken)
		wantErr(t, st, b, http.StatusForbidden, wire.CodeWorkerBanned)
		stateUnchanged(t, env, "registering a banned node again", before)
		// Nor can it renew its token, nor can the twin that holds its key.
		st, b = post(t, node, wire.PathToken, obj{})
		wantErr(t, st, b, http.StatusForbidden, wire.CodeWorkerBanned)
		st, b = post(t, twin, wire.PathToken, obj{})
		wantErr(t, st, b, http.StatusForbidden, wire.CodeWorkerBanned)
		stateUnchanged(t, env, "renewing a banned key's tokens", before)
		// The twin's current token is refused as well: the ban followed
		// the key to it, with a receipt of its own.
		st, b = post(t, twin, wire.PathHeartbeat, wire.HeartbeatRequest{Status: "idle"})
		wantErr(t, st, b, http.StatusForbidden, wire.CodeWorkerBanned)
		if r := lastReceipt(t, env, receipts.KindWorkerBanned, twin.WorkerID); r.Reason != "stolen key" {
			t.Errorf("the twin's ban receipt has reason %q", r.Reason)
		}

		// Another key registers as usual.
		if st, b := registerWith(t, env.NewNode(t, "gpu-b"), env.ProvisioningToken); st != http.StatusCreated {
			t.Fatalf("another key: %d %s", st, b)
		}
		// Unbanned, the key registers under a new node id.
		if st, m := op(t, env, http.MethodPost, "/operator/workers/"+reg.WorkerID+"/unban", nil); st != http.StatusOK {
			t.Fatalf("unban: %d %v", st, m)
		}
		if st, b := registerWith(t, again, env.ProvisioningToken); st != http.StatusCreated {
			t.Fatalf("the unbanned key under a new node id: %d %s", st, b)
		}
		// The unban followed the key too.
		if st, b := post(t, twin, wire.PathHeartbeat, wire.HeartbeatRequest{Status: "idle"}); st != http.StatusOK {
			t.Fatalf("the twin's heartbeat after the unban: %d %s", st, b)
		}
		lastReceipt(t, env, receipts.KindWorkerUnbanned, twin.WorkerID)
	})
}

// lastReceipt returns the last receipt of a kind about a worker.
func lastReceipt(t *testing.T, env *apitest.Env, kind receipts.Kind, workerID string) *receipts.Receipt {
	t.Helper()
	var bodies [][]byte
	if err := env.DB.Bun().NewSelect().Table("nodelane_receipts").Column("body").Order("seq").Scan(context.Background(), &bodies); err != nil {
		t.Fatalf("reading receipts: %v", err)
	}
	var found *receipts.Receipt
	for _, b := range bodies {
		r, err := receipts.Decode(b)
		if err != nil {
			t.Fatalf("receipt %s: %v", b, err)
		}
		if r.Kind == kind && r.WorkerID == workerID {
			found = r
		}
	}
	if found == nil {
		t.Fatalf("no %s receipt of %s", kind, workerID)
	}
	return found
}

// limitedToken mints, over the operator route, a provisioning credential
// limited to max registrations, and returns its token and id.
func limitedToken(t *testing.T, env *apitest.Env, max int64) (string, string) {
	t.Helper()
	// The minting credential holds node:register itself: a credential
	// mints only scopes it holds.
	minter, _ := env.Credential(t, apitest.OperatorID, credential.ScopeOperatorCredentials, credential.ScopeNodeRegister)
	st, m := opCall(t, env, minter, http.MethodPost, "/operator/credentials", obj{
		"principal": apitest.ProvisionerID, "scopes": []string{"node:register"}, "ttl_seconds": 3600, "max_registrations": max,
	})
	if st != http.StatusCreated {
		t.Fatalf("minting a limited provisioning token: %d %v", st, m)
	}
	if m["max_registrations"] != float64(max) {
		t.Errorf("max_registrations = %v, want %d", m["max_registrations"], max)
	}
	return m["token"].(string), m["credential_id"].(string)
}

func TestMaxRegistrations(t *testing.T) {
	t.Parallel()
	onDialects(t, func(t *testing.T, d string) {
		env := apitest.New(t, d)
		tok, id := limitedToken(t, env, 2)
		var workers []string
		for i := range 2 {
			n := env.NewNode(t, fmt.Sprintf("gpu-%d", i))
			st, b := registerWith(t, n, tok)
			if st != http.StatusCreated {
				t.Fatalf("registration %d: %d %s", i+1, st, b)
			}
			workers = append(workers, decode[wire.RegisterResponse](t, b).WorkerID)
		}
		c, err := env.Server.Issuer().Credential(context.Background(), id)
		if err != nil || c.MaxUses != 2 || c.Uses != 2 {
			t.Fatalf("credential after two registrations: %+v, %v", c, err)
		}
		// Every registration names its provisioning credential.
		for _, w := range workers {
			if r := registeredReceipt(t, env, w); r.ProvisioningCredentialID != id || r.CredentialID == "" || r.CredentialID == id {
				t.Errorf("worker_registered of %s: provisioning_credential_id %q (want %s), credential_id %q", w, r.ProvisioningCredentialID, id, r.CredentialID)
			}
		}

		before := env.Dump(t)
		third := env.NewNode(t, "gpu-3")
		st, b := registerWith(t, third, tok)
		wantErr(t, st, b, http.StatusUnauthorized, wire.CodeTokenExhausted)
		// A node it registered cannot use it again either.
		st, b = registerWith(t, sameKey(third, "gpu-0"), tok)
		wantErr(t, st, b, http.StatusUnauthorized, wire.CodeTokenExhausted)
		stateUnchanged(t, env, "registering with a spent provisioning token", before)
		// Another provisioning token still works.
		if st, b = registerWith(t, third, env.ProvisioningToken); st != http.StatusCreated {
			t.Fatalf("with the unlimited token: %d %s", st, b)
		}
		if r := registeredReceipt(t, env, decode[wire.RegisterResponse](t, b).WorkerID); r.ProvisioningCredentialID != credentialOf(t, env, env.ProvisioningToken, credential.ScopeNodeRegister).ID {
			t.Errorf("provisioning_credential_id %q is not the unlimited token's", r.ProvisioningCredentialID)
		}
		// A limit that the operator's token does not name: no limit.
		st, m := op(t, env, http.MethodPost, "/operator/credentials", obj{"principal": apitest.OperatorID, "scopes": []string{"operator:jobs"}})
		if st != http.StatusCreated || m["max_registrations"] != nil {
			t.Errorf("an unlimited credential: %d, max_registrations %v (want null)", st, m["max_registrations"])
		}
		if _, ok := m["max_registrations"]; !ok {
			t.Errorf("the mint answer lacks max_registrations: %v", m)
		}
	})
}

// TestMaxRegistrationsRefused checks that a bad max_registrations is refused, and
// nothing is minted.
func TestMaxRegistrationsRefused(t *testing.T) {
	t.Parallel()
	onDialects(t, func(t *testing.T, d string) {
		env := apitest.New(t, d)
		minter, _ := env.Credential(t, apitest.OperatorID, credential.ScopeOperatorCredentials, credential.ScopeNodeRegister, credential.ScopeOperatorJobs)
		for name, body := range map[string]string{
			"zero":          `{"principal":"` + apitest.ProvisionerID + `","scopes":["node:register"],"max_registrations":0}`,
			"negative":      `{"principal":"` + apitest.ProvisionerID + `","scopes":["node:register"],"max_registrations":-1}`,
			"over the max":  fmt.Sprintf(`{"principal":"%s","scopes":["node:register"],"max_registrations":%d}`, apitest.ProvisionerID, wire.MaxRegistrations+1),
			"fraction":      `{"principal":"` + apitest.ProvisionerID + `","scopes":["node:register"],"max_registrations":1.5}`,
			"string":        `{"principal":"` + apitest.ProvisionerID + `","scopes":["node:register"],"max_registrations":"2"}`,
			"without scope": `{"principal":"` + apitest.OperatorID + `","scopes":["operator:jobs"],"max_registrations":2}`,
		} {
			t.Run(name, func(t *testing.T) {
				t.Parallel()
				before := env.Dump(t)
				st, m := opCall(t, env, minter, http.MethodPost, "/operator/credentials", json.RawMessage(body))
				wantOpError(t, name, st, m, http.StatusBadRequest, wire.CodeInvalidRequest)
				stateUnchanged(t, env, name, before)
			})
		}
	})
}

// TestMaxRegistrationsConcurrent checks that registrations racing on one limited
// token never exceed its limit.
func TestMaxRegistrationsConcurrent(t *testing.T) {
	t.Parallel()
	onDialects(t, func(t *testing.T, d string) {
		const nodes, limit = 10, 3
		env := apitest.New(t, d)
		tok, id := limitedToken(t, env, limit)
		var (
			wg       sync.WaitGroup
			mu       sync.Mutex
			statuses = map[string]int{}
		)
		ns := make([]*apitest.Node, nodes)
		for i := range ns {
			ns[i] = env.NewNode(t, fmt.Sprintf("race-%d", i))
		}
		start := make(chan struct{})
		for _, n := range ns {
			wg.Add(1)
			go func() {
				defer wg.Done()
				<-start
				st, b := registerWith(t, n, tok)
				code := fmt.Sprint(st)
				if st != http.StatusCreated {
					var e wire.ErrorBody
					_ = json.Unmarshal(b, &e)
					code += " " + e.Error.Code
				}
				mu.Lock()
				statuses[code]++
				mu.Unlock()
			}()
		}
		close(start)
		wg.Wait()
		if statuses["201"] != limit || statuses["401 token_exhausted"] != nodes-limit || len(statuses) != 2 {
			t.Errorf("answers %v, want %d × 201 and %d × 401 token_exhausted", statuses, limit, nodes-limit)
		}
		workers, err := env.DB.Bun().NewSelect().Table("nodelane_workers").Count(context.Background())
		if err != nil || workers != limit {
			t.Errorf("%d workers, %v; want %d", workers, err, limit)
		}
		if c, err := env.Server.Issuer().Credential(context.Background(), id); err != nil || c.Uses != limit {
			t.Errorf("credential uses %+v, %v; want %d", c, err, limit)
		}
	})
}

func TestRenewToken(t *testing.T) {
	t.Parallel()
	onDialects(t, func(t *testing.T, d string) {
		env := apitest.New(t, d)
		node := env.NewNode(t, "gpu-a")
		reg := node.Register(t, registerRequest())
		oldTok := reg.WorkerToken
		oldCred := credentialOf(t, env, oldTok, credential.ScopeNodeHeartbeat)
		receiptsBefore := env.Receipts(t)

		st, b := post(t, node, wire.PathToken, obj{})
		if st != http.StatusOK {
			t.Fatalf("renew: %d %s", st, b)
		}
		m := asMap(t, b)
		wantKeys(t, "renew", m, "worker_id", "worker_token", "token_expires_at", "previous_token_expires_at", "server_time")
		out := decode[wire.RenewTokenResponse](t, b)
		if out.WorkerID != reg.WorkerID || out.WorkerToken == "" || out.WorkerToken == oldTok {
			t.Fatalf("renew answer %s", b)
		}
		if d := out.TokenExpiresAt.Sub(out.ServerTime); d < 29*24*time.Hour || d > 31*24*time.Hour {
			t.Errorf("the new token lives %v, want 30 days", d)
		}
		if d := out.PreviousTokenExpiresAt.Sub(out.ServerTime); d <= 0 || d > wire.TokenRenewalGraceSeconds*time.Second {
			t.Errorf("the old token lives %v more, want at most %ds", d, wire.TokenRenewalGraceSeconds)
		}
		newCred := credentialOf(t, env, out.WorkerToken, credential.ScopeNodeHeartbeat)
		if newCred.PrincipalID != reg.WorkerID || fmt.Sprint(newCred.Scopes) != fmt.Sprint(oldCred.Scopes) {
			t.Errorf("the new credential %+v does not have the old one's principal and scopes %v", newCred, oldCred.Scopes)
		}
		if n := env.Receipts(t); n != receiptsBefore+1 {
			t.Errorf("%d receipts minted by a renewal, want 1 (credential_minted)", n-receiptsBefore)
		}

		stale := *node
		stale.Token = oldTok
		node.Token = out.WorkerToken
		// Within the grace both tokens work.
		env.Clock.Advance(wire.TokenRenewalGraceSeconds*time.Second - 2*time.Second)
		for what, n := range map[string]*apitest.Node{"old": &stale, "new": node} {
			if st, b := post(t, n, "/workers/heartbeat", wire.HeartbeatRequest{Status: "idle"}); st != http.StatusOK {
				t.Errorf("heartbeat with the %s token within the grace: %d %s", what, st, b)
			}
		}
		// After it the old token is refused, on every route, renewal included.
		env.Clock.Advance(3 * time.Second)
		before := env.Dump(t)
		st, b = post(t, &stale, "/workers/heartbeat", wire.HeartbeatRequest{Status: "idle"})
		wantErr(t, st, b, http.StatusUnauthorized, wire.CodeTokenExpired)
		st, b = post(t, &stale, wire.PathToken, obj{})
		wantErr(t, st, b, http.StatusUnauthorized, wire.CodeTokenExpired)
		stateUnchanged(t, env, "the old token after the grace", before)
		if st, b := post(t, node, "/workers/heartbeat", wire.HeartbeatRequest{Status: "idle"}); st != http.StatusOK {
			t.Errorf("heartbeat with the new token after the grace: %d %s", st, b)
		}
	})
}

// TestRenewTokenRefused checks that renewals that are not a registered node's own,
// signed, fresh request change nothing.
func TestRenewTokenRefused(t *testing.T) {
	t.Parallel()
	onDialects(t, func(t *testing.T, d string) {
		env := apitest.New(t, d)
		node := env.NewNode(t, "gpu-a")
		node.Register(t, registerRequest())

		t.Run("unsigned", func(t *testing.T) {
			before := env.Dump(t)
			st, b := env.Bearer(t, node.Token, http.MethodPost, wire.PathToken, obj{})
			wantErr(t, st, b, http.StatusUnauthorized, wire.CodeMissingSignature)
			stateUnchanged(t, env, "an unsigned renewal", before)
		})
		t.Run("signed by another key", func(t *testing.T) {
			other := env.NewNode(t, "gpu-x")
			r := other.Request(t, http.MethodPost, wire.PathToken, obj{})
			r.Header.Set("Authorization", "Bearer "+node.Token)
			before := env.Dump(t)
			resp, b := env.Raw(t, r)
			wantErr(t, resp.StatusCode, b, http.StatusUnauthorized, wire.CodeBadSignature)
			stateUnchanged(t, env, "a renewal signed by another key", before)
		})
		t.Run("replayed", func(t *testing.T) {
			r := node.Request(t, http.MethodPost, wire.PathToken, obj{})
			resp, first := env.Raw(t, r)
			if resp.StatusCode != http.StatusOK {
				t.Fatalf("renew: %d %s", resp.StatusCode, first)
			}
			before := env.Dump(t)
			resp, b := env.Raw(t, r) // the same signed bytes again
			wantErr(t, resp.StatusCode, b, http.StatusUnauthorized, wire.CodeReplayedNonce)
			stateUnchanged(t, env, "a replayed renewal", before)
			node.Token = decode[wire.RenewTokenResponse](t, first).WorkerToken
		})
		t.Run("provisioning token", func(t *testing.T) {
			r := node.Request(t, http.MethodPost, wire.PathToken, obj{})
			r.Header.Set("Authorization", "Bearer "+env.ProvisioningToken)
			before := env.Dump(t)
			resp, b := env.Raw(t, r)
			wantErr(t, resp.StatusCode, b, http.StatusForbidden, wire.CodeInsufficientScope)
			stateUnchanged(t, env, "a renewal with the provisioning token", before)
		})
		t.Run("operator token", func(t *testing.T) {
			before := env.Dump(t)
			st, b := env.Bearer(t, env.OperatorToken, http.MethodPost, wire.PathToken, obj{})
			wantErr(t, st, b, http.StatusForbidden, wire.CodeInsufficientScope)
			stateUnchanged(t, env, "a renewal with the operator token", before)
		})
		t.Run("not an object", func(t *testing.T) {
			before := env.Dump(t)
			st, b := post(t, node, wire.PathToken, `[]`)
			wantErr(t, st, b, http.StatusBadRequest, wire.CodeInvalidRequest)
			stateUnchanged(t, env, "a renewal with an array body", before)
		})
	})
}

// TestRenewTokenAnswerLost checks that a node whose renewal answer was lost renews
// again with its old token within the grace, and gets the first answer:
// the same new token, and no second credential or receipt.
func TestRenewTokenAnswerLost(t *testing.T) {
	t.Parallel()
	onDialects(t, func(t *testing.T, d string) {
		env := apitest.New(t, d)
		node := env.NewNode(t, "gpu-a")
		node.Register(t, registerRequest())
		st, lostBody := post(t, node, wire.PathToken, obj{})
		if st != http.StatusOK {
			t.Fatalf("renew: %d %s", st, lostBody)
		}
		lost := decode[wire.RenewTokenResponse](t, lostBody)
		minted := env.Receipts(t)
		st, b := post(t, node, wire.PathToken, obj{}) // node.Token is still the old one
		if st != http.StatusOK {
			t.Fatalf("renew again within the grace: %d %s", st, b)
		}
		if string(b) != string(lostBody) {
			t.Errorf("the repeated renewal answered\n%s\nnot the first answer\n%s", b, lostBody)
		}
		if n := env.Receipts(t); n != minted {
			t.Errorf("the repeated renewal minted %d receipts", n-minted)
		}
		second := decode[wire.RenewTokenResponse](t, b)
		if second.WorkerToken != lost.WorkerToken {
			t.Errorf("the repeated renewal minted another token")
		}
		node.Token = second.WorkerToken
		if st, b := post(t, node, "/workers/heartbeat", wire.HeartbeatRequest{Status: "idle"}); st != http.StatusOK {
			t.Errorf("heartbeat with the second renewal's token: %d %s", st, b)
		}
	})
}
