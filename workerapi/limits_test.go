package workerapi_test

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/nodelane/nodelane/credential"
	"github.com/nodelane/nodelane/internal/apitest"
	"github.com/nodelane/nodelane/internal/testdb"
	"github.com/nodelane/nodelane/lease"
	"github.com/nodelane/nodelane/workerapi"
	"github.com/nodelane/nodelane/workerapi/wire"
)

// Bounded cost for every request, over real HTTP on every dialect: the
// body is read only after the credential (and on worker routes the
// signature fields) passed; every field is bounded (wire/limits.go); no
// trailing data; lease-bearing routes answer a missing job as they
// answer a job the caller holds no lease on; no answer shows how the
// control plane is layered; operator reads are bounded in bytes.

// internalPrefixes are the package prefixes of the cores and adapters,
// which no answer may show a caller.
var internalPrefixes = []string{"bunstore:", "lease:", "credential:", "replay:", "envelope:", "receipts:", "workerapi:"}

// errorMessage returns the message of an error answer.
func errorMessage(t *testing.T, body []byte) string {
	t.Helper()
	var e wire.ErrorBody
	if err := json.Unmarshal(body, &e); err != nil {
		t.Fatalf("error body %s: %v", body, err)
	}
	return e.Error.Message
}

// noInternals fails the test if an error answer's message names an
// internal package.
func noInternals(t *testing.T, what string, body []byte) {
	t.Helper()
	msg := errorMessage(t, body)
	for _, p := range internalPrefixes {
		if strings.Contains(msg, p) {
			t.Errorf("%s: message %q shows %q", what, msg, p)
		}
	}
}

// refused checks an error answer: status, code, a message that contains
// each of want and no internal package, and that the state did not
// change since before.
func refused(t *testing.T, env *apitest.Env, before map[string][]string, what string, st int, body []byte, status int, code string, want ...string) {
	t.Helper()
	wantErr(t, st, body, status, code)
	if st != status {
		return
	}
	msg := errorMessage(t, body)
	for _, w := range want {
		if !strings.Contains(msg, w) {
			t.Errorf("%s: message %q does not say %q", what, msg, w)
		}
	}
	noInternals(t, what, body)
	stateUnchanged(t, env, what, before)
}

