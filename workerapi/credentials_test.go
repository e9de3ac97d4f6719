package workerapi_test

import (
	"context"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"net/http"
	"net/url"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/nodelane/nodelane/credential"
	"github.com/nodelane/nodelane/internal/apitest"
	"github.com/nodelane/nodelane/receipts"
	"github.com/nodelane/nodelane/workerapi/wire"
)

// Least privilege for operators: no credential mints one more powerful
// than itself, principals are created by name, credentials are listed
// without their secrets.

var (
	credentialViewKeys = []string{"credential_id", "principal", "scopes", "created_at", "expires_at", "revoked_at", "registrations", "max_registrations"}
	principalKeys      = []string{"id", "kind", "name", "created_at", "receipt_id"}
)

// operatorScopeNames are the operator scopes, in the order of
// credential.AllScopes.
func operatorScopeNames() []string {
	var out []string
	for _, s := range credential.AllScopes() {
		if strings.HasPrefix(string(s), "operator:") {
			out = append(out, string(s))
		}
	}
	return out
}

// lacks returns the scopes a refusal's message names as lacking: the
// comma-separated list after "lacks ", up to ";".
func lacks(t *testing.T, m obj) []string {
	t.Helper()
	msg, _ := m["error"].(obj)["message"].(string)
	_, rest, ok := strings.Cut(msg, "lacks ")
	list, _, ok2 := strings.Cut(rest, ";")
	if !ok || !ok2 {
		t.Fatalf("message %q names no lacking scopes", msg)
	}
	return strings.Split(list, ", ")
}

