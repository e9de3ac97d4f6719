package receipts_test

import (
	"bytes"
	"errors"
	"flag"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/nodelane/nodelane/receipts"
)

var update = flag.Bool("update", false, "rewrite the golden files in testdata")

var t0 = time.Date(2026, 11, 30, 9, 0, 0, 0, time.UTC)

const hashA = "9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08"

// golden returns one receipt of every kind, with every field its kind
// allows set, except where an optional field is left out on purpose.
func golden() map[receipts.Kind]receipts.Receipt {
	base := func(k receipts.Kind) receipts.Receipt {
		return receipts.Receipt{ID: "rcp_" + string(k), Kind: k, PolicyVersion: 3, ServerTime: t0.Add(1500 * time.Millisecond)}
	}
	rs := map[receipts.Kind]receipts.Receipt{}
	r := base(receipts.KindWorkerRegistered)
	r.WorkerID, r.NodeID, r.KeyID, r.CredentialID = "wrk_1", "studio-gpu-1", "mT2A1YDZUlAw3gjvSVpTGmOqDHjGrhB1mUd3zEV8D0o", "cred_worker"
	r.ProvisioningCredentialID = "cred_prov"
	rs[r.Kind] = r

	r = base(receipts.KindArtifactReported)
	r.JobID, r.WorkerID, r.LeaseID, r.LeaseEpoch, r.ArtifactID = "job_1", "wrk_1", "lse_1", 2, "art_1"
	r.ArtifactType, r.Name, r.URI = "adapter", "adapter.safetensors", "s3://bucket/a/adapter.safetensors"
	r.ChecksumSHA256, r.SizeBytes, r.MetadataSHA256 = hashA, 123456789, hashA
	rs[r.Kind] = r

	r = base(receipts.KindJobCompleted)
	r.JobID, r.WorkerID, r.LeaseID, r.JobType, r.LeaseEpoch, r.Attempt = "job_1", "wrk_1", "lse_1", "lora_train", 2, 1
	r.StartedAt, r.EndedAt, r.OutputURI, r.MetricsSHA256 = t0, t0.Add(1234*time.Millisecond), "s3://bucket/out/", hashA
	rs[r.Kind] = r

	c, err := receipts.NewCharge(t0, t0.Add(1234*time.Millisecond), 1, 1_802_000)
	if err != nil {
		panic(err)
	}
	r = c.Receipt("job_1", "wrk_1", "rtx-4090")
	r.ID, r.PolicyVersion, r.ServerTime, r.LeaseID = "rcp_job_charged", 3, t0.Add(1500*time.Millisecond), "lse_1"
	rs[r.Kind] = r

	r = base(receipts.KindJobFailed)
	r.JobID, r.WorkerID, r.LeaseID, r.JobType, r.LeaseEpoch, r.Attempt = "job_2", "wrk_1", "lse_2", "lora_train", 1, 1
	r.ErrorCode, r.Outcome, r.PayloadSHA256 = "oom", receipts.OutcomeRequeued, hashA
	r.StartedAt, r.EndedAt = t0, t0.Add(time.Minute)
	rs[r.Kind] = r

	r = base(receipts.KindEnvelopeActivated)
	r.PolicyVersion, r.Actor, r.Reason, r.Until = 4, "operator-1", "night run: LoRA \"α\"\tbatch\n", t0.Add(8*time.Hour)
	rs[r.Kind] = r

	r = base(receipts.KindEnvelopeDeactivated)
	r.PolicyVersion, r.Actor, r.Reason = 5, "system", "activation expired"
	rs[r.Kind] = r

	r = base(receipts.KindCredentialMinted)
	r.CredentialID, r.PrincipalID, r.Scopes, r.Actor, r.ExpiresAt = "cred_1", "studio-gpu-1", "node:heartbeat node:poll", "operator-1", t0.Add(30*24*time.Hour)
	rs[r.Kind] = r

	r = base(receipts.KindCredentialRevoked)
	r.CredentialID, r.PrincipalID, r.Actor, r.Reason = "cred_1", "studio-gpu-1", "operator-1", "leaked"
	rs[r.Kind] = r

	r = base(receipts.KindPrincipalCreated)
	r.PrincipalID, r.Actor, r.Name = "ci-deployer", "operator-1", "CI “deploy” bot"
	rs[r.Kind] = r

	r = base(receipts.KindWorkerBanned)
	r.WorkerID, r.NodeID, r.Actor, r.Reason = "wrk_1", "studio-gpu-1", "operator-1", "tampering"
	rs[r.Kind] = r

	r = base(receipts.KindWorkerUnbanned)
	r.WorkerID, r.NodeID, r.Actor = "wrk_1", "studio-gpu-1", "operator-1"
	rs[r.Kind] = r

	r = base(receipts.KindWorkerApproved)
	r.WorkerID, r.NodeID, r.Actor, r.Reason = "wrk_1", "studio-gpu-1", "operator-1", "racked in lab 2"
	r.JobTypes, r.Tags = "embedding_dry_run status_check", "eu lab"
	rs[r.Kind] = r

	r = base(receipts.KindWorkerRetired)
	r.WorkerID, r.NodeID, r.Actor, r.Reason = "wrk_1", "studio-gpu-1", "operator-1", "decommissioned"
	rs[r.Kind] = r

	r = base(receipts.KindWorkerUpdated)
	r.WorkerID, r.NodeID = "wrk_1", "studio-gpu-1"
	r.OldJobTypes, r.JobTypes = "status_check", "lora_train status_check"
	r.Tags = "eu"
	r.OldGPUs, r.GPUs = "rtx-4090:24576", "rtx-4090:24576 rtx-4090:24576"
	r.OldMaxJobs, r.MaxJobs, r.MaxVRAMMB = 1, 2, 20000
	rs[r.Kind] = r

	r = base(receipts.KindJobRetried)
	r.JobID, r.JobType, r.Actor, r.Reason, r.ErrorCode = "job_1", "lora_train", "operator-1", "driver fixed", "oom"
	rs[r.Kind] = r

	r = base(receipts.KindEnvelopeSafeTypesChanged)
	r.PolicyVersion, r.Actor, r.Reason = 6, "operator-1", "our own eval job"
	r.OldJobTypes, r.JobTypes = "embedding_dry_run status_check", "embedding_dry_run eval_run status_check"
	rs[r.Kind] = r

	r = base(receipts.KindNodeAudit)
	r.WorkerID, r.NodeID, r.EventType, r.OccurredAt, r.PayloadSHA256 = "wrk_1", "studio-gpu-1", "driver_update", t0.Add(-time.Minute+7*time.Microsecond), hashA
	rs[r.Kind] = r
	return rs
}

