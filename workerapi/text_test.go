package workerapi_test

import (
	"context"
	"encoding/json"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/nodelane/nodelane/internal/apitest"
	"github.com/nodelane/nodelane/internal/testdb"
	"github.com/nodelane/nodelane/workerapi/wire"
)

// Characters a request may carry (PROTOCOL.md §5.14), over real HTTP on
// every dialect. The finding these tests reproduce: a NUL in an id, a
// job type, an event type or a name reached the database (PostgreSQL:
// 503 and an ERROR log line, on demand from any node; SQLite: stored),
// and a terminal escape in a node's name or hostname was stored for
// nodelanectl to print.

// textKind is what a field may hold.
type textKind int

const (
	// nameField holds no control character (ids, types, names, tags,
	// URIs).
	nameField textKind = iota
	// freeField is free text: anything but NUL.
	freeField
	// objectField is a JSON object kept as sent: no NUL in a string or a
	// member name.
	objectField
)

// charCase is one string field of one route.
type charCase struct {
	name string
	// path is a worker route ("{id}" stands for a running job of the
	// node, wire.PathRegister a registration of a new node) or, starting
	// with /operator, an operator route ("{worker}" stands for the node's
	// worker id).
	path  string
	kind  textKind
	field string // the field the refusal names
	body  func(tok, s string) any
}