// TestCredentialEscalation checks that the attack of the issue, a credential
// holding only operator:credentials minting itself every operator scope, is
// refused with 403 and leaves no credential and no receipt; what a
// credential holds, it may give.
func TestCredentialEscalation(t *testing.T) {
	t.Parallel()
	onDialects(t, func(t *testing.T, dialect string) {
		env := newOpEnv(t, dialect)
		narrow, narrowID := env.Credential(t, apitest.OperatorID, credential.ScopeOperatorCredentials)
		two, _ := env.Credential(t, apitest.OperatorID, credential.ScopeOperatorCredentials, credential.ScopeOperatorJobs)
		n := opGPUNode(t, env, "studio-gpu-1", 1)

		before := env.Dump(t)
		receiptsBefore := env.Receipts(t)
		for _, tc := range []struct {
			name    string
			token   string
			body    obj
			missing []string
		}{
			{"every operator scope for itself", narrow,
				obj{"principal": apitest.OperatorID, "scopes": operatorScopeNames()},
				[]string{"operator:jobs", "operator:workers", "operator:envelope", "operator:receipts"}},
			{"every operator scope for another", narrow,
				obj{"principal": apitest.ProvisionerID, "scopes": operatorScopeNames(), "ttl_seconds": 60},
				[]string{"operator:jobs", "operator:workers", "operator:envelope", "operator:receipts"}},
			{"one scope it lacks", narrow,
				obj{"principal": apitest.OperatorID, "scopes": []string{"operator:credentials", "operator:receipts"}},
				[]string{"operator:receipts"}},
			{"a provisioning token", narrow,
				obj{"principal": apitest.ProvisionerID, "scopes": []string{"node:register"}},
				[]string{"node:register"}},
			{"a node scope for a node", two,
				obj{"principal": n.WorkerID, "scopes": []string{"node:heartbeat", "node:poll"}},
				[]string{"node:heartbeat", "node:poll"}},
			{"repeated, out of order", two,
				obj{"principal": apitest.OperatorID, "scopes": []string{"operator:envelope", "operator:jobs", "operator:envelope", "operator:workers"}},
				[]string{"operator:workers", "operator:envelope"}},
		} {
			st, m := opCall(t, env, tc.token, "POST", "/operator/credentials", tc.body)
			wantOpError(t, tc.name, st, m, http.StatusForbidden, wire.CodeInsufficientScope)
			if st == http.StatusForbidden {
				if d := cmp.Diff(tc.missing, lacks(t, m)); d != "" {
					t.Errorf("%s: lacking scopes (-want +got):\n%s", tc.name, d)
				}
			}
		}
		stateUnchanged(t, env, "refused escalations", before)
		if got := env.Receipts(t); got != receiptsBefore {
			t.Errorf("refused escalations minted %d receipts", got-receiptsBefore)
		}
		// The attacker's credential still opens nothing but its own scope.
		st, m := opCall(t, env, narrow, "GET", "/operator/jobs", nil)
		wantOpError(t, "the narrow credential on operator:jobs", st, m, http.StatusForbidden, wire.CodeInsufficientScope)

		// A subset, or all it holds, is allowed, for itself or another.
		for _, tc := range []struct {
			name   string
			token  string
			body   obj
			scopes []any
		}{
			{"its own scope for another", narrow, obj{"principal": apitest.ProvisionerID, "scopes": []string{"operator:credentials"}}, []any{"operator:credentials"}},
			{"a subset", two, obj{"principal": apitest.OperatorID, "scopes": []string{"operator:jobs"}}, []any{"operator:jobs"}},
			{"all it holds", two, obj{"principal": apitest.OperatorID, "scopes": []string{"operator:jobs", "operator:credentials", "operator:jobs"}}, []any{"operator:jobs", "operator:credentials"}},
			{"every scope from every scope", env.OperatorToken, obj{"principal": apitest.OperatorID, "scopes": operatorScopeNames()}, nil},
		} {
			st, m := opCall(t, env, tc.token, "POST", "/operator/credentials", tc.body)
			if st != http.StatusCreated {
				t.Fatalf("%s: %d %v", tc.name, st, m)
			}
			if tc.scopes != nil {
				if d := cmp.Diff(tc.scopes, m["scopes"]); d != "" {
					t.Errorf("%s: scopes (-want +got):\n%s", tc.name, d)
				}
			}
			r := logReceipt(t, env, m["receipt_id"].(string))
			if r.Kind != receipts.KindCredentialMinted || r.CredentialID != m["credential_id"] || r.Actor != apitest.OperatorID {
				t.Errorf("%s: receipt %+v", tc.name, r)
			}
		}
		// A revoked minter mints nothing.
		mustOp(t, env, http.StatusOK, "POST", "/operator/credentials/"+narrowID+"/revoke", "")
		before = env.Dump(t)
		st, m = opCall(t, env, narrow, "POST", "/operator/credentials", obj{"principal": apitest.OperatorID, "scopes": []string{"operator:credentials"}})
		wantOpError(t, "a revoked minter", st, m, http.StatusUnauthorized, wire.CodeTokenRevoked)
		stateUnchanged(t, env, "a revoked minter", before)
	})
}

// TestMintNoLongerThanMinter checks that a credential cannot mint one that outlives
// it, whatever ttl_seconds asks.
func TestMintNoLongerThanMinter(t *testing.T) {
	t.Parallel()
	onDialects(t, func(t *testing.T, dialect string) {
		env := newOpEnv(t, dialect)
		tok, id := env.Credential(t, apitest.OperatorID, credential.ScopeOperatorCredentials)
		minter, err := env.Server.Issuer().Credential(context.Background(), id)
		if err != nil {
			t.Fatal(err)
		}
		st, m := opCall(t, env, tok, http.MethodPost, "/operator/credentials", obj{
			"principal": apitest.OperatorID, "scopes": []string{"operator:credentials"}, "ttl_seconds": 10 * 365 * 24 * 3600,
		})
		if st != http.StatusCreated {
			t.Fatalf("mint: %d %v", st, m)
		}
		got, err := time.Parse(time.RFC3339Nano, m["expires_at"].(string))
		if err != nil || !got.Equal(minter.ExpiresAt) {
			t.Fatalf("minted credential expires %v (%v), want the minter's %v", got, err, minter.ExpiresAt)
		}
	})
}