// TestGolden pins the canonical bytes of one receipt of every kind.
// Run with -update to rewrite testdata after a deliberate change.
func TestGolden(t *testing.T) {
	t.Parallel()
	rs := golden()
	if len(rs) != len(receipts.Kinds()) {
		t.Fatalf("golden has %d kinds, the package %d", len(rs), len(receipts.Kinds()))
	}
	for _, k := range receipts.Kinds() {
		t.Run(string(k), func(t *testing.T) {
			t.Parallel()
			r, ok := rs[k]
			if !ok {
				t.Fatalf("no golden receipt of kind %s", k)
			}
			got, err := r.Encode()
			if err != nil {
				t.Fatalf("Encode: %v", err)
			}
			path := filepath.Join("testdata", string(k)+".json")
			if *update {
				if err := os.WriteFile(path, got, 0o644); err != nil {
					t.Fatal(err)
				}
			}
			want, err := os.ReadFile(path)
			if err != nil {
				t.Fatalf("%v (run go test -update to create it)", err)
			}
			if !bytes.Equal(got, want) {
				t.Errorf("Encode changed the bytes of %s:\n got %s\nwant %s", k, got, want)
			}
			back, err := receipts.Decode(want)
			if err != nil {
				t.Fatalf("Decode(golden): %v", err)
			}
			if d := cmp.Diff(r, *back); d != "" {
				t.Errorf("Decode(Encode(r)) != r (-want +got):\n%s", d)
			}
		})
	}
}

// jobCharged is the golden job_charged body, for negative cases to edit.
func jobCharged(t *testing.T) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("testdata", "job_charged.json"))
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