func charCases() []charCase {
	reg := func(edit func(r *wire.RegisterRequest, s string)) func(string, string) any {
		return func(_, s string) any {
			r := registerRequest()
			edit(&r, s)
			return r
		}
	}
	start := func(edit func(r *wire.StartRequest, s string)) func(string, string) any {
		return func(_, s string) any {
			r := wire.StartRequest{Name: "n", Hostname: "h", Role: "r", Version: "v", Tags: []string{"lab"}, CurrentJobs: &[]string{}}
			edit(&r, s)
			return r
		}
	}
	at := time.Now()
	return []charCase{
		{"register: node_id", wire.PathRegister, nameField, "node_id", reg(func(r *wire.RegisterRequest, s string) { r.NodeID = s })},
		{"register: name", wire.PathRegister, nameField, "name", reg(func(r *wire.RegisterRequest, s string) { r.Name = s })},
		{"register: hostname", wire.PathRegister, nameField, "hostname", reg(func(r *wire.RegisterRequest, s string) { r.Hostname = s })},
		{"register: role", wire.PathRegister, nameField, "role", reg(func(r *wire.RegisterRequest, s string) { r.Role = s })},
		{"register: version", wire.PathRegister, nameField, "version", reg(func(r *wire.RegisterRequest, s string) { r.Version = s })},
		{"register: endpoint_url", wire.PathRegister, nameField, "endpoint_url", reg(func(r *wire.RegisterRequest, s string) { r.EndpointURL = &s })},
		{"register: a tag", wire.PathRegister, nameField, "tags[0]", reg(func(r *wire.RegisterRequest, s string) { r.Tags = []string{s} })},
		{"register: a gpu sku", wire.PathRegister, nameField, "capabilities.gpus[0].sku", reg(func(r *wire.RegisterRequest, s string) { r.Capabilities.GPUs[0].SKU = s })},
		{"register: a job type", wire.PathRegister, nameField, "capabilities.job_types[1]", reg(func(r *wire.RegisterRequest, s string) { r.Capabilities.JobTypes[1] = s })},
		{"register: current_jobs", wire.PathRegister, nameField, "current_jobs[0]", reg(func(r *wire.RegisterRequest, s string) { r.CurrentJobs = &[]string{s} })},

		{"start: name", wire.PathStart, nameField, "name", start(func(r *wire.StartRequest, s string) { r.Name = s })},
		{"start: hostname", wire.PathStart, nameField, "hostname", start(func(r *wire.StartRequest, s string) { r.Hostname = s })},
		{"start: a tag", wire.PathStart, nameField, "tags[0]", start(func(r *wire.StartRequest, s string) { r.Tags = []string{s} })},
		{"start: a job type", wire.PathStart, nameField, "capabilities.job_types[0]", start(func(r *wire.StartRequest, s string) { r.Capabilities.JobTypes = []string{s} })},

		{"heartbeat: status", wire.PathHeartbeat, nameField, "status", func(_, s string) any { return wire.HeartbeatRequest{Status: s} }},
		{"heartbeat: current_jobs", wire.PathHeartbeat, nameField, "current_jobs[0]", func(_, s string) any {
			return wire.HeartbeatRequest{Status: "idle", CurrentJobs: []string{s}}
		}},
		{"heartbeat: metrics", wire.PathHeartbeat, objectField, "metrics.gpu", func(_, s string) any {
			return obj{"status": "idle", "metrics": obj{"gpu": s}}
		}},
		{"signals: known_cancels", wire.PathSignals, nameField, "known_cancels[0]", func(_, s string) any {
			return wire.SignalsRequest{KnownCancels: []string{s}}
		}},
		{"lease: supported_job_types", wire.PathLease, nameField, "supported_job_types[0]", func(_, s string) any {
			return wire.LeaseRequest{SupportedJobTypes: []string{s}}
		}},
		{"lease: supported_gpu_skus", wire.PathLease, nameField, "supported_gpu_skus[0]", func(_, s string) any {
			return wire.LeaseRequest{SupportedGPUSKUs: []string{s}}
		}},

		{"status: event_type", "/workers/jobs/{id}/status", nameField, "event_type", func(tok, s string) any {
			return wire.StatusRequest{LeaseToken: tok, EventType: s}
		}},
		{"status: message", "/workers/jobs/{id}/status", freeField, "message", func(tok, s string) any {
			return wire.StatusRequest{LeaseToken: tok, EventType: "progress", Message: s}
		}},
		{"status: payload", "/workers/jobs/{id}/status", objectField, "payload.step[1]", func(tok, s string) any {
			return obj{"lease_token": tok, "event_type": "progress", "payload": obj{"step": []any{1, s}}}
		}},
		{"status: a payload member name", "/workers/jobs/{id}/status", objectField, "payload.a", func(tok, s string) any {
			return obj{"lease_token": tok, "event_type": "progress", "payload": obj{"a": obj{s: 1}}}
		}},
		{"status: lease_token", "/workers/jobs/{id}/status", nameField, "lease_token", func(tok, s string) any {
			return wire.StatusRequest{LeaseToken: tok + s, EventType: "progress"}
		}},
		{"logs: an entry's message", "/workers/jobs/{id}/logs", freeField, "entries[1].message", func(tok, s string) any {
			return wire.LogsRequest{LeaseToken: tok, Entries: []wire.LogEntry{{Seq: 1, Message: "ok"}, {Seq: 2, Message: s}}}
		}},
		{"logs: an entry's payload", "/workers/jobs/{id}/logs", objectField, "entries[0].payload.k", func(tok, s string) any {
			return obj{"lease_token": tok, "entries": []obj{{"seq": 1, "payload": obj{"k": s}}}}
		}},
		{"logs: one entry's message", "/workers/jobs/{id}/logs", freeField, "message", func(tok, s string) any {
			return wire.LogsRequest{LeaseToken: tok, Seq: ptr(int64(1)), Message: &s}
		}},
		{"artifacts: artifact_type", "/workers/jobs/{id}/artifacts", nameField, "artifact_type", func(tok, s string) any {
			return wire.ArtifactRequest{LeaseToken: tok, ArtifactType: s, Name: "a", URI: "s3://a"}
		}},
		{"artifacts: name", "/workers/jobs/{id}/artifacts", nameField, "name", func(tok, s string) any {
			return wire.ArtifactRequest{LeaseToken: tok, ArtifactType: "adapter", Name: s, URI: "s3://a"}
		}},
		{"artifacts: uri", "/workers/jobs/{id}/artifacts", nameField, "uri", func(tok, s string) any {
			return wire.ArtifactRequest{LeaseToken: tok, ArtifactType: "adapter", Name: "a", URI: "s3://a" + s}
		}},
		{"artifacts: metadata", "/workers/jobs/{id}/artifacts", objectField, "metadata.k", func(tok, s string) any {
			return obj{"lease_token": tok, "artifact_type": "adapter", "name": "a", "uri": "s3://a", "metadata": obj{"k": s}}
		}},
		{"uploads: artifact_type", "/workers/jobs/{id}/uploads", nameField, "artifact_type", func(tok, s string) any {
			return wire.UploadRequest{LeaseToken: tok, ArtifactType: s, Name: "a", SizeBytes: ptr(int64(1)), ChecksumSHA256: strings.Repeat("0", 64)}
		}},
		{"uploads: name", "/workers/jobs/{id}/uploads", nameField, "name", func(tok, s string) any {
			return wire.UploadRequest{LeaseToken: tok, ArtifactType: "adapter", Name: s, SizeBytes: ptr(int64(1)), ChecksumSHA256: strings.Repeat("0", 64)}
		}},
		{"complete: output_uri", "/workers/jobs/{id}/complete", nameField, "output_uri", func(tok, s string) any {
			return wire.CompleteRequest{LeaseToken: tok, OutputURI: &s}
		}},
		{"complete: final_message", "/workers/jobs/{id}/complete", freeField, "final_message", func(tok, s string) any {
			return wire.CompleteRequest{LeaseToken: tok, FinalMessage: &s}
		}},
		{"complete: metrics", "/workers/jobs/{id}/complete", objectField, "metrics.loss", func(tok, s string) any {
			return obj{"lease_token": tok, "metrics": obj{"loss": s}}
		}},
		{"complete many: job_id", wire.PathCompleteBatch, nameField, "completions[0].job_id", func(tok, s string) any {
			return wire.CompleteBatchRequest{Completions: []wire.Completion{{JobID: s, CompleteRequest: wire.CompleteRequest{LeaseToken: tok}}}}
		}},
		{"complete many: final_message", wire.PathCompleteBatch, freeField, "completions[0].final_message", func(tok, s string) any {
			return wire.CompleteBatchRequest{Completions: []wire.Completion{{JobID: "job_x", CompleteRequest: wire.CompleteRequest{LeaseToken: tok, FinalMessage: &s}}}}
		}},
		{"fail: error_code", "/workers/jobs/{id}/fail", nameField, "error_code", func(tok, s string) any {
			return wire.FailRequest{LeaseToken: tok, ErrorCode: s}
		}},
		{"fail: message", "/workers/jobs/{id}/fail", freeField, "message", func(tok, s string) any {
			return wire.FailRequest{LeaseToken: tok, ErrorCode: "oom", Message: s}
		}},
		{"fail: payload", "/workers/jobs/{id}/fail", objectField, "payload.k", func(tok, s string) any {
			return obj{"lease_token": tok, "error_code": "oom", "payload": obj{"k": s}}
		}},
		{"release: reason", "/workers/jobs/{id}/release", freeField, "reason", func(tok, s string) any {
			return wire.ReleaseRequest{LeaseToken: tok, Reason: s}
		}},
		{"audit: event_type", wire.PathAudit, nameField, "events[0].event_type", func(_, s string) any {
			return wire.AuditRequest{Events: []wire.AuditEvent{{EventType: s, OccurredAt: &at}}}
		}},
		{"audit: message", wire.PathAudit, freeField, "events[0].message", func(_, s string) any {
			return wire.AuditRequest{Events: []wire.AuditEvent{{EventType: "login", Message: s, OccurredAt: &at}}}
		}},
		{"audit: payload", wire.PathAudit, objectField, "events[0].payload.user", func(_, s string) any {
			return obj{"events": []obj{{"event_type": "login", "occurred_at": at, "payload": obj{"user": s}}}}
		}},

		{"dispatch: job_type", "/operator/jobs", nameField, "job_type", func(_, s string) any { return obj{"job_type": s} }},
		{"dispatch: gpu_sku", "/operator/jobs", nameField, "requirements.gpu_sku", func(_, s string) any {
			return obj{"job_type": "status_check", "requirements": obj{"gpu_sku": s}}
		}},
		{"dispatch: a tag", "/operator/jobs", nameField, "requirements.tags[0]", func(_, s string) any {
			return obj{"job_type": "status_check", "requirements": obj{"tags": []string{s}}}
		}},
		{"dispatch: payload", "/operator/jobs", objectField, "payload.prompt", func(_, s string) any {
			return obj{"job_type": "status_check", "payload": obj{"prompt": s}}
		}},
		{"dispatch many: job_type", "/operator/jobs/batch", nameField, "jobs[1].job_type", func(_, s string) any {
			return obj{"jobs": []obj{{"job_type": "status_check"}, {"job_type": s}}}
		}},
		{"ban: reason", "/operator/workers/{worker}/ban", freeField, "reason", func(_, s string) any { return obj{"reason": s} }},
		{"approve: job_types", "/operator/workers/{worker}/approve", nameField, "job_types[0]", func(_, s string) any {
			return obj{"job_types": []string{s}}
		}},
		{"approve: reason", "/operator/workers/{worker}/approve", freeField, "reason", func(_, s string) any { return obj{"reason": s} }},
		{"activate: reason", "/operator/envelope/activate", freeField, "reason", func(_, s string) any { return obj{"reason": s} }},
		{"principals: id", "/operator/principals", nameField, "id", func(_, s string) any { return obj{"id": "op" + s} }},
		{"principals: name", "/operator/principals", nameField, "name", func(_, s string) any { return obj{"id": "op-2", "name": s} }},
		{"credentials: principal", "/operator/credentials", nameField, "principal", func(_, s string) any {
			return obj{"principal": s, "scopes": []string{"operator:jobs"}}
		}},
		{"credentials: a scope", "/operator/credentials", nameField, "scopes[0]", func(_, s string) any {
			return obj{"principal": apitest.OperatorID, "scopes": []string{"operator:jobs" + s}}
		}},
	}
}