// TestOperatorPrincipals checks that POST /operator/principals creates named
// operator principals, minting principal_created, and that a taken id, a bad
// id or name, or a caller without operator:credentials changes nothing.
func TestOperatorPrincipals(t *testing.T) {
	t.Parallel()
	onDialects(t, func(t *testing.T, dialect string) {
		env := newOpEnv(t, dialect)
		n := opGPUNode(t, env, "studio-gpu-1", 1)

		m := mustOp(t, env, http.StatusCreated, "POST", "/operator/principals", obj{"id": "ci-deployer", "name": "CI “deploy” bot"})
		exactKeys(t, "create", m, principalKeys...)
		if m["id"] != "ci-deployer" || m["kind"] != "operator" || m["name"] != "CI “deploy” bot" || m["created_at"] == nil {
			t.Errorf("create = %v", m)
		}
		r := logReceipt(t, env, m["receipt_id"].(string))
		if r.Kind != receipts.KindPrincipalCreated || r.PrincipalID != "ci-deployer" || r.Actor != apitest.OperatorID || r.Name != "CI “deploy” bot" {
			t.Errorf("principal_created = %+v", r)
		}
		p, err := env.Server.Issuer().Principal(context.Background(), "ci-deployer")
		if err != nil || p.Kind != credential.KindOperator || p.Name != "CI “deploy” bot" || p.PublicKey != nil {
			t.Fatalf("stored principal = %+v, %v", p, err)
		}
		if cs, err := env.Server.Issuer().Credentials(context.Background(), "ci-deployer"); err != nil || len(cs) != 0 {
			t.Errorf("a new principal has credentials: %d, %v", len(cs), err)
		}
		// It can be given credentials, which work.
		mint := mustOp(t, env, http.StatusCreated, "POST", "/operator/credentials", obj{"principal": "ci-deployer", "scopes": []string{"operator:jobs"}})
		if st, m := opCall(t, env, mint["token"].(string), "GET", "/operator/jobs", nil); st != http.StatusOK {
			t.Errorf("the new principal's token: %d %v", st, m)
		}
		// Ids are bytes: another case is another principal. No name is
		// an empty name, and no name in the receipt. The longest id.
		for _, id := range []string{"CI-Deployer", "ci-deployer.2", "deploy@ci:main_1", strings.Repeat("a", wire.MaxPrincipalIDLen)} {
			m := mustOp(t, env, http.StatusCreated, "POST", "/operator/principals", obj{"id": id})
			if m["id"] != id || m["name"] != "" {
				t.Errorf("create %q = %v", id, m)
			}
			if r := logReceipt(t, env, m["receipt_id"].(string)); r.PrincipalID != id || r.Name != "" {
				t.Errorf("principal_created of %q = %+v", id, r)
			}
		}

		jobsOnly, _ := env.Credential(t, apitest.OperatorID, credential.ScopeOperatorJobs)
		receiptsBefore := env.Receipts(t)
		before := env.Dump(t)
		for _, tc := range []struct {
			name   string
			token  string
			body   any
			status int
			code   string
		}{
			{"taken id", env.OperatorToken, obj{"id": "ci-deployer", "name": "CI “deploy” bot"}, 409, wire.CodePrincipalExists},
			{"taken id, another name", env.OperatorToken, obj{"id": "ci-deployer", "name": "someone else"}, 409, wire.CodePrincipalExists},
			{"the operator's id", env.OperatorToken, obj{"id": apitest.OperatorID}, 409, wire.CodePrincipalExists},
			{"a node's id", env.OperatorToken, obj{"id": n.WorkerID}, 409, wire.CodePrincipalExists},
			{"no id", env.OperatorToken, obj{"name": "x"}, 400, wire.CodeInvalidRequest},
			{"empty id", env.OperatorToken, obj{"id": ""}, 400, wire.CodeInvalidRequest},
			{"id with a space", env.OperatorToken, obj{"id": "ci deployer"}, 400, wire.CodeInvalidRequest},
			{"id with a slash", env.OperatorToken, obj{"id": "ci/deployer"}, 400, wire.CodeInvalidRequest},
			{"id starting with a dash", env.OperatorToken, obj{"id": "-ci"}, 400, wire.CodeInvalidRequest},
			{"id with trailing space", env.OperatorToken, obj{"id": "ci-deployer "}, 400, wire.CodeInvalidRequest},
			{"id not ASCII", env.OperatorToken, obj{"id": "opérateur"}, 400, wire.CodeInvalidRequest},
			{"id with NUL", env.OperatorToken, `{"id": "ci\u0000"}`, 400, wire.CodeInvalidRequest},
			{"id too long", env.OperatorToken, obj{"id": strings.Repeat("a", wire.MaxPrincipalIDLen+1)}, 400, wire.CodeInvalidRequest},
			{"id far too long", env.OperatorToken, obj{"id": strings.Repeat("a", 100000)}, 400, wire.CodeInvalidRequest},
			{"id not a string", env.OperatorToken, `{"id": 7}`, 400, wire.CodeInvalidRequest},
			{"name too long", env.OperatorToken, obj{"id": "x", "name": strings.Repeat("é", wire.MaxPrincipalNameLen/2+1)}, 400, wire.CodeInvalidRequest},
			{"name with NUL", env.OperatorToken, `{"id": "x", "name": "a\u0000b"}`, 400, wire.CodeInvalidRequest},
			{"malformed JSON", env.OperatorToken, `{"id": "x"`, 400, wire.CodeInvalidRequest},
			{"no body", env.OperatorToken, "", 400, wire.CodeInvalidRequest},
			{"no scope", jobsOnly, obj{"id": "x"}, 403, wire.CodeInsufficientScope},
			{"provisioning token", env.ProvisioningToken, obj{"id": "x"}, 403, wire.CodeInsufficientScope},
			{"node token", n.Token, obj{"id": "x"}, 403, wire.CodeInsufficientScope},
			{"no token", "", obj{"id": "x"}, 401, wire.CodeMissingCredential},
		} {
			st, m := opCall(t, env, tc.token, "POST", "/operator/principals", tc.body)
			wantOpError(t, tc.name, st, m, tc.status, tc.code)
			if st == http.StatusBadRequest {
				if msg, _ := m["error"].(obj)["message"].(string); len(msg) > 512 {
					t.Errorf("%s: a message of %d bytes", tc.name, len(msg))
				}
			}
		}
		stateUnchanged(t, env, "refused principal requests", before)
		if got := env.Receipts(t); got != receiptsBefore {
			t.Errorf("refused principal requests minted %d receipts", got-receiptsBefore)
		}
		if p, err := env.Server.Issuer().Principal(context.Background(), "ci-deployer"); err != nil || p.Name != "CI “deploy” bot" {
			t.Errorf("a refused duplicate changed the principal: %+v, %v", p, err)
		}
	})
}