// headersOnly sends a request's line and headers, announcing a body of
// length bytes that it never sends, and returns the answer: one the
// control plane gives without reading the body. If it waited for the
// body instead, no answer comes and the test fails.
func headersOnly(t *testing.T, baseURL, method, path string, length int64, h http.Header) (int, []byte) {
	t.Helper()
	u, err := url.Parse(baseURL)
	if err != nil {
		t.Fatal(err)
	}
	conn, err := net.DialTimeout("tcp", u.Host, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	if err := conn.SetDeadline(time.Now().Add(10 * time.Second)); err != nil {
		t.Fatal(err)
	}
	var b strings.Builder
	fmt.Fprintf(&b, "%s %s HTTP/1.1\r\nHost: %s\r\nContent-Length: %d\r\n", method, path, u.Host, length)
	for k, vs := range h {
		for _, v := range vs {
			fmt.Fprintf(&b, "%s: %s\r\n", k, v)
		}
	}
	b.WriteString("\r\n")
	if _, err := io.WriteString(conn, b.String()); err != nil {
		t.Fatal(err)
	}
	resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
	if err != nil {
		t.Fatalf("%s %s: no answer without the body (%v): the control plane waited for it", method, path, err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp.StatusCode, body
}

func TestBodyReadAfterCredential(t *testing.T) {
	t.Parallel()
	for _, d := range testdb.Dialects() {
		t.Run(d.Name, func(t *testing.T) {
			t.Parallel()
			f := setup(t, d.Name)
			env := f.env
			revoked, id := env.Credential(t, apitest.OperatorID, credential.ScopeOperatorJobs)
			mustOp(t, env, http.StatusOK, "POST", "/operator/credentials/"+id+"/revoke", obj{"reason": "test"})
			// A signed request's headers, to send without its body.
			signed := f.node.Request(t, http.MethodPost, "/workers/heartbeat", wire.HeartbeatRequest{Status: "idle"}).Header
			without := func(names ...string) http.Header {
				h := signed.Clone()
				for _, n := range names {
					h.Del(n)
				}
				return h
			}
			big := signed.Clone()
			big.Set("Signature-Input", big.Get("Signature-Input")+`, pad="`+strings.Repeat("x", wire.MaxSignatureFieldBytes)+`"`)
			reg := without("Signature", "Signature-Input")
			reg.Set("Authorization", "Bearer "+env.ProvisioningToken)
			ct := http.Header{"Content-Type": {"application/json"}}
			bearer := func(tok string) http.Header {
				h := ct.Clone()
				h.Set("Authorization", "Bearer "+tok)
				return h
			}
			const mib = 1 << 20
			for _, tc := range []struct {
				name, method, path string
				length             int64
				h                  http.Header
				status             int
				code               string
			}{
				{"worker route, no credential", "POST", "/workers/heartbeat", mib, ct, 401, wire.CodeMissingCredential},
				{"register, no credential", "POST", "/workers/register", mib, ct, 401, wire.CodeMissingCredential},
				{"operator route, no credential", "POST", "/operator/jobs", mib, ct, 401, wire.CodeMissingCredential},
				{"malformed token", "POST", "/workers/jobs/job_x/complete", mib, bearer("nlc_notatoken"), 401, wire.CodeInvalidToken},
				{"revoked token", "POST", "/operator/jobs", mib, bearer(revoked), 401, wire.CodeTokenRevoked},
				{"wrong scope", "POST", "/operator/jobs", mib, bearer(f.node.Token), 403, wire.CodeInsufficientScope},
				{"no signature", "POST", "/workers/heartbeat", mib, without("Signature"), 401, wire.CodeMissingSignature},
				{"no Content-Digest", "POST", "/workers/heartbeat", mib, without("Content-Digest"), 401, wire.CodeMissingSignature},
				{"register without signature", "POST", "/workers/register", mib, reg, 401, wire.CodeMissingSignature},
				{"Signature-Input over its limit", "POST", "/workers/heartbeat", mib, big, 401, wire.CodeMalformedSignature},
				{"declared body over the limit", "POST", "/operator/jobs", 2 * mib, bearer(env.OperatorToken), 413, wire.CodePayloadTooLarge},
			} {
				t.Run(tc.name, func(t *testing.T) {
					t.Parallel()
					before := env.Dump(t)
					st, b := headersOnly(t, env.URL, tc.method, tc.path, tc.length, tc.h)
					refused(t, env, before, tc.name, st, b, tc.status, tc.code)
				})
			}
		})
	}
}

// padded returns a signed heartbeat of f's node whose header field name
// is padded, with a member of another label, to exactly size bytes.
func padded(t *testing.T, f *fx, name string, size int) *http.Request {
	t.Helper()
	r := f.node.Request(t, http.MethodPost, "/workers/heartbeat", wire.HeartbeatRequest{Status: "idle"})
	v := r.Header.Get(name)
	pad := `, pad="` + strings.Repeat("x", size-len(v)-len(`, pad=""`)) + `"`
	if name == "Content-Digest" {
		pad = `, pad=:` + strings.Repeat("A", size-len(v)-len(`, pad=::`)) + `:`
	}
	r.Header.Set(name, v+pad)
	if n := len(r.Header.Get(name)); n != size {
		t.Fatalf("padded %s to %d bytes, want %d", name, n, size)
	}
	return r
}

func TestSignatureFieldLimit(t *testing.T) {
	t.Parallel()
	for _, d := range testdb.Dialects() {
		t.Run(d.Name, func(t *testing.T) {
			t.Parallel()
			f := setup(t, d.Name)
			for _, name := range []string{"Signature-Input", "Signature"} {
				t.Run(name+" at the limit", func(t *testing.T) {
					resp, b := f.node.Raw(t, padded(t, f, name, wire.MaxSignatureFieldBytes))
					if resp.StatusCode != http.StatusOK {
						t.Errorf("%d %s", resp.StatusCode, b)
					}
				})
			}
			for _, name := range []string{"Signature-Input", "Signature", "Content-Digest"} {
				t.Run(name+" over the limit", func(t *testing.T) {
					before := f.env.Dump(t)
					resp, b := f.node.Raw(t, padded(t, f, name, wire.MaxSignatureFieldBytes+1))
					refused(t, f.env, before, name, resp.StatusCode, b, http.StatusUnauthorized, wire.CodeMalformedSignature,
						name, fmt.Sprint(wire.MaxSignatureFieldBytes))
				})
			}
			t.Run("field lines combined", func(t *testing.T) {
				r := f.node.Request(t, http.MethodPost, "/workers/heartbeat", wire.HeartbeatRequest{Status: "idle"})
				for range 2 {
					r.Header.Add("Signature-Input", `pad="`+strings.Repeat("x", wire.MaxSignatureFieldBytes/2)+`"`)
				}
				before := f.env.Dump(t)
				resp, b := f.node.Raw(t, r)
				refused(t, f.env, before, "two lines", resp.StatusCode, b, http.StatusUnauthorized, wire.CodeMalformedSignature, "Signature-Input")
			})
		})
	}
}

func TestTrailingData(t *testing.T) {
	t.Parallel()
	for _, d := range testdb.Dialects() {
		t.Run(d.Name, func(t *testing.T) {
			t.Parallel()
			f := setup(t, d.Name)
			env := f.env
			for _, trail := range []string{"}", "]", "}}", " ]", "{}", `"x"`, "0", ",", "\x00", "\n}\n"} {
				t.Run(fmt.Sprintf("%q", trail), func(t *testing.T) {
					t.Parallel()
					before := env.Dump(t)
					st, b := post(t, f.node, "/workers/heartbeat", `{"status":"idle"}`+trail)
					refused(t, env, before, "heartbeat", st, b, http.StatusBadRequest, wire.CodeInvalidRequest, "trailing data")
					st, b = env.Operator(t, "POST", "/operator/jobs", `{"job_type":"status_check"}`+trail)
					refused(t, env, before, "dispatch", st, b, http.StatusBadRequest, wire.CodeInvalidRequest, "trailing data")
				})
			}
			t.Run("JSON whitespace", func(t *testing.T) {
				if st, b := post(t, f.node, "/workers/heartbeat", "\n{\"status\":\"idle\"} \t\r\n"); st != http.StatusOK {
					t.Errorf("heartbeat: %d %s", st, b)
				}
			})
		})
	}
}

// limitCase is one request over a limit.
type limitCase struct {
	name string
	path string // "{id}" stands for a running job of the node
	body func(tok string) any
	// want are words of the refusal: the field and the limit.
	want []string
}

func TestRequestLimits(t *testing.T) {
	t.Parallel()
	long := func(n int) string { return strings.Repeat("x", n) }
	many := func(n, size int) []string {
		out := make([]string, n)
		for i := range out {
			out[i] = fmt.Sprintf("%0*d", size, i)
		}
		return out
	}
	gpus := func(n int) []wire.GPU {
		out := make([]wire.GPU, n)
		for i := range out {
			out[i] = wire.GPU{SKU: sku, VRAMMB: 24576}
		}
		return out
	}
	bulky := json.RawMessage(`{"p":"` + long(wire.MaxPayloadBytes) + `"}`)
	reg := func(edit func(r *wire.RegisterRequest)) func(string) any {
		return func(string) any {
			r := registerRequest()
			edit(&r)
			return r
		}
	}
	n := fmt.Sprint
	cases := []limitCase{
		{"register: gpus", wire.PathRegister, reg(func(r *wire.RegisterRequest) { r.Capabilities.GPUs = gpus(wire.MaxGPUs + 1) }), []string{"capabilities.gpus", n(wire.MaxGPUs)}},
		{"register: a gpu sku", wire.PathRegister, reg(func(r *wire.RegisterRequest) { r.Capabilities.GPUs[0].SKU = long(wire.MaxNameBytes + 1) }), []string{"sku", n(wire.MaxNameBytes)}},
		{"register: job_types", wire.PathRegister, reg(func(r *wire.RegisterRequest) { r.Capabilities.JobTypes = many(wire.MaxJobTypes+1, 8) }), []string{"job_types", n(wire.MaxJobTypes)}},
		{"register: a job type", wire.PathRegister, reg(func(r *wire.RegisterRequest) { r.Capabilities.JobTypes = []string{long(wire.MaxJobTypeBytes + 1)} }), []string{"job_types[0]", n(wire.MaxJobTypeBytes)}},
		{"register: tags", wire.PathRegister, reg(func(r *wire.RegisterRequest) { r.Tags = many(wire.MaxTags+1, 4) }), []string{"tags", n(wire.MaxTags)}},
		{"register: a tag", wire.PathRegister, reg(func(r *wire.RegisterRequest) { r.Tags = []string{long(wire.MaxTagBytes + 1)} }), []string{"tags[0]", n(wire.MaxTagBytes)}},
		{"register: node_id", wire.PathRegister, reg(func(r *wire.RegisterRequest) { r.NodeID = long(wire.MaxNameBytes + 1) }), []string{"node_id", n(wire.MaxNameBytes)}},
		{"register: name", wire.PathRegister, reg(func(r *wire.RegisterRequest) { r.Name = long(wire.MaxNameBytes + 1) }), []string{"name", n(wire.MaxNameBytes)}},
		{"register: hostname", wire.PathRegister, reg(func(r *wire.RegisterRequest) { r.Hostname = long(wire.MaxNameBytes + 1) }), []string{"hostname", n(wire.MaxNameBytes)}},
		{"register: version", wire.PathRegister, reg(func(r *wire.RegisterRequest) { r.Version = long(wire.MaxNameBytes + 1) }), []string{"version", n(wire.MaxNameBytes)}},
		{"register: endpoint_url", wire.PathRegister, reg(func(r *wire.RegisterRequest) { u := long(wire.MaxURIBytes + 1); r.EndpointURL = &u }), []string{"endpoint_url", n(wire.MaxURIBytes)}},

		{"heartbeat: current_jobs", wire.PathHeartbeat, func(string) any {
			return wire.HeartbeatRequest{Status: "idle", CurrentJobs: many(wire.MaxCurrentJobs+1, 4)}
		}, []string{"current_jobs", n(wire.MaxCurrentJobs)}},
		{"heartbeat: a job id", wire.PathHeartbeat, func(string) any {
			return wire.HeartbeatRequest{Status: "idle", CurrentJobs: []string{long(wire.MaxNameBytes + 1)}}
		}, []string{"current_jobs[0]", n(wire.MaxNameBytes)}},
		{"heartbeat: gpus", wire.PathHeartbeat, func(string) any {
			return wire.HeartbeatRequest{Status: "idle", Capabilities: &wire.Capabilities{GPUs: gpus(wire.MaxGPUs + 1)}}
		}, []string{"capabilities.gpus", n(wire.MaxGPUs)}},

		{"lease: supported_job_types", wire.PathLease, func(string) any {
			return wire.LeaseRequest{SupportedJobTypes: many(wire.MaxJobTypes+1, 4)}
		}, []string{"supported_job_types", n(wire.MaxJobTypes)}},
		{"lease: supported_gpu_skus", wire.PathLease, func(string) any {
			return wire.LeaseRequest{SupportedGPUSKUs: many(wire.MaxGPUs+1, 4)}
		}, []string{"supported_gpu_skus", n(wire.MaxGPUs)}},

		{"status: event_type", "/workers/jobs/{id}/status", func(tok string) any {
			return wire.StatusRequest{LeaseToken: tok, EventType: long(wire.MaxNameBytes + 1)}
		}, []string{"event_type", n(wire.MaxNameBytes)}},
		{"status: message", "/workers/jobs/{id}/status", func(tok string) any {
			return wire.StatusRequest{LeaseToken: tok, EventType: "progress", Message: long(wire.MaxMessageBytes + 1)}
		}, []string{"message", n(wire.MaxMessageBytes)}},
		{"status: payload", "/workers/jobs/{id}/status", func(tok string) any {
			return wire.StatusRequest{LeaseToken: tok, EventType: "progress", Payload: bulky}
		}, []string{"payload", n(wire.MaxPayloadBytes)}},

		{"logs: entries", "/workers/jobs/{id}/logs", func(tok string) any {
			es := make([]wire.LogEntry, wire.MaxLogEntries+1)
			for i := range es {
				es[i] = wire.LogEntry{Seq: int64(i + 1)}
			}
			return wire.LogsRequest{LeaseToken: tok, Entries: es}
		}, []string{"entries", n(wire.MaxLogEntries)}},
		{"logs: an entry's message", "/workers/jobs/{id}/logs", func(tok string) any {
			return wire.LogsRequest{LeaseToken: tok, Entries: []wire.LogEntry{{Seq: 1}, {Seq: 2, Message: long(wire.MaxMessageBytes + 1)}}}
		}, []string{"entries[1].message", n(wire.MaxMessageBytes)}},
		{"logs: an entry's payload", "/workers/jobs/{id}/logs", func(tok string) any {
			return wire.LogsRequest{LeaseToken: tok, Entries: []wire.LogEntry{{Seq: 1, Payload: bulky}}}
		}, []string{"entries[0].payload", n(wire.MaxPayloadBytes)}},
		{"logs: one entry's message", "/workers/jobs/{id}/logs", func(tok string) any {
			m := long(wire.MaxMessageBytes + 1)
			return wire.LogsRequest{LeaseToken: tok, Seq: ptr(int64(1)), Message: &m}
		}, []string{"message", n(wire.MaxMessageBytes)}},

		{"artifacts: artifact_type", "/workers/jobs/{id}/artifacts", func(tok string) any {
			return wire.ArtifactRequest{LeaseToken: tok, ArtifactType: long(wire.MaxNameBytes + 1), Name: "a", URI: "s3://a"}
		}, []string{"artifact_type", n(wire.MaxNameBytes)}},
		{"artifacts: name", "/workers/jobs/{id}/artifacts", func(tok string) any {
			return wire.ArtifactRequest{LeaseToken: tok, ArtifactType: "adapter", Name: long(wire.MaxNameBytes + 1), URI: "s3://a"}
		}, []string{"name", n(wire.MaxNameBytes)}},
		{"artifacts: uri", "/workers/jobs/{id}/artifacts", func(tok string) any {
			return wire.ArtifactRequest{LeaseToken: tok, ArtifactType: "adapter", Name: "a", URI: "s3://" + long(wire.MaxURIBytes)}
		}, []string{"uri", n(wire.MaxURIBytes)}},
		{"artifacts: metadata", "/workers/jobs/{id}/artifacts", func(tok string) any {
			return wire.ArtifactRequest{LeaseToken: tok, ArtifactType: "adapter", Name: "a", URI: "s3://a", Metadata: bulky}
		}, []string{"metadata", n(wire.MaxPayloadBytes)}},

		{"complete: output_uri", "/workers/jobs/{id}/complete", func(tok string) any {
			u := long(wire.MaxURIBytes + 1)
			return wire.CompleteRequest{LeaseToken: tok, OutputURI: &u}
		}, []string{"output_uri", n(wire.MaxURIBytes)}},
		{"complete: final_message", "/workers/jobs/{id}/complete", func(tok string) any {
			m := long(wire.MaxMessageBytes + 1)
			return wire.CompleteRequest{LeaseToken: tok, FinalMessage: &m}
		}, []string{"final_message", n(wire.MaxMessageBytes)}},
		{"complete: metrics", "/workers/jobs/{id}/complete", func(tok string) any {
			return wire.CompleteRequest{LeaseToken: tok, Metrics: bulky}
		}, []string{"metrics", n(wire.MaxPayloadBytes)}},

		{"fail: error_code", "/workers/jobs/{id}/fail", func(tok string) any {
			return wire.FailRequest{LeaseToken: tok, ErrorCode: long(wire.MaxNameBytes + 1)}
		}, []string{"error_code", n(wire.MaxNameBytes)}},
		{"fail: message", "/workers/jobs/{id}/fail", func(tok string) any {
			return wire.FailRequest{LeaseToken: tok, Message: long(wire.MaxMessageBytes + 1)}
		}, []string{"message", n(wire.MaxMessageBytes)}},
		{"fail: payload", "/workers/jobs/{id}/fail", func(tok string) any {
			return wire.FailRequest{LeaseToken: tok, Payload: bulky}
		}, []string{"payload", n(wire.MaxPayloadBytes)}},
		{"release: reason", "/workers/jobs/{id}/release", func(tok string) any {
			return wire.ReleaseRequest{LeaseToken: tok, Reason: long(wire.MaxMessageBytes + 1)}
		}, []string{"reason", n(wire.MaxMessageBytes)}},

		{"audit: event_type", wire.PathAudit, func(string) any {
			at := time.Now()
			return wire.AuditRequest{Events: []wire.AuditEvent{{EventType: long(wire.MaxNameBytes + 1), OccurredAt: &at}}}
		}, []string{"events[0].event_type", n(wire.MaxNameBytes)}},
	}
	for _, d := range testdb.Dialects() {
		t.Run(d.Name, func(t *testing.T) {
			t.Parallel()
			f := setup(t, d.Name)
			env := f.env
			id, tok := f.running(t, "status_check")
			newNode := env.NewNode(t, "new-node")
			for _, tc := range cases {
				t.Run(tc.name, func(t *testing.T) {
					before := env.Dump(t)
					var resp *http.Response
					var b []byte
					if tc.path == wire.PathRegister {
						// A new node and an existing one alike.
						for _, nd := range []*apitest.Node{newNode, f.node} {
							body := tc.body(tok).(wire.RegisterRequest)
							if body.NodeID == registerRequest().NodeID {
								body.NodeID = nd.NodeID
							}
							body.PublicKey = nd.PublicKey
							r := nd.Request(t, http.MethodPost, wire.PathRegister, body)
							r.Header.Set("Authorization", "Bearer "+env.ProvisioningToken)
							resp, b = nd.Raw(t, r)
							refused(t, env, before, tc.name, resp.StatusCode, b, http.StatusBadRequest, wire.CodeInvalidRequest, tc.want...)
						}
						return
					}
					resp, b = f.node.Do(t, http.MethodPost, strings.Replace(tc.path, "{id}", id, 1), tc.body(tok))
					refused(t, env, before, tc.name, resp.StatusCode, b, http.StatusBadRequest, wire.CodeInvalidRequest, tc.want...)
				})
			}
			t.Run("dispatch: job_type", func(t *testing.T) {
				before := env.Dump(t)
				st, b := env.Operator(t, "POST", "/operator/jobs", obj{"job_type": long(wire.MaxJobTypeBytes + 1)})
				refused(t, env, before, "job_type", st, b, http.StatusBadRequest, wire.CodeInvalidRequest, "job_type", n(wire.MaxJobTypeBytes))
				st, b = env.Operator(t, "POST", "/operator/jobs", obj{"job_type": "status_check", "requirements": obj{"gpu_sku": long(wire.MaxNameBytes + 1)}})
				refused(t, env, before, "gpu_sku", st, b, http.StatusBadRequest, wire.CodeInvalidRequest, "gpu_sku", n(wire.MaxNameBytes))
			})

			t.Run("operator reasons", func(t *testing.T) {
				_, cid := f.env.Credential(t, apitest.OperatorID, credential.ScopeOperatorJobs)
				over := obj{"reason": long(wire.MaxReasonBytes + 1)}
				for _, p := range []string{
					"/operator/workers/" + f.node.WorkerID + "/ban",
					"/operator/workers/" + f.node.WorkerID + "/unban",
					"/operator/credentials/" + cid + "/revoke",
					"/operator/envelope/activate",
					"/operator/envelope/deactivate",
				} {
					before := env.Dump(t)
					st, b := env.Operator(t, "POST", p, over)
					refused(t, env, before, p, st, b, http.StatusBadRequest, wire.CodeInvalidRequest, "reason", n(wire.MaxReasonBytes))
				}
				// At the limit, the reason is taken.
				mustOp(t, env, http.StatusOK, "POST", "/operator/credentials/"+cid+"/revoke", obj{"reason": long(wire.MaxReasonBytes)})
			})

			// At every limit, the request is served.
			t.Run("at the limits", func(t *testing.T) {
				r := registerRequest()
				r.NodeID, r.PublicKey = newNode.NodeID, newNode.PublicKey
				r.Name, r.Hostname, r.Role, r.Version = long(wire.MaxNameBytes), long(wire.MaxNameBytes), long(wire.MaxNameBytes), long(wire.MaxNameBytes)
				r.Capabilities.GPUs = gpus(wire.MaxGPUs)
				r.Capabilities.JobTypes = append(many(wire.MaxJobTypes-1, wire.MaxJobTypeBytes), "status_check")
				r.Tags = many(wire.MaxTags, wire.MaxTagBytes)
				u := "s3://" + long(wire.MaxURIBytes-5)
				r.EndpointURL = &u
				newNode.Register(t, r)
				if st, b := post(t, f.node, wire.PathHeartbeat, wire.HeartbeatRequest{Status: "busy", CurrentJobs: append(many(wire.MaxCurrentJobs-1, 8), id)}); st != http.StatusOK {
					t.Errorf("heartbeat: %d %s", st, b)
				}
				es := make([]wire.LogEntry, wire.MaxLogEntries)
				for i := range es {
					es[i] = wire.LogEntry{Seq: int64(i + 1), Message: "line"}
				}
				es[0].Message = long(wire.MaxMessageBytes)
				es[1].Payload = json.RawMessage(`{"p":"` + long(wire.MaxPayloadBytes-8) + `"}`)
				st, b := post(t, f.node, "/workers/jobs/"+id+"/logs", wire.LogsRequest{LeaseToken: tok, Entries: es})
				if st != http.StatusOK || decode[wire.LogsResponse](t, b).Accepted != wire.MaxLogEntries {
					t.Errorf("logs: %d %s", st, b)
				}
			})
		})
	}
}

// TestFitsBoundsExplain checks that a node at the GPU limit does not slow a
// dispatch down (explaining leasability matches every worker's Fits).
func TestFitsBoundsExplain(t *testing.T) {
	t.Parallel()
	f := setup(t, "sqlite")
	r := registerRequest()
	for i := range wire.MaxGPUs - 1 {
		r.Capabilities.GPUs = append(r.Capabilities.GPUs, wire.GPU{SKU: sku, VRAMMB: 1000 + i})
	}
	f.node.Register(t, r)
	start := time.Now()
	m := dispatchJob(t, f.env, obj{"job_type": "status_check", "requirements": obj{"gpu_count": wire.MaxGPUs}})
	if d := time.Since(start); d > 5*time.Second {
		t.Errorf("dispatch took %v", d)
	}
	if m["leasable"] != true {
		t.Errorf("dispatch: %v", m)
	}
}

func TestProbingRevealsNothing(t *testing.T) {
	t.Parallel()
	for _, d := range testdb.Dialects() {
		t.Run(d.Name, func(t *testing.T) {
			t.Parallel()
			f := setup(t, d.Name)
			env := f.env
			other := env.NewNode(t, "other-node")
			other.Register(t, wire.RegisterRequest{Capabilities: wire.Capabilities{JobTypes: []string{"telemetry_sync"}}})
			// The caller's own lease gives it a well-formed, live token.
			_, tok := f.leased(t, "status_check")
			queued := env.Enqueue(t, lease.NewJob{Type: "status_check", Requirements: lease.Requirements{GPUSKU: "h100", GPUCount: 8}})
			blocked := env.Enqueue(t, lease.NewJob{Type: "lora_train", Requirements: lease.Requirements{GPUSKU: "h100", GPUCount: 8}})
			othersJob := env.Enqueue(t, lease.NewJob{Type: "telemetry_sync"})
			if st, b := post(t, other, wire.PathLease, wire.LeaseRequest{SupportedJobTypes: []string{"telemetry_sync"}}); st != http.StatusOK || decode[wire.LeaseResponse](t, b).Job == nil {
				t.Fatalf("the other node's lease: %d %s", st, b)
			}
			jobs := map[string]string{
				"missing":            "job_0000000000000000000000000000beef",
				"queued":             queued.ID,
				"blocked type":       blocked.ID,
				"another's lease":    othersJob.ID,
				"not even a job id!": "x",
			}
			for _, action := range []string{"accept", "status", "logs", "artifacts", "complete", "fail", "release"} {
				t.Run(action, func(t *testing.T) {
					t.Parallel()
					body := obj{"lease_token": tok, "event_type": "progress", "seq": 1, "message": "m",
						"artifact_type": "adapter", "name": "a", "uri": "s3://a"}
					var first []byte
					for what, id := range jobs {
						before := env.Dump(t)
						st, b := post(t, f.node, "/workers/jobs/"+id+"/"+action, body)
						refused(t, env, before, what, st, b, http.StatusConflict, wire.CodeLeaseLost)
						msg := errorMessage(t, b)
						if strings.Contains(msg, id) {
							t.Errorf("%s: message %q names the job", what, msg)
						}
						if first == nil {
							first = []byte(msg)
						} else if msg != string(first) {
							t.Errorf("%s: message %q, but %q for another job", what, msg, first)
						}
					}
				})
			}
		})
	}
}

// TestAcceptChecksTheLeaseFirst checks that the holder of a lease on a job whose
// type the envelope blocked since is refused 403, and nothing changes.
func TestAcceptChecksTheLeaseFirst(t *testing.T) {
	t.Parallel()
	for _, d := range testdb.Dialects() {
		t.Run(d.Name, func(t *testing.T) {
			t.Parallel()
			f := setup(t, d.Name)
			env := f.env
			activateEnvelope(t, env)
			id, tok := f.leased(t, "lora_train")
			mustOp(t, env, http.StatusOK, "POST", "/operator/envelope/deactivate", obj{"reason": "done"})
			before := env.Dump(t)
			st, b := post(t, f.node, "/workers/jobs/"+id+"/accept", wire.TokenRequest{LeaseToken: tok})
			refused(t, env, before, "accept", st, b, http.StatusForbidden, wire.CodeBlockedByEnvelope)
			if j := env.Job(t, id); j.State != lease.StateLeased {
				t.Errorf("job %s after a refused accept, want leased", j.State)
			}
		})
	}
}

// TestNoInternalsInMessages checks that no 4xx answer names an internal package.
func TestNoInternalsInMessages(t *testing.T) {
	t.Parallel()
	for _, d := range testdb.Dialects() {
		t.Run(d.Name, func(t *testing.T) {
			t.Parallel()
			f := setup(t, d.Name)
			env := f.env
			id, tok := f.leased(t, "status_check")
			revoked, cid := env.Credential(t, apitest.OperatorID, credential.ScopeOperatorJobs)
			mustOp(t, env, http.StatusOK, "POST", "/operator/credentials/"+cid+"/revoke", obj{"reason": "test"})
			type answer struct {
				what string
				st   int
				b    []byte
			}
			var answers []answer
			add := func(what string, st int, b []byte) { answers = append(answers, answer{what, st, b}) }
			for _, p := range []string{"/operator/jobs/job_nope", "/operator/workers/wrk_nope", "/operator/receipts/rcp_nope", "/operator/jobs?state=nope", "/operator/nope"} {
				st, b := env.Operator(t, "GET", p, nil)
				add("GET "+p, st, b)
			}
			for _, p := range []string{"/operator/jobs/job_nope/cancel", "/operator/workers/wrk_nope/ban", "/operator/credentials/nope/revoke"} {
				st, b := env.Operator(t, "POST", p, nil)
				add("POST "+p, st, b)
			}
			st, b := env.Operator(t, "POST", "/operator/credentials", obj{"principal": "nobody", "scopes": []string{"operator:jobs"}})
			add("mint for nobody", st, b)
			st, b = env.Bearer(t, revoked, "GET", "/operator/jobs", nil)
			add("revoked", st, b)
			st, b = env.Bearer(t, "nlc_x", "GET", "/operator/jobs", nil)
			add("malformed token", st, b)
			st, b = env.Bearer(t, f.node.Token, "GET", "/operator/jobs", nil)
			add("wrong scope", st, b)
			st, b = post(t, f.node, "/workers/jobs/"+id+"/complete", wire.CompleteRequest{LeaseToken: tok})
			add("complete before accept", st, b)
			st, b = post(t, f.node, "/workers/jobs/"+id+"/accept", wire.TokenRequest{LeaseToken: "nll_short"})
			add("malformed lease token", st, b)
			st, b = post(t, f.node, "/workers/jobs/job_nope/status", wire.StatusRequest{LeaseToken: tok, EventType: "p"})
			add("status of no job", st, b)
			r := f.node.Request(t, http.MethodPost, wire.PathHeartbeat, wire.HeartbeatRequest{Status: "idle"})
			resp, b := f.node.Raw(t, r)
			add("heartbeat", resp.StatusCode, b)
			resp, b = f.node.Raw(t, r)
			add("replayed nonce", resp.StatusCode, b)
			r.Header.Set("Signature-Input", strings.Replace(r.Header.Get("Signature-Input"), "nodelane-worker/v1", "other", 1))
			resp, b = f.node.Raw(t, r)
			add("bad tag", resp.StatusCode, b)
			r = f.node.Request(t, http.MethodPost, wire.PathRegister, registerRequest())
			r.Header.Set("Authorization", "Bearer "+env.ProvisioningToken)
			resp, b = f.node.Raw(t, r)
			add("register without a node_id", resp.StatusCode, b)
			n4xx := 0
			for _, a := range answers {
				if a.st < 400 || a.st >= 500 || a.b == nil {
					continue
				}
				n4xx++
				noInternals(t, a.what, a.b)
			}
			if n4xx < 15 {
				t.Errorf("only %d answers were 4xx: %v", n4xx, answers)
			}
		})
	}
}

// TestOperatorReadsBoundedInBytes checks that the operator's reads of a
// job's events, of its artifacts and of jobs with large payloads are cut
// into pages of wire.MaxPageBytes, each part on a control plane of its
// own.
func TestOperatorReadsBoundedInBytes(t *testing.T) {
	t.Parallel()
	for _, d := range testdb.Dialects() {
		t.Run(d.Name+"/events", func(t *testing.T) {
			t.Parallel()
			f := setup(t, d.Name)
			env := f.env
			id, tok := f.running(t, "status_check")
			// 100 log lines of the largest message: 1.6 MB, more than a page.
			const lines = 100
			line := strings.Repeat("y", wire.MaxMessageBytes)
			for batch := range 4 {
				es := make([]wire.LogEntry, lines/4)
				for i := range es {
					es[i] = wire.LogEntry{Seq: int64(batch*lines/4 + i + 1), Message: line}
				}
				if st, b := post(t, f.node, "/workers/jobs/"+id+"/logs", wire.LogsRequest{LeaseToken: tok, Entries: es}); st != http.StatusOK {
					t.Fatalf("logs: %d %s", st, b)
				}
			}
			got, pages := 0, 0
			after := int64(0)
			for {
				st, b := env.Operator(t, "GET", fmt.Sprintf("/operator/jobs/%s?events_after=%d", id, after), nil)
				if st != http.StatusOK {
					t.Fatalf("job: %d %s", st, b)
				}
				if len(b) > wire.MaxPageBytes+64<<10 {
					t.Errorf("a job read of %d bytes", len(b))
				}
				out := decode[wire.JobDetailResponse](t, b)
				got += len(out.Events)
				pages++
				if out.EventsNext == nil {
					break
				}
				after = *out.EventsNext
				if pages > lines {
					t.Fatal("the pages do not end")
				}
			}
			if got != lines || pages < 2 {
				t.Errorf("%d events in %d pages, want %d in 2 or more", got, pages, lines)
			}
		})

		// More artifacts than a job read carries: the first
		// MaxJobArtifacts, then the rest through artifacts_next.
		t.Run(d.Name+"/artifacts", func(t *testing.T) {
			t.Parallel()
			f := setup(t, d.Name)
			env := f.env
			id, tok := f.running(t, "status_check")
			for i := range wire.MaxJobArtifacts + 3 {
				reportArtifact(t, f.node, id, tok, "checkpoint", fmt.Sprintf("ckpt-%03d", i))
			}
			detail := decode[wire.JobDetailResponse](t, mustGet(t, env, "/operator/jobs/"+id))
			if len(detail.Artifacts) != wire.MaxJobArtifacts || detail.ArtifactsNext == nil {
				t.Fatalf("a job read carries %d artifacts, next %v; want %d and a cursor", len(detail.Artifacts), detail.ArtifactsNext, wire.MaxJobArtifacts)
			}
			rest := decode[wire.ArtifactListResponse](t, mustGet(t, env, "/operator/artifacts?job_id="+id+"&after="+*detail.ArtifactsNext))
			// Ids order artifacts by the millisecond they were made in,
			// and those of one millisecond at random: the two reads
			// together hold each artifact once.
			seen := map[string]int{}
			for _, a := range append(detail.Artifacts, rest.Artifacts...) {
				seen[a.Name]++
			}
			if len(rest.Artifacts) != 3 || len(seen) != wire.MaxJobArtifacts+3 {
				t.Fatalf("the artifacts after the job read: %+v; %d distinct names in both reads, want %d", rest.Artifacts, len(seen), wire.MaxJobArtifacts+3)
			}
			for name, n := range seen {
				if n != 1 {
					t.Errorf("artifact %s read %d times", name, n)
				}
			}
		})

		// Jobs with the largest payloads a body allows.
		t.Run(d.Name+"/payloads", func(t *testing.T) {
			t.Parallel()
			env := setup(t, d.Name).env
			payload := json.RawMessage(`{"p":"` + strings.Repeat("z", 300<<10) + `"}`)
			for range 5 {
				dispatchJob(t, env, obj{"job_type": "telemetry_sync", "payload": payload})
			}
			got, pages := 0, 0
			next := ""
			for {
				st, b := env.Operator(t, "GET", "/operator/jobs?job_type=telemetry_sync&limit=1000&after="+next, nil)
				if st != http.StatusOK {
					t.Fatalf("jobs: %d %s", st, b)
				}
				if len(b) > wire.MaxPageBytes+400<<10 {
					t.Errorf("a job list of %d bytes", len(b))
				}
				out := decode[wire.JobListResponse](t, b)
				got += len(out.Jobs)
				pages++
				if out.Next == nil {
					break
				}
				next = *out.Next
				if pages > 10 {
					t.Fatal("the pages do not end")
				}
			}
			if got != 5 || pages < 2 {
				t.Errorf("%d jobs in %d pages, want 5 in 2 or more", got, pages)
			}
		})
	}
}

// mustGet reads an operator route that must answer 200.
func mustGet(t *testing.T, env *apitest.Env, path string) []byte {
	t.Helper()
	st, b := env.Operator(t, "GET", path, nil)
	if st != http.StatusOK {
		t.Fatalf("GET %s: %d %s", path, st, b)
	}
	return b
}

// TestLongPollOutlivesReadTimeout checks that a host's http.Server.ReadTimeout
// (cmd/server sets one) bounds reading a request, not a long-poll
// that waits after it.
func TestLongPollOutlivesReadTimeout(t *testing.T) {
	t.Parallel()
	f := setup(t, "sqlite")
	hs := httptest.NewUnstartedServer(f.env.Server.Handler())
	hs.Config.ReadTimeout = 500 * time.Millisecond
	hs.Start()
	t.Cleanup(hs.Close)
	r := f.node.Request(t, http.MethodPost, wire.PathLease, wire.LeaseRequest{SupportedJobTypes: []string{"status_check"}, WaitSeconds: 2})
	u, _ := url.Parse(hs.URL)
	r.URL.Host = u.Host // Host, which the signature covers, stays the Env's
	start := time.Now()
	resp, b := f.node.Raw(t, r)
	if resp.StatusCode != http.StatusOK || time.Since(start) < 1500*time.Millisecond {
		t.Errorf("long-poll: %d after %v: %s", resp.StatusCode, time.Since(start), b)
	}
}

// BenchmarkLogs measures one logs request of n and 10n entries over HTTP
// on SQLite: ns/op grows about tenfold.
func BenchmarkLogs(b *testing.B) {
	for _, n := range []int{100, 1000} {
		b.Run(fmt.Sprintf("entries=%d", n), func(b *testing.B) {
			env := apitest.New(b, "sqlite", apitest.WithConfig(func(c *workerapi.Config) { c.Lease.LeaseTTL = time.Hour }))
			node := env.NewNode(b, "bench")
			node.Register(b, wire.RegisterRequest{Capabilities: wire.Capabilities{JobTypes: []string{"status_check"}}})
			j := env.Enqueue(b, lease.NewJob{Type: "status_check"})
			resp, body := node.Do(b, http.MethodPost, wire.PathLease, wire.LeaseRequest{})
			var lr wire.LeaseResponse
			if err := json.Unmarshal(body, &lr); err != nil || lr.LeaseToken == nil {
				b.Fatalf("lease: %d %s", resp.StatusCode, body)
			}
			path := "/workers/jobs/" + j.ID + "/logs"
			node.Do(b, http.MethodPost, "/workers/jobs/"+j.ID+"/accept", wire.TokenRequest{LeaseToken: *lr.LeaseToken})
			seq := int64(0)
			// Each request is signed beforehand: signing is the worker's cost.
			reqs := make([]*http.Request, 0, b.N)
			for range b.N {
				es := make([]wire.LogEntry, n)
				for i := range es {
					seq++
					es[i] = wire.LogEntry{Seq: seq, Message: "epoch 1 step 100 loss 0.1234"}
				}
				reqs = append(reqs, node.Request(b, http.MethodPost, path, wire.LogsRequest{LeaseToken: *lr.LeaseToken, Entries: es}))
			}
			b.ResetTimer()
			for _, r := range reqs {
				if resp, body := node.Raw(b, r); resp.StatusCode != http.StatusOK {
					b.Fatalf("logs: %d %s", resp.StatusCode, body)
				}
			}
		})
	}
}