func TestDecodeRejects(t *testing.T) {
	t.Parallel()
	charged := jobCharged(t)
	edit := func(old, new string) string {
		t.Helper()
		if !strings.Contains(charged, old) {
			t.Fatalf("golden job_charged has no %q", old)
		}
		return strings.Replace(charged, old, new, 1)
	}
	audit := `{"event_type":"e","id":"r","kind":"node_audit","occurred_at":"2026-11-30T09:00:00.000000Z","payload_sha256":"` + hashA +
		`","policy_version":1,"server_time":"2026-11-30T09:00:00.000000Z","v":1,"worker_id":"w"}`
	if _, err := receipts.Decode([]byte(audit)); err != nil {
		t.Fatalf("the base audit receipt does not decode: %v", err)
	}
	auditEdit := func(old, new string) string {
		t.Helper()
		if !strings.Contains(audit, old) {
			t.Fatalf("audit has no %q", old)
		}
		return strings.Replace(audit, old, new, 1)
	}
	tests := []struct {
		name string
		body string
		want error
	}{
		{"float", edit(`"actual_ms":1234`, `"actual_ms":1234.0`), receipts.ErrNotCanonical},
		{"exponent", edit(`"actual_ms":1234`, `"actual_ms":1.234e3`), receipts.ErrNotCanonical},
		{"exponent on an integer", edit(`"actual_ms":1234`, `"actual_ms":1234e0`), receipts.ErrNotCanonical},
		{"negative", edit(`"gpu_count":1`, `"gpu_count":-1`), receipts.ErrNotCanonical},
		{"negative money", edit(`"actual_cost_usd":"0.000618"`, `"actual_cost_usd":"-0.000618"`), receipts.ErrNotCanonical},
		{"leading zero", edit(`"gpu_count":1`, `"gpu_count":01`), receipts.ErrNotCanonical},
		{"boolean", edit(`"gpu_count":1`, `"gpu_count":true`), receipts.ErrNotCanonical},
		{"null", edit(`"gpu_sku":"rtx-4090"`, `"gpu_sku":null`), receipts.ErrNotCanonical},
		{"array", edit(`"gpu_sku":"rtx-4090"`, `"gpu_sku":["rtx-4090"]`), receipts.ErrNotCanonical},
		{"nested object", edit(`"gpu_sku":"rtx-4090"`, `"gpu_sku":{"sku":"rtx-4090"}`), receipts.ErrNotCanonical},
		{"duplicate key", edit(`"gpu_count":1,`, `"gpu_count":1,"gpu_count":1,`), receipts.ErrNotCanonical},
		{"unknown kind", auditEdit(`"kind":"node_audit"`, `"kind":"node_audited"`), receipts.ErrNotCanonical},
		{"missing kind", auditEdit(`"kind":"node_audit",`, ``), receipts.ErrNotCanonical},
		{"missing required field", auditEdit(`"event_type":"e",`, ``), receipts.ErrNotCanonical},
		{"missing id", auditEdit(`"id":"r",`, ``), receipts.ErrNotCanonical},
		{"missing v", auditEdit(`,"v":1`, ``), receipts.ErrNotCanonical},
		{"v 2", auditEdit(`"v":1`, `"v":2`), receipts.ErrNotCanonical},
		{"field of another kind", auditEdit(`"v":1,`, `"v":1,"job_id":"j",`), receipts.ErrNotCanonical},
		{"unknown field", auditEdit(`"v":1,`, `"v":1,"w":"x",`), receipts.ErrNotCanonical},
		{"empty optional field", auditEdit(`"kind":"node_audit",`, `"kind":"node_audit","node_id":"",`), receipts.ErrNotCanonical},
		{"empty required field", auditEdit(`"event_type":"e"`, `"event_type":""`), receipts.ErrNotCanonical},
		{"integer above 2^53-1", auditEdit(`"policy_version":1`, `"policy_version":9007199254740992`), receipts.ErrNotCanonical},
		{"integer as a string", auditEdit(`"policy_version":1`, `"policy_version":"1"`), receipts.ErrNotCanonical},
		{"string as an integer", auditEdit(`"worker_id":"w"`, `"worker_id":7`), receipts.ErrNotCanonical},
		{"unsorted keys", `{"id":"r","event_type":"e"` + audit[len(`{"event_type":"e","id":"r"`):], receipts.ErrNotCanonical},
		{"whitespace", auditEdit(`"v":1`, `"v": 1`), receipts.ErrNotCanonical},
		{"trailing newline", audit + "\n", receipts.ErrNotCanonical},
		{"leading whitespace", " " + audit, receipts.ErrNotCanonical},
		{"escaped slash", auditEdit(`"event_type":"e"`, `"event_type":"a\/b"`), receipts.ErrNotCanonical},
		{"escaped letter", auditEdit(`"event_type":"e"`, `"event_type":"\u0065"`), receipts.ErrNotCanonical},
		{"uppercase unicode escape", auditEdit(`"event_type":"e"`, `"event_type":"\u001F"`), receipts.ErrNotCanonical},
		{"unicode escape with a short form", auditEdit(`"event_type":"e"`, `"event_type":"\u000a"`), receipts.ErrNotCanonical},
		{"raw control character", auditEdit(`"event_type":"e"`, "\"event_type\":\"\x01\""), receipts.ErrNotCanonical},
		{"invalid UTF-8", auditEdit(`"event_type":"e"`, "\"event_type\":\"\xff\""), receipts.ErrNotCanonical},
		{"lone surrogate", auditEdit(`"event_type":"e"`, `"event_type":"\ud800"`), receipts.ErrNotCanonical},
		{"escaped non-ASCII", auditEdit(`"event_type":"e"`, `"event_type":"\u00e9"`), receipts.ErrNotCanonical},
		{"uppercase hex hash", auditEdit(hashA, strings.ToUpper(hashA)), receipts.ErrNotCanonical},
		{"short hash", auditEdit(hashA, hashA[2:]), receipts.ErrNotCanonical},
		{"time without fraction", auditEdit(`"occurred_at":"2026-11-30T09:00:00.000000Z"`, `"occurred_at":"2026-11-30T09:00:00Z"`), receipts.ErrNotCanonical},
		{"time with an offset", auditEdit(`"occurred_at":"2026-11-30T09:00:00.000000Z"`, `"occurred_at":"2026-11-30T10:00:00.000000+01:00"`), receipts.ErrNotCanonical},
		{"time with nanoseconds", auditEdit(`"occurred_at":"2026-11-30T09:00:00.000000Z"`, `"occurred_at":"2026-11-30T09:00:00.000000000Z"`), receipts.ErrNotCanonical},
		{"money with five decimals", edit(`"rate_usd_per_gpu_hour":"1.802000"`, `"rate_usd_per_gpu_hour":"1.80300"`), receipts.ErrNotCanonical},
		{"money as an integer", edit(`"rate_usd_per_gpu_hour":"1.802000"`, `"rate_usd_per_gpu_hour":1803000`), receipts.ErrNotCanonical},
		{"empty body", ``, receipts.ErrNotCanonical},
		{"not an object", `[]`, receipts.ErrNotCanonical},
		{"two objects", audit + audit, receipts.ErrNotCanonical},
		{"truncated", audit[:len(audit)-1], receipts.ErrNotCanonical},
		{"over the size limit", auditEdit(`"event_type":"e"`, `"event_type":"`+strings.Repeat("e", receipts.MaxBodySize)+`"`), receipts.ErrNotCanonical},

		{"cost that disagrees", edit(`"actual_cost_usd":"0.000618"`, `"actual_cost_usd":"0.000617"`), receipts.ErrInconsistent},
		{"zero cost", edit(`"actual_cost_usd":"0.000618"`, `"actual_cost_usd":"0.000000"`), receipts.ErrInconsistent},
		{"hours that disagree", edit(`"actual_hours":"0.000343"`, `"actual_hours":"0.000342"`), receipts.ErrInconsistent},
		{"actual_ms that disagrees", edit(`"actual_ms":1234`, `"actual_ms":1233`), receipts.ErrInconsistent},
		{"rate that disagrees", edit(`"rate_usd_per_gpu_hour":"1.802000"`, `"rate_usd_per_gpu_hour":"1.902000"`), receipts.ErrInconsistent},
		{"gpu count that disagrees", edit(`"gpu_count":1`, `"gpu_count":2`), receipts.ErrInconsistent},
		{"end before start", edit(`"ended_at":"2026-11-30T09:00:01.234000Z"`, `"ended_at":"2026-11-30T08:59:59.000000Z"`), receipts.ErrInconsistent},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			r, err := receipts.Decode([]byte(tc.body))
			if !errors.Is(err, tc.want) {
				t.Fatalf("Decode = %v, %v; want %v", r, err, tc.want)
			}
		})
	}
}