// TestOperatorListCredentials checks that GET /operator/credentials pages every
// credential in byte order of its id, or one principal's, answers no
// secret, and refuses bad parameters as the other list routes do.
func TestOperatorListCredentials(t *testing.T) {
	t.Parallel()
	onDialects(t, func(t *testing.T, dialect string) {
		env := newOpEnv(t, dialect)
		ctx := context.Background()
		is := env.Server.Issuer()
		n := opGPUNode(t, env, "studio-gpu-1", 1)
		tokens := []string{env.OperatorToken, env.ProvisioningToken, n.Token}
		mustOp(t, env, http.StatusCreated, "POST", "/operator/principals", obj{"id": "lister"})
		var listerIDs []string
		for i := range 5 {
			m := mustOp(t, env, http.StatusCreated, "POST", "/operator/credentials", obj{"principal": "lister", "scopes": []string{"operator:receipts", "operator:jobs"}, "ttl_seconds": 3600 + i})
			tokens = append(tokens, m["token"].(string))
			listerIDs = append(listerIDs, m["credential_id"].(string))
		}
		revoked := listerIDs[2]
		mustOp(t, env, http.StatusOK, "POST", "/operator/credentials/"+revoked+"/revoke", obj{"reason": "test"})
		slices.Sort(listerIDs)

		// Every credential, in id order, a page at a time.
		all, _, err := is.ListCredentials(ctx, credential.CredentialFilter{Limit: credential.MaxListLimit})
		if err != nil {
			t.Fatal(err)
		}
		var allIDs []string
		for _, c := range all {
			allIDs = append(allIDs, c.ID)
		}
		if !slices.IsSorted(allIDs) || len(allIDs) < 8 {
			t.Fatalf("credentials in the store: %v", allIDs)
		}
		page := func(query string) (obj, []byte) {
			t.Helper()
			st, b := env.Operator(t, "GET", "/operator/credentials"+query, nil)
			var m obj
			if err := json.Unmarshal(b, &m); err != nil || st != http.StatusOK {
				t.Fatalf("GET /operator/credentials%s: %d %s", query, st, b)
			}
			exactKeys(t, "list", m, "credentials", "next")
			return m, b
		}
		var bodies [][]byte
		collect := func(filter string, limit int) []string {
			t.Helper()
			var got []string
			after := ""
			for range len(allIDs) + 2 {
				q := url.Values{"limit": {itoa(limit)}}
				if filter != "" {
					q.Set("principal", filter)
				}
				if after != "" {
					q.Set("after", after)
				}
				m, b := page("?" + q.Encode())
				bodies = append(bodies, b)
				cs := m["credentials"].([]any)
				if len(cs) > limit {
					t.Fatalf("limit %d: %d credentials", limit, len(cs))
				}
				for _, c := range cs {
					c := c.(obj)
					exactKeys(t, "credential", c, credentialViewKeys...)
					got = append(got, c["credential_id"].(string))
				}
				next, _ := m["next"].(string)
				if len(cs) == limit && next != got[len(got)-1] {
					t.Fatalf("a full page's next is %v, want its last id %s", m["next"], got[len(got)-1])
				}
				if len(cs) < limit {
					if m["next"] != nil {
						t.Fatalf("a short page has next %v", m["next"])
					}
					return got
				}
				after = next
			}
			t.Fatalf("the pages do not end")
			return nil
		}
		for _, limit := range []int{1, 2, 3, 1000} {
			if d := cmp.Diff(allIDs, collect("", limit)); d != "" {
				t.Errorf("every credential, limit %d (-want +got):\n%s", limit, d)
			}
			if d := cmp.Diff(listerIDs, collect("lister", limit)); d != "" {
				t.Errorf("lister's credentials, limit %d (-want +got):\n%s", limit, d)
			}
		}
		// The fields of one credential.
		m, _ := page("?principal=lister&limit=1000")
		for _, c := range m["credentials"].([]any) {
			c := c.(obj)
			stored, err := is.Credential(ctx, c["credential_id"].(string))
			if err != nil {
				t.Fatal(err)
			}
			if c["principal"] != "lister" || !slices.Equal(toStrings(c["scopes"]), []string{"operator:jobs", "operator:receipts"}) ||
				!jsonTime(t, c["created_at"]).Equal(stored.CreatedAt) || !jsonTime(t, c["expires_at"]).Equal(stored.ExpiresAt) {
				t.Errorf("credential %v, stored %+v", c, stored)
			}
			if (c["revoked_at"] != nil) != (stored.ID == revoked) || stored.ID == revoked && !jsonTime(t, c["revoked_at"]).Equal(*stored.RevokedAt) {
				t.Errorf("credential %s: revoked_at %v, stored %v", stored.ID, c["revoked_at"], stored.RevokedAt)
			}
		}
		// After need not be an id; a page after the last is empty.
		if m, _ := page("?after=" + url.QueryEscape(allIDs[len(allIDs)-1])); len(m["credentials"].([]any)) != 0 || m["next"] != nil {
			t.Errorf("after the last: %v", m)
		}
		if m, _ := page("?after=" + allIDs[0][:5]); len(m["credentials"].([]any)) != len(allIDs) {
			t.Errorf("after a prefix of the first id: %d credentials, want %d", len(m["credentials"].([]any)), len(allIDs))
		}
		// Unknown query parameters are refused, as on every operator GET
		// route.
		for _, q := range []string{"?limit=2&bogus=1", "?limit=2&token=x&scope=operator:jobs", "?limit=2&Principal=lister"} {
			st, m := op(t, env, "GET", "/operator/credentials"+q, nil)
			wantOpError(t, q, st, m, http.StatusBadRequest, wire.CodeInvalidRequest)
		}

		// No answer holds a token, a secret or a digest.
		var digests [][]byte
		for _, c := range all {
			digests = append(digests, c.Digest)
		}
		for _, b := range bodies {
			if found := credential.TokenPattern.FindAllString(string(b), -1); len(found) != 0 || strings.Contains(string(b), credential.TokenPrefix) {
				t.Fatalf("a list answer holds tokens %q: %s", found, b)
			}
			for _, tok := range tokens {
				if strings.Contains(string(b), tok) || strings.Contains(string(b), tok[len(credential.TokenPrefix):len(credential.TokenPrefix)+40]) {
					t.Fatalf("a list answer holds a token: %s", b)
				}
			}
			for _, d := range digests {
				for _, enc := range []string{hex.EncodeToString(d), base64.StdEncoding.EncodeToString(d), base64.RawURLEncoding.EncodeToString(d), base64.RawStdEncoding.EncodeToString(d)} {
					if strings.Contains(strings.ToLower(string(b)), strings.ToLower(enc)) {
						t.Fatalf("a list answer holds a digest (%s): %s", enc, b)
					}
				}
			}
			for _, key := range []string{`"token"`, `"digest"`, `"secret"`, `"pepper`} {
				if strings.Contains(string(b), key) {
					t.Fatalf("a list answer has a field %s: %s", key, b)
				}
			}
		}

		// Refused: bad parameters, an unknown principal, no scope.
		jobsOnly, _ := env.Credential(t, apitest.OperatorID, credential.ScopeOperatorJobs)
		before := env.Dump(t)
		for _, tc := range []struct {
			name, token, query string
			status             int
			code               string
		}{
			{"limit 0", env.OperatorToken, "?limit=0", 400, wire.CodeInvalidRequest},
			{"limit 1001", env.OperatorToken, "?limit=1001", 400, wire.CodeInvalidRequest},
			{"limit not a number", env.OperatorToken, "?limit=ten", 400, wire.CodeInvalidRequest},
			{"limit twice", env.OperatorToken, "?limit=1&limit=2", 400, wire.CodeInvalidRequest},
			{"principal twice", env.OperatorToken, "?principal=lister&principal=lister", 400, wire.CodeInvalidRequest},
			{"after twice", env.OperatorToken, "?after=a&after=b", 400, wire.CodeInvalidRequest},
			{"after not UTF-8", env.OperatorToken, "?after=%ff", 400, wire.CodeInvalidRequest},
			{"after with NUL", env.OperatorToken, "?after=a%00", 400, wire.CodeInvalidRequest},
			{"unknown principal", env.OperatorToken, "?principal=nobody", 404, wire.CodeNotFound},
			{"principal in another case", env.OperatorToken, "?principal=Lister", 404, wire.CodeNotFound},
			{"principal not UTF-8", env.OperatorToken, "?principal=lister%ff", 404, wire.CodeNotFound},
			{"principal with NUL", env.OperatorToken, "?principal=lister%00", 400, wire.CodeInvalidRequest},
			{"no scope", jobsOnly, "", 403, wire.CodeInsufficientScope},
			{"provisioning token", env.ProvisioningToken, "", 403, wire.CodeInsufficientScope},
			{"node token", n.Token, "", 403, wire.CodeInsufficientScope},
			{"no token", "", "", 401, wire.CodeMissingCredential},
		} {
			st, m := opCall(t, env, tc.token, "GET", "/operator/credentials"+tc.query, nil)
			wantOpError(t, tc.name, st, m, tc.status, tc.code)
		}
		stateUnchanged(t, env, "refused list requests", before)
	})
}

// jsonTime parses a time of an answer.
func jsonTime(t *testing.T, v any) time.Time {
	t.Helper()
	s, _ := v.(string)
	tm, err := time.Parse(time.RFC3339Nano, s)
	if err != nil {
		t.Fatalf("time %v: %v", v, err)
	}
	return tm
}

func itoa(n int) string {
	b, _ := json.Marshal(n)
	return string(b)
}

func toStrings(v any) []string {
	var out []string
	for _, s := range v.([]any) {
		out = append(out, s.(string))
	}
	return out
}
