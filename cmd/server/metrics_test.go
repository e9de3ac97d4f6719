package main

import (
	"bytes"
	"encoding/json"
	"io"
	"net/http"
	"os"
	"regexp"
	"runtime"
	"strings"
	"testing"

	"github.com/nodelane/nodelane/cmd/internal/controlplane"
	"github.com/nodelane/nodelane/internal/testdb"
	"github.com/nodelane/nodelane/workerapi"
	"github.com/nodelane/nodelane/workerapi/wire"
)

// fetch sends GET url with token (none when empty) and returns the status
// and body.
func fetch(t *testing.T, url, token string) (int, string) {
	t.Helper()
	req, err := http.NewRequest("GET", url, nil)
	if err != nil {
		t.Fatal(err)
	}
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp.StatusCode, string(b)
}

// mint mints a credential of the operator principal with scopes through
// POST /operator/credentials and returns its token.
func mint(t *testing.T, addr, operator string, scopes ...string) string {
	t.Helper()
	b, _ := json.Marshal(wire.MintCredentialRequest{Principal: workerapi.OperatorPrincipal, Scopes: scopes})
	req, _ := http.NewRequest("POST", "http://"+addr+"/operator/credentials", bytes.NewReader(b))
	req.Header.Set("Authorization", "Bearer "+operator)
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var out wire.MintCredentialResponse
	if resp.StatusCode != http.StatusCreated || json.NewDecoder(resp.Body).Decode(&out) != nil {
		t.Fatalf("minting %v: %d", scopes, resp.StatusCode)
	}
	return out.Token
}

// GET /metrics on -addr needs a bearer credential with operator:receipts
// (401 without one, 403 with a node's or another operator scope, with
// the protocol's error body); the probes need none; -metrics-addr serves
// /metrics and the probes without a credential, and nothing else.
func TestMetricsNeedScope(t *testing.T) {
	t.Parallel()
	for _, d := range testdb.Dialects() {
		t.Run(d.Name, func(t *testing.T) {
			t.Parallel()
			f := newFiles(t, d)
			s := serve(t, append(f.args("127.0.0.1:0"), "-metrics-addr", "127.0.0.1:0")...)
			operator := operatorToken(t, s.stdout.String())
			b, err := os.ReadFile(f.tokens)
			if err != nil {
				t.Fatal(err)
			}
			var tokens controlplane.Tokens
			if err := json.Unmarshal(b, &tokens); err != nil {
				t.Fatal(err)
			}
			jobsOnly := mint(t, s.addr, operator, "operator:jobs")
			receipts := mint(t, s.addr, operator, string(MetricsScope))

			api := "http://" + s.addr
			for _, tc := range []struct {
				name, token string
				code        int
				errCode     string
			}{
				{"no credential", "", http.StatusUnauthorized, wire.CodeMissingCredential},
				{"a wrong token", "nlc_" + strings.Repeat("A", 40), http.StatusUnauthorized, wire.CodeInvalidToken},
				{"the provisioning token", tokens.ProvisioningToken, http.StatusForbidden, wire.CodeInsufficientScope},
				{"operator:jobs alone", jobsOnly, http.StatusForbidden, wire.CodeInsufficientScope},
				{"operator:receipts", receipts, http.StatusOK, ""},
				{"the operator token", operator, http.StatusOK, ""},
			} {
				code, body := fetch(t, api+"/metrics", tc.token)
				if code != tc.code {
					t.Errorf("%s: GET /metrics %d, want %d: %.200s", tc.name, code, tc.code, body)
					continue
				}
				if tc.errCode != "" {
					var e wire.ErrorBody
					if json.Unmarshal([]byte(body), &e) != nil || e.Error.Code != tc.errCode {
						t.Errorf("%s: GET /metrics %s, want error %s", tc.name, body, tc.errCode)
					}
					if strings.Contains(body, "nodelane_") {
						t.Errorf("%s: the refusal shows metrics: %.200s", tc.name, body)
					}
				} else if !strings.Contains(body, "nodelane_stats_up") {
					t.Errorf("%s: GET /metrics: no nodelane_stats_up: %.200s", tc.name, body)
				}
			}
			resp, err := http.Get(api + "/healthz")
			if err != nil {
				t.Fatal(err)
			}
			resp.Body.Close()
			if resp.StatusCode != http.StatusOK || resp.Header.Get("Strict-Transport-Security") != "" {
				t.Errorf("GET /healthz on -addr without a credential: %d, Strict-Transport-Security %q over plain HTTP",
					resp.StatusCode, resp.Header.Get("Strict-Transport-Security"))
			}

			m := regexp.MustCompile(`msg="serving metrics and probes" metrics_addr=(\S+)`).FindStringSubmatch(s.stderr.String())
			if m == nil {
				t.Fatalf("the server did not log where it serves metrics:\n%s", s.stderr.String())
			}
			priv := "http://" + m[1]
			if code, body := fetch(t, priv+"/metrics", ""); code != http.StatusOK || !strings.Contains(body, "nodelane_stats_up") {
				t.Errorf("GET /metrics on -metrics-addr: %d %.200s", code, body)
			}
			if code, body := fetch(t, priv+"/healthz", ""); code != http.StatusOK || body != "ok\n" {
				t.Errorf("GET /healthz on -metrics-addr: %d %q", code, body)
			}
			if code, body := fetch(t, priv+"/readyz", ""); !strings.Contains(body, `"ready"`) {
				t.Errorf("GET /readyz on -metrics-addr: %d %q", code, body)
			}
			for _, p := range []string{"/operator/jobs", "/console/", "/workers/openapi.json"} {
				if code, _ := fetch(t, priv+p, operator); code != http.StatusNotFound {
					t.Errorf("GET %s on -metrics-addr: %d, want 404", p, code)
				}
			}
		})
	}
}