func TestEncodeRejects(t *testing.T) {
	t.Parallel()
	ok := golden()[receipts.KindJobCompleted]
	tests := []struct {
		name   string
		mutate func(*receipts.Receipt)
		want   error
	}{
		{"unknown kind", func(r *receipts.Receipt) { r.Kind = "job_teleported" }, receipts.ErrInvalidArgument},
		{"no id", func(r *receipts.Receipt) { r.ID = "" }, receipts.ErrInvalidArgument},
		{"no server time", func(r *receipts.Receipt) { r.ServerTime = time.Time{} }, receipts.ErrInvalidArgument},
		{"year 10000", func(r *receipts.Receipt) { r.ServerTime = time.Date(10000, 1, 1, 0, 0, 0, 0, time.UTC) }, receipts.ErrInvalidArgument},
		{"negative policy version", func(r *receipts.Receipt) { r.PolicyVersion = -1 }, receipts.ErrInvalidArgument},
		{"missing required string", func(r *receipts.Receipt) { r.JobType = "" }, receipts.ErrInvalidArgument},
		{"missing required time", func(r *receipts.Receipt) { r.StartedAt = time.Time{} }, receipts.ErrInvalidArgument},
		{"field of another kind", func(r *receipts.Receipt) { r.RateMicros = 1 }, receipts.ErrInvalidArgument},
		{"negative integer", func(r *receipts.Receipt) { r.Attempt = -1 }, receipts.ErrInvalidArgument},
		{"integer above 2^53-1", func(r *receipts.Receipt) { r.LeaseEpoch = receipts.MaxInt + 1 }, receipts.ErrInvalidArgument},
		{"invalid UTF-8", func(r *receipts.Receipt) { r.OutputURI = "s3://\xff" }, receipts.ErrInvalidArgument},
		{"bad hash", func(r *receipts.Receipt) { r.MetricsSHA256 = "abc" }, receipts.ErrInvalidArgument},
		{"ended before started", func(r *receipts.Receipt) { r.EndedAt = r.StartedAt.Add(-time.Microsecond) }, receipts.ErrInconsistent},
		{"failure outcome", func(r *receipts.Receipt) {
			*r = golden()[receipts.KindJobFailed]
			r.Outcome = "retried"
		}, receipts.ErrInconsistent},
		{"charge cost", func(r *receipts.Receipt) {
			*r = golden()[receipts.KindJobCharged]
			r.CostMicros++
		}, receipts.ErrInconsistent},
		{"charge overflow", func(r *receipts.Receipt) {
			*r = golden()[receipts.KindJobCharged]
			r.RateMicros = 1 << 62
			r.GPUCount = 1 << 40
		}, receipts.ErrInconsistent},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			r := ok
			tc.mutate(&r)
			if b, err := r.Encode(); !errors.Is(err, tc.want) {
				t.Fatalf("Encode = %s, %v; want %v", b, err, tc.want)
			}
			if err := r.Check(); !errors.Is(err, tc.want) {
				t.Errorf("Check = %v, want %v", err, tc.want)
			}
		})
	}
}