// The characters each kind of field refuses: a name refuses them all,
// free text and a kept object only NUL.
var badChars = []struct {
	name  string
	s     string
	kinds []textKind
}{
	{"NUL", "a\x00b", []textKind{nameField, freeField, objectField}},
	{"ESC[2J", "a\x1b[2Jb", []textKind{nameField}},
	{"OSC 52", "a\x1b]52;c;aGk=\x07b", []textKind{nameField}},
	{"newline", "a\nb", []textKind{nameField}},
	{"DEL", "a\x7fb", []textKind{nameField}},
	{"C1 CSI", "a\u009b2Jb", []textKind{nameField}},
}

func TestControlCharacters(t *testing.T) {
	t.Parallel()
	cases := charCases()
	for _, d := range testdb.Dialects() {
		t.Run(d.Name, func(t *testing.T) {
			t.Parallel()
			f := setup(t, d.Name)
			env := f.env
			id, tok := f.running(t, "status_check")
			newNode := env.NewNode(t, "new-node")
			for _, tc := range cases {
				for _, bc := range badChars {
					if !containsKind(bc.kinds, tc.kind) {
						continue
					}
					t.Run(tc.name+": "+bc.name, func(t *testing.T) {
						before := env.Dump(t)
						body := tc.body(tok, bc.s)
						var st int
						var b []byte
						switch {
						case tc.path == wire.PathRegister:
							r := body.(wire.RegisterRequest)
							if r.NodeID == "" {
								r.NodeID = newNode.NodeID
							}
							r.PublicKey = newNode.PublicKey
							req := newNode.Request(t, http.MethodPost, wire.PathRegister, r)
							req.Header.Set("Authorization", "Bearer "+env.ProvisioningToken)
							resp, rb := newNode.Raw(t, req)
							st, b = resp.StatusCode, rb
						case strings.HasPrefix(tc.path, "/operator/"):
							st, b = env.Operator(t, http.MethodPost, strings.Replace(tc.path, "{worker}", f.node.WorkerID, 1), body)
						default:
							st, b = post(t, f.node, strings.Replace(tc.path, "{id}", id, 1), body)
						}
						refused(t, env, before, tc.name, st, b, http.StatusBadRequest, wire.CodeInvalidRequest, tc.field)
						if strings.ContainsAny(errorMessage(t, b), "\x00\x1b\x7f\u009b") {
							t.Errorf("the refusal %q echoes the character", errorMessage(t, b))
						}
					})
				}
			}
			// In the path and the query, once percent-decoded.
			for _, p := range []string{
				"/operator/jobs/job%00x",
				"/operator/workers/" + f.node.WorkerID + "%1b%5b2J",
				"/operator/jobs?job_type=a%00b",
				"/operator/jobs?tag=a%1bb",
			} {
				t.Run("GET "+p, func(t *testing.T) {
					before := env.Dump(t)
					st, b := env.Operator(t, http.MethodGet, p, nil)
					refused(t, env, before, p, st, b, http.StatusBadRequest, wire.CodeInvalidRequest)
				})
			}
			t.Run("a worker route's path", func(t *testing.T) {
				before := env.Dump(t)
				st, b := post(t, f.node, "/workers/jobs/"+id+"%00/status", wire.StatusRequest{LeaseToken: tok, EventType: "progress"})
				refused(t, env, before, "status", st, b, http.StatusBadRequest, wire.CodeInvalidRequest, "path")
			})
		})
	}
}