// post sends POST url with body as JSON and the operator token, and
// fails the test unless it is answered with want; it returns the body.
func post(t *testing.T, url, token string, body any, want int) []byte {
	t.Helper()
	b, _ := json.Marshal(body)
	req, err := http.NewRequest("POST", url, bytes.NewReader(b))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer "+token)
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	out, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	if resp.StatusCode != want {
		t.Fatalf("POST %s: %d, want %d: %s", url, resp.StatusCode, want, out)
	}
	return out
}

// The example server's /metrics has the families of issue 31, read from
// its database when scraped: the envelope's canonical types keep their
// name before any worker declares them, any other type is "other"; jobs
// nothing can lease are counted by reason; a cancel counts a finished
// job; build_info names the Go version.
func TestMetricsSeries(t *testing.T) {
	t.Parallel()
	f := newFiles(t, testdb.Dialects()[0])
	s := serve(t, append(f.args("127.0.0.1:0"), "-metrics-addr", "127.0.0.1:0")...)
	operator := operatorToken(t, s.stdout.String())
	api := "http://" + s.addr

	post(t, api+"/operator/jobs", operator, wire.DispatchRequest{JobType: "raw_training"}, http.StatusCreated)
	var d wire.DispatchResponse
	if err := json.Unmarshal(post(t, api+"/operator/jobs", operator, wire.DispatchRequest{JobType: "my_custom_type"}, http.StatusCreated), &d); err != nil {
		t.Fatal(err)
	}
	post(t, api+"/operator/jobs", operator, wire.DispatchRequest{JobType: "my_custom_type"}, http.StatusCreated)
	post(t, api+"/operator/jobs/"+d.Job.ID+"/cancel", operator, struct{}{}, http.StatusOK)

	code, body := fetch(t, api+"/metrics", operator)
	if code != http.StatusOK {
		t.Fatalf("GET /metrics: %d %.300s", code, body)
	}
	for _, line := range []string{
		`nodelane_queue_jobs{state="queued",type="raw_training"} 1`,
		`nodelane_queue_jobs{state="queued",type="other"} 1`,
		`nodelane_queue_unleasable_jobs{reason="type_not_allowed"} 2`,
		`nodelane_queue_unleasable_jobs{reason="no_worker"} 0`,
		`nodelane_queue_unleasable_truncated 0`,
		`nodelane_jobs_finished_total{outcome="canceled",type="other"} 1`,
		`nodelane_envelope_active 0`,
		`nodelane_fleet_workers{approval="approved",banned="false",liveness="online"} 0`,
		`nodelane_fleet_workers_truncated 0`,
		`nodelane_stats_up 1`,
	} {
		if !strings.Contains(body, "\n"+line+"\n") {
			t.Errorf("GET /metrics: no line %s", line)
		}
	}
	for _, re := range []string{
		`\nnodelane_build_info\{go_version="` + regexp.QuoteMeta(runtime.Version()) + `",revision="[^"]+",version="[^"]+"\} 1\n`,
		`\nnodelane_queue_oldest_job_age_seconds\{type="raw_training"\} [0-9.e+-]+\n`,
	} {
		if !regexp.MustCompile(re).MatchString(body) {
			t.Errorf("GET /metrics: nothing matches %s", re)
		}
	}
	if strings.Contains(body, "my_custom_type") {
		t.Error("GET /metrics names a job type no worker declares")
	}
}