// Every string round-trips, escaped as RFC 8785 escapes it.
func TestStringEscapes(t *testing.T) {
	t.Parallel()
	tests := []struct{ in, want string }{
		{"plain", `plain`},
		{`q"b\`, `q\"b\\`},
		{"\b\t\n\f\r", `\b\t\n\f\r`},
		{"\x00\x01\x0b\x1f", `\u0000\u0001\u000b\u001f`},
		{"/\x7f", "/\x7f"},
		{"é€😀\u2028", "é€😀\u2028"},
	}
	for _, tc := range tests {
		r := golden()[receipts.KindEnvelopeDeactivated]
		r.Reason = tc.in
		b, err := r.Encode()
		if err != nil {
			t.Fatalf("Encode(%q): %v", tc.in, err)
		}
		if want := `"reason":"` + tc.want + `"`; !strings.Contains(string(b), want) {
			t.Errorf("Encode(%q) = %s, want it to contain %s", tc.in, b, want)
		}
		back, err := receipts.Decode(b)
		if err != nil {
			t.Fatalf("Decode(%s): %v", b, err)
		}
		if back.Reason != tc.in {
			t.Errorf("reason %q came back as %q", tc.in, back.Reason)
		}
	}
	// Every byte below 0x80 and a few beyond round-trip.
	var all strings.Builder
	for c := range 0x80 {
		all.WriteByte(byte(c))
	}
	all.WriteString("ü漢")
	r := golden()[receipts.KindEnvelopeDeactivated]
	r.Reason = all.String()
	b, err := r.Encode()
	if err != nil {
		t.Fatal(err)
	}
	if back, err := receipts.Decode(b); err != nil || back.Reason != r.Reason {
		t.Errorf("Decode(Encode(every ASCII byte)) = %v, %v", back, err)
	}
}

// Times finer than a microsecond, or not in UTC, are encoded as UTC
// microseconds.
func TestEncodeNormalizesTimes(t *testing.T) {
	t.Parallel()
	r := golden()[receipts.KindNodeAudit]
	want, _ := r.Encode()
	r.ServerTime = r.ServerTime.Add(999).In(time.FixedZone("X", 3600))
	r.OccurredAt = r.OccurredAt.Add(1)
	got, err := r.Encode()
	if err != nil || !bytes.Equal(got, want) {
		t.Errorf("Encode = %s, %v; want %s", got, err, want)
	}
}

func TestPayloadSHA256(t *testing.T) {
	t.Parallel()
	a, err := receipts.PayloadSHA256([]byte(`{"loss": 0.12,
		"step": 5}`))
	if err != nil {
		t.Fatal(err)
	}
	b, _ := receipts.PayloadSHA256([]byte(`{"loss":0.12,"step":5}`))
	if a != b || len(a) != 64 {
		t.Errorf("whitespace changed the hash: %s vs %s", a, b)
	}
	// sha256("null")
	if got, _ := receipts.PayloadSHA256(nil); got != "74234e98afe7498fb5daf1f36ac2d78acc339464f950703b8c019892f982b90b" {
		t.Errorf("PayloadSHA256(nil) = %s, want the hash of null", got)
	}
	// sha256("{}")
	if got, _ := receipts.PayloadSHA256([]byte(" {} ")); got != "44136fa355b3678a1146ad16f7e8649e94fb4fc21fe77e8310c060f61caaff8a" {
		t.Errorf("PayloadSHA256({}) = %s", got)
	}
	if _, err := receipts.PayloadSHA256([]byte(`{"a":`)); !errors.Is(err, receipts.ErrInvalidArgument) {
		t.Errorf("PayloadSHA256(invalid) err = %v, want ErrInvalidArgument", err)
	}
}

func FuzzDecode(f *testing.F) {
	for _, r := range golden() {
		b, _ := r.Encode()
		f.Add(b)
	}
	f.Add([]byte(`{"v":1}`))
	f.Add([]byte(`{"a":"\ud83d\ude00"}`))
	f.Fuzz(func(t *testing.T, body []byte) {
		r, err := receipts.Decode(body)
		if err != nil {
			if !errors.Is(err, receipts.ErrNotCanonical) && !errors.Is(err, receipts.ErrInconsistent) {
				t.Fatalf("Decode error %v is neither ErrNotCanonical nor ErrInconsistent", err)
			}
			return
		}
		// What decodes is exactly what Encode writes.
		again, err := r.Encode()
		if err != nil || !bytes.Equal(again, body) {
			t.Fatalf("Decode accepted %q, which encodes as %q (%v)", body, again, err)
		}
	})
}

// The example in the package documentation is a receipt Decode accepts.
func TestDocExample(t *testing.T) {
	t.Parallel()
	src, err := os.ReadFile("doc.go")
	if err != nil {
		t.Fatal(err)
	}
	_, after, ok := strings.Cut(string(src), "a job_charged receipt (one line, broken here):\n//\n")
	block, _, ok2 := strings.Cut(after, "\n//\n")
	if !ok || !ok2 {
		t.Fatal("the example is not where this test looks for it")
	}
	var body strings.Builder
	for _, line := range strings.Split(block, "\n") {
		body.WriteString(strings.TrimPrefix(line, "//\t"))
	}
	r, err := receipts.Decode([]byte(body.String()))
	if err != nil {
		t.Fatalf("the documented example does not decode: %v\n%s", err, body.String())
	}
	if r.Kind != receipts.KindJobCharged || r.CostMicros != 618 {
		t.Errorf("the documented example is %+v", r)
	}
}