func containsKind(ks []textKind, k textKind) bool {
	for _, x := range ks {
		if x == k {
			return true
		}
	}
	return false
}

// Free text and kept objects carry what a job prints, escapes included:
// they are stored as sent, for whoever shows them to escape.
func TestFreeTextKeepsEscapes(t *testing.T) {
	t.Parallel()
	onDialects(t, func(t *testing.T, dialect string) {
		f := setup(t, dialect)
		id, tok := f.running(t, "status_check")
		line := "\x1b[31mred\x1b[0m\tdone\r\n\x1b]52;c;aGk=\x07"
		payload := json.RawMessage(`{"k":"\u001b[2J","t":"a\\u0000b"}`) // the second holds a backslash, not NUL
		st, b := post(t, f.node, wire.JobPath(id, wire.ActionLogs), wire.LogsRequest{LeaseToken: tok, Entries: []wire.LogEntry{{Seq: 1, Message: line, Payload: payload}}})
		if st != http.StatusOK {
			t.Fatalf("logs: %d %s", st, b)
		}
		st, b = post(t, f.node, wire.JobPath(id, wire.ActionStatus), wire.StatusRequest{LeaseToken: tok, EventType: "progress", Message: line})
		if st != http.StatusOK {
			t.Fatalf("status: %d %s", st, b)
		}
		found, err := f.env.DB.Bun().NewSelect().Table("nodelane_job_events").Where("job_id = ? AND message = ?", id, line).Count(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		if found != 2 {
			t.Errorf("%d events hold the line as sent, want 2", found)
		}
	})
}
