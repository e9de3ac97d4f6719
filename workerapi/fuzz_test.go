package workerapi

import (
	"bufio"
	"bytes"
	"context"
	"crypto/ed25519"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nodelane/nodelane/credential"
	"github.com/nodelane/nodelane/envelope"
	"github.com/nodelane/nodelane/fingerprint"
	"github.com/nodelane/nodelane/lease"
	"github.com/nodelane/nodelane/receipts"
	"github.com/nodelane/nodelane/replay"
	"github.com/nodelane/nodelane/workerapi/wire"
)

// FuzzHandler drives Server.Handler with random methods, request targets,
// headers and bodies over memory stores, from a control plane with an
// operator, a provisioner, a registered node and jobs queued, leased,
// running and blocked (newFuzzRig), so that deep paths are reached:
//
//   - placeholders in the target and the body stand for real values:
//     $JOB0 (queued), $JOB1 and $LEASE1 (leased, its lease token), $JOB2
//     and $LEASE2 (running), $JOB3 (lora_train, blocked), $WORKER, $NODE,
//     $PUBKEY (the node's key), $NEWPUBKEY (a key no node has), $OPERATOR,
//     $CRED (a credential id), $RECEIPT, $NOW, $FUTURE, $PAST;
//   - auth selects the bearer token (auth*), sig how the request is signed
//     (sig*); headers are extra "Name: value" lines.
//
// Every answer must be one the OpenAPI document lists for its route, with
// a body of its schema (responses strict: no field the document lacks),
// an error's code of its status; never a 5xx: with memory stores nothing
// is ever unavailable. A body the handlers accept must be one the
// document's request schema accepts; receipts, proofs and checkpoints in
// an answer must verify offline; a signed request that succeeded must
// answer 401 replayed_nonce when replayed; a completion sent twice must
// answer the same twice.
func FuzzHandler(f *testing.F) {
	f.Fuzz(func(t *testing.T, method, target string, auth, sig uint8, contentType, headers string, body []byte) {
		rig := newFuzzRig(t)
		target = rig.vars.Replace(target)
		body = []byte(rig.vars.Replace(string(body)))
		req, err := rig.request(method, target, auth, sig, contentType, headers, body)
		if err != nil {
			return // no server would read this request
		}
		rec := rig.serve(req)
		rig.check(req, rec)
		pattern, served := rig.checker.match(req)
		switch sig % 8 {
		case sigReplay:
			// The same request, headers and all.
			again, err := rig.request(method, target, auth, sigNone, "", "", body)
			if err != nil {
				t.Fatalf("rebuilding the request: %v", err)
			}
			again.Header = req.Header.Clone()
			rec2 := rig.serve(again)
			rig.check(again, rec2)
			if served && rig.signed[pattern] && rec.Code/100 == 2 &&
				(rec2.Code != http.StatusUnauthorized || fuzzErrorCode(rec2.Body.Bytes()) != wire.CodeReplayedNonce) {
				t.Fatalf("a replay of %s %s answered %d %s after %d", method, target, rec2.Code, rec2.Body, rec.Code)
			}
		case sigRepeat:
			// The same request, signed again. Only after a success: the
			// memory stores do not roll back what a failed request wrote
			// before it failed, which a real Transactor does.
			if rec.Code/100 != 2 {
				return
			}
			again, err := rig.request(method, target, auth, sigRepeat, contentType, headers, body)
			if err != nil {
				t.Fatalf("rebuilding the request: %v", err)
			}
			rec2 := rig.serve(again)
			rig.check(again, rec2)
			if pattern == "/workers/jobs/{id}/complete" && served && rec.Code == http.StatusOK &&
				(rec2.Code != http.StatusOK || !bytes.Equal(rec.Body.Bytes(), rec2.Body.Bytes())) {
				t.Fatalf("completing again answered %d\n%s\nafter 200\n%s", rec2.Code, rec2.Body, rec.Body)
			}
		}
	})
}

// The sig selectors of FuzzHandler.
const (
	sigNone   = iota
	sigWorker // signed by the registered node's key
	sigNewKey // signed by a key no node has registered ($NEWPUBKEY)
	sigTamper // signed by the node's key, then the body changes
	sigStale  // signed by the node's key ten minutes ago
	sigReplay // signed by the node's key and sent twice as is
	sigRepeat // signed by the node's key, and sent again signed anew
	sigLate   // signed by the node's key, then the fuzzed headers apply
)

// The auth selectors of FuzzHandler.
const (
	authNone           = iota
	authOperator       // every operator scope
	authWorker         // the node's worker token
	authProvisioner    // node:register
	authNarrowWorker   // the node, node:heartbeat only
	authNarrowOperator // operator:jobs only
	authRevoked        // a revoked operator token
	authFuzzed         // only what the fuzzed headers say
)

var fuzzEpoch = time.Date(2026, 11, 30, 9, 0, 0, 0, time.UTC)

// fuzzRand is a deterministic source of randomness, safe for concurrent
// use, so that every fuzz input replays the same.
type fuzzRand struct {
	mu sync.Mutex
	r  *rand.ChaCha8
}

func newFuzzRand(seed byte) *fuzzRand {
	var s [32]byte
	s[0] = seed
	return &fuzzRand{r: rand.NewChaCha8(s)}
}

func (r *fuzzRand) Read(p []byte) (int, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.r.Read(p)
}

// fuzzTx is a Transactor for the memory stores: it runs fn, and rolls
// nothing back. That is enough for fuzzing the handlers.
type fuzzTx struct{}

func (fuzzTx) InTx(ctx context.Context, fn func(context.Context) error) error { return fn(ctx) }

// newFuzzServer returns a Server over memory stores with the clock
// stopped at now, deterministic randomness and short waits. Its log goes
// to logs if not nil.
func newFuzzServer(t testing.TB, now time.Time, logs ...io.Writer) *Server {
	t.Helper()
	rnd := newFuzzRand(1)
	signer, _, err := receipts.GenerateKey(rnd, receipts.DefaultOrigin)
	if err != nil {
		t.Fatal(err)
	}
	logger := slog.New(slog.DiscardHandler)
	if len(logs) > 0 {
		logger = slog.New(slog.NewTextHandler(logs[0], &slog.HandlerOptions{Level: slog.LevelWarn}))
	}
	s, err := New(Stores{
		Tx:           fuzzTx{},
		Notifier:     NewLocalNotifier(),
		Leases:       lease.NewMemoryStore(),
		Credentials:  credential.NewMemoryStore(),
		Nonces:       replay.NewMemoryStore(nil),
		Envelope:     envelope.NewMemoryStore(),
		Receipts:     receipts.NewMemoryStore(),
		Fingerprints: fingerprint.NewMemoryStore(),
	}, Config{
		Peppers:       map[int][]byte{1: bytes.Repeat([]byte{0x5a}, 32)},
		PepperVersion: 1,
		ReceiptSigner: signer,
		Prices:        receipts.Prices{BySKU: map[string]int64{"rtx-4090": 1_800_000}},
		MaxWait:       time.Millisecond,
		ProofWait:     2 * time.Second,
		Logger:        logger,
		Now:           func() time.Time { return now },
		Rand:          rnd,
	})
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// fuzzRig is a control plane in a known state: an operator, a
// provisioner, a registered node, and jobs queued, leased, running and
// blocked.
type fuzzRig struct {
	t       testing.TB
	s       *Server
	h       http.Handler
	logs    *bytes.Buffer
	rnd     io.Reader
	key     ed25519.PrivateKey // the registered node's
	newKey  ed25519.PrivateKey // registered by no node
	tokens  map[uint8]string   // by auth selector
	vars    *strings.Replacer
	checker *openAPIChecker
	signed  map[string]bool // the signed route patterns
	bodies  map[*http.Request][]byte
}

func newFuzzRig(t testing.TB) *fuzzRig {
	t.Helper()
	ctx := context.Background()
	rig := &fuzzRig{t: t, logs: &bytes.Buffer{}, rnd: newFuzzRand(2), tokens: map[uint8]string{},
		checker: getOpenAPIChecker(t), signed: map[string]bool{}, bodies: map[*http.Request][]byte{}}
	rig.s = newFuzzServer(t, fuzzEpoch, rig.logs)
	rig.h = rig.s.Handler()
	for _, rt := range rig.s.workerRoutes() {
		rig.signed[rt.path] = rt.signed
	}
	rig.key = ed25519.NewKeyFromSeed(bytes.Repeat([]byte{1}, ed25519.SeedSize))
	rig.newKey = ed25519.NewKeyFromSeed(bytes.Repeat([]byte{2}, ed25519.SeedSize))

	is := rig.s.Issuer()
	mint := func(principal string, scopes ...credential.Scope) (string, *credential.Credential) {
		t.Helper()
		tok, c, err := is.Mint(ctx, principal, scopes, 0)
		if err != nil {
			t.Fatalf("minting %v for %s: %v", scopes, principal, err)
		}
		return tok, c
	}
	for _, id := range []string{"op-fuzz", "provisioner-fuzz"} {
		if _, err := is.CreatePrincipal(ctx, credential.Principal{ID: id, Kind: credential.KindOperator, Name: id}); err != nil {
			t.Fatal(err)
		}
	}
	rig.tokens[authOperator], _ = mint("op-fuzz", credential.ScopeOperatorJobs, credential.ScopeOperatorWorkers,
		credential.ScopeOperatorCredentials, credential.ScopeOperatorEnvelope, credential.ScopeOperatorReceipts)
	rig.tokens[authNarrowOperator], _ = mint("op-fuzz", credential.ScopeOperatorJobs)
	revoked, rc := mint("op-fuzz", credential.ScopeOperatorJobs, credential.ScopeOperatorWorkers)
	if _, err := is.Revoke(ctx, rc.ID); err != nil {
		t.Fatal(err)
	}
	rig.tokens[authRevoked] = revoked
	rig.tokens[authProvisioner], _ = mint("provisioner-fuzz", credential.ScopeNodeRegister)

	// The node registers over HTTP, as a worker would.
	pub := base64.RawURLEncoding.EncodeToString(rig.key.Public().(ed25519.PublicKey))
	var reg wire.RegisterResponse
	rig.setup(http.MethodPost, wire.PathRegister, authProvisioner, http.StatusCreated, &reg, `{"node_id": "fuzz-node-1",
		"name": "Fuzz-GPU", "hostname": "fuzz.local", "endpoint_url": null, "role": "local_gpu_compute",
		"capabilities": {"gpus": [{"sku": "rtx-4090", "vram_mb": 24576}], "job_types": ["status_check", "telemetry_sync", "lora_train"]},
		"governor_limits": {"max_jobs": 3, "max_vram_mb": 24576}, "tags": ["lab"], "version": "worker/1.0.0",
		"heartbeat_interval_seconds": 30, "public_key": "`+pub+`"}`)
	rig.tokens[authWorker] = reg.WorkerToken
	narrow, nc := mint(reg.WorkerID, credential.ScopeNodeHeartbeat)
	rig.tokens[authNarrowWorker] = narrow

	// Jobs: two leased, one of them accepted (running); then one queued
	// and one of a blocked type.
	dispatch := func(typ string) string {
		t.Helper()
		j, _, _, err := rig.s.Dispatch(ctx, lease.NewJob{Type: typ, Payload: json.RawMessage(`{"n":1}`),
			Requirements: lease.Requirements{GPUSKU: "rtx-4090", GPUCount: 1, MinVRAMMB: 1024}})
		if err != nil {
			t.Fatal(err)
		}
		return j.ID
	}
	job1, job2 := dispatch("status_check"), dispatch("telemetry_sync")
	var lr wire.LeaseResponse
	rig.setup(http.MethodPost, "/workers/jobs/lease", authWorker, http.StatusOK, &lr,
		`{"supported_job_types": ["status_check", "telemetry_sync"], "supported_gpu_skus": ["rtx-4090"], "max_jobs": 2}`)
	if len(lr.Leases) != 2 {
		t.Fatalf("setup: leased %d jobs, want 2", len(lr.Leases))
	}
	tokens := map[string]string{}
	for _, g := range lr.Leases {
		tokens[g.Job.ID] = g.LeaseToken
	}
	rig.setup(http.MethodPost, "/workers/jobs/"+job2+"/accept", authWorker, http.StatusOK, nil,
		`{"lease_token": "`+tokens[job2]+`"}`)
	job0, job3 := dispatch("status_check"), dispatch("lora_train")
	if _, err := rig.s.Sequence(ctx); err != nil {
		t.Fatal(err)
	}
	rs, err := rig.s.receipts.List(ctx, 0, 1)
	if err != nil || len(rs) != 1 {
		t.Fatalf("setup: listing receipts: %v", err)
	}
	rig.vars = strings.NewReplacer(
		"$NODE", "fuzz-node-1",
		"$WORKER", reg.WorkerID,
		"$PUBKEY", pub,
		"$NEWPUBKEY", base64.RawURLEncoding.EncodeToString(rig.newKey.Public().(ed25519.PublicKey)),
		"$OPERATOR", "op-fuzz",
		"$JOB0", job0,
		"$JOB1", job1,
		"$JOB2", job2,
		"$JOB3", job3,
		"$LEASE1", tokens[job1],
		"$LEASE2", tokens[job2],
		"$CRED", nc.ID,
		"$RECEIPT", rs[0].ID,
		"$NOW", fuzzEpoch.Format(time.RFC3339),
		"$FUTURE", fuzzEpoch.Add(time.Hour).Format(time.RFC3339),
		"$PAST", fuzzEpoch.Add(-time.Hour).Format(time.RFC3339),
	)
	rig.logs.Reset()
	return rig
}

// setup sends a signed request of the rig's setup, which must answer want.
func (rig *fuzzRig) setup(method, target string, auth uint8, want int, out any, body string) {
	rig.t.Helper()
	req, err := rig.request(method, target, auth, sigWorker, "application/json", "", []byte(body))
	if err != nil {
		rig.t.Fatal(err)
	}
	rec := rig.serve(req)
	if rec.Code != want {
		rig.t.Fatalf("setup: %s %s answered %d: %s", method, target, rec.Code, rec.Body)
	}
	if out != nil {
		if err := json.Unmarshal(rec.Body.Bytes(), out); err != nil {
			rig.t.Fatal(err)
		}
	}
}

// request reads the request a client would send, as a server reads it.
func (rig *fuzzRig) request(method, target string, auth, sig uint8, contentType, headers string, body []byte) (*http.Request, error) {
	var raw bytes.Buffer
	fmt.Fprintf(&raw, "%s %s HTTP/1.1\r\nHost: nodelane.test\r\n", method, target)
	if contentType != "" {
		fmt.Fprintf(&raw, "Content-Type: %s\r\n", contentType)
	}
	if tok, ok := rig.tokens[auth%8]; ok {
		fmt.Fprintf(&raw, "Authorization: Bearer %s\r\n", tok)
	} else if auth%8 == authNone && auth/8%2 == 1 {
		raw.WriteString("Authorization: Bearer nlc_notatoken\r\n")
	}
	fuzzed := ""
	for _, line := range strings.Split(headers, "\n") {
		if line = strings.TrimRight(line, "\r"); line != "" {
			fuzzed += line + "\r\n"
		}
	}
	if sig%8 != sigLate {
		raw.WriteString(fuzzed)
	}
	fmt.Fprintf(&raw, "Content-Length: %d\r\n\r\n", len(body))
	raw.Write(body)
	req, err := http.ReadRequest(bufio.NewReader(&raw))
	if err != nil {
		return nil, err
	}
	req.RemoteAddr = "192.0.2.1:1234"
	var key ed25519.PrivateKey
	created := fuzzEpoch
	switch sig % 8 {
	case sigNone:
	case sigNewKey:
		key = rig.newKey
	case sigStale:
		key, created = rig.key, fuzzEpoch.Add(-10*time.Minute)
	default:
		key = rig.key
	}
	if key != nil && len(req.Header.Values("Content-Type")) > 0 {
		nonce := make([]byte, replay.MinNonceSize)
		if _, err := io.ReadFull(rig.rnd, nonce); err != nil {
			return nil, err
		}
		if err := replay.NewSigner(key, nil).SignAt(req, body, created, nonce); err != nil {
			return nil, err
		}
	}
	rig.bodies[req] = body
	switch sig % 8 {
	case sigTamper:
		req.Body = io.NopCloser(bytes.NewReader(append(body, ' ')))
		req.ContentLength++
	case sigLate:
		late, err := http.ReadRequest(bufio.NewReader(strings.NewReader("GET / HTTP/1.1\r\nHost: x\r\n" + fuzzed + "\r\n")))
		if err != nil {
			return nil, err
		}
		for k, v := range late.Header {
			req.Header[k] = v
		}
	}
	return req, nil
}

func (rig *fuzzRig) serve(req *http.Request) *httptest.ResponseRecorder {
	rec := httptest.NewRecorder()
	rig.h.ServeHTTP(rec, req)
	return rec
}

// check fails the test if the answer to req is not one the document
// allows, or is 503: memory stores never fail.
func (rig *fuzzRig) check(req *http.Request, rec *httptest.ResponseRecorder) {
	rig.t.Helper()
	if rec.Code == http.StatusServiceUnavailable {
		rig.t.Fatalf("%s %s answered 503 %s\nlog:\n%s", req.Method, req.RequestURI, rec.Body, rig.logs)
	}
	if err := rig.checker.check(req, rec.Code, rec.Header(), rec.Body.Bytes()); err != nil {
		rig.t.Fatalf("%v\nlog:\n%s", err, rig.logs)
	}
	if err := rig.checker.checkAccepted(req, rec.Code, rig.bodies[req]); err != nil {
		rig.t.Fatal(err)
	}
	if pattern, served := rig.checker.match(req); served && rec.Code/100 == 2 {
		if err := rig.verifyReceipts(pattern, rec.Body.Bytes()); err != nil {
			rig.t.Fatalf("%s %s answered %d with receipts that do not verify offline: %v\n%s", req.Method, req.RequestURI, rec.Code, err, rec.Body)
		}
	}
}

// verifyReceipts checks, as a third party would, the receipts, proofs
// and checkpoints of an answer against the receipt verifier key.
func (rig *fuzzRig) verifyReceipts(pattern string, body []byte) error {
	vkey, origin := rig.s.ReceiptVerifierKey(), receipts.DefaultOrigin
	switch pattern {
	case "/operator/receipts/checkpoint":
		_, err := receipts.OpenCheckpoint(body, vkey, origin)
		return err
	case "/operator/receipts/{id}":
		var out wire.ReceiptResponse
		if err := json.Unmarshal(body, &out); err != nil {
			return err
		}
		if out.Proof == nil || out.Checkpoint == nil {
			return fmt.Errorf("no proof: every receipt is sequenced at once here")
		}
		_, err := receipts.Verify(vkey, origin, out.Receipt.Body, *out.Proof, []byte(*out.Checkpoint))
		return err
	case "/workers/jobs/{id}/complete":
		var out wire.CompleteResponse
		if err := json.Unmarshal(body, &out); err != nil {
			return err
		}
		// Proofs for both receipts, or none (wait_for_proofs not asked).
		proofs := len(out.Proofs) == 2 && out.Checkpoint != ""
		if len(out.Receipts) != 2 || !proofs && (len(out.Proofs) != 0 || out.Checkpoint != "") {
			return fmt.Errorf("%d receipts, %d proofs, checkpoint %q: want job_completed and job_charged, with proofs or none", len(out.Receipts), len(out.Proofs), out.Checkpoint)
		}
		if out.Receipts[0].ID != out.ReceiptID || out.Job.ReceiptID == nil || *out.Job.ReceiptID != out.ReceiptID {
			return fmt.Errorf("receipt_id %s, job.receipt_id %v, receipts[0] %s", out.ReceiptID, out.Job.ReceiptID, out.Receipts[0].ID)
		}
		for i, w := range out.Receipts {
			r, err := receipts.Decode(w.Body)
			if proofs {
				r, err = receipts.Verify(vkey, origin, w.Body, out.Proofs[i], []byte(out.Checkpoint))
			}
			if err != nil {
				return fmt.Errorf("receipt %s: %w", w.ID, err)
			}
			if r.ID != w.ID || r.Kind != w.Kind || proofs && (w.Index == nil || *w.Index != out.Proofs[i].Index) {
				return fmt.Errorf("receipt %s: the wire fields do not match its body", w.ID)
			}
		}
	}
	return nil
}

func fuzzErrorCode(body []byte) string {
	var e wire.ErrorBody
	_ = json.Unmarshal(body, &e)
	return e.Error.Code
}

// TestFuzzRig checks that the rig's setup works, and each selector does what it says.
func TestFuzzRig(t *testing.T) {
	rig := newFuzzRig(t)
	for _, c := range []struct {
		name         string
		method, path string
		auth, sig    uint8
		body         string
		want         int
		code         string
	}{
		{"operator", "GET", "/operator/jobs/$JOB2", authOperator, sigNone, "", 200, ""},
		{"narrow operator", "GET", "/operator/workers", authNarrowOperator, sigNone, "", 403, wire.CodeInsufficientScope},
		{"revoked", "GET", "/operator/jobs", authRevoked, sigNone, "", 401, wire.CodeTokenRevoked},
		{"heartbeat", "POST", "/workers/heartbeat", authWorker, sigWorker, `{"status": "busy", "current_jobs": ["$JOB1", "$JOB2"]}`, 200, ""},
		{"narrow worker", "POST", "/workers/jobs/lease", authNarrowWorker, sigWorker, `{}`, 403, wire.CodeInsufficientScope},
		{"unsigned", "POST", "/workers/heartbeat", authWorker, sigNone, `{"status": "idle"}`, 401, wire.CodeMissingSignature},
		{"tampered", "POST", "/workers/heartbeat", authWorker, sigTamper, `{"status": "idle"}`, 401, wire.CodeBadDigest},
		{"stale", "POST", "/workers/heartbeat", authWorker, sigStale, `{"status": "idle"}`, 401, wire.CodeStaleTimestamp},
		{"other key", "POST", "/workers/heartbeat", authWorker, sigNewKey, `{"status": "idle"}`, 401, wire.CodeBadSignature},
		{"accept", "POST", "/workers/jobs/$JOB1/accept", authWorker, sigWorker, `{"lease_token": "$LEASE1"}`, 200, ""},
		{"complete", "POST", "/workers/jobs/$JOB2/complete", authWorker, sigWorker, `{"lease_token": "$LEASE2", "metrics": {"loss": 0.1}}`, 200, ""},
		{"register new", "POST", "/workers/register", authProvisioner, sigNewKey, `{"node_id": "n2", "public_key": "$NEWPUBKEY"}`, 201, ""},
		{"register taken", "POST", "/workers/register", authProvisioner, sigNewKey, `{"node_id": "$NODE", "public_key": "$NEWPUBKEY"}`, 409, wire.CodeNodeExists},
		{"receipt", "GET", "/operator/receipts/$RECEIPT", authOperator, sigNone, "", 200, ""},
		{"revoke", "POST", "/operator/credentials/$CRED/revoke", authOperator, sigNone, "", 200, ""},
		{"mint beyond its scopes", "POST", "/operator/credentials", authOperator, sigNone, `{"principal": "provisioner-fuzz", "scopes": ["node:register"]}`, 403, wire.CodeInsufficientScope},
		{"list credentials", "GET", "/operator/credentials?principal=op-fuzz&limit=2", authOperator, sigNone, "", 200, ""},
		{"list credentials of no one", "GET", "/operator/credentials?principal=nobody", authOperator, sigNone, "", 404, wire.CodeNotFound},
		{"create principal", "POST", "/operator/principals", authOperator, sigNone, `{"id": "ci-bot", "name": "CI"}`, 201, ""},
		{"create principal taken", "POST", "/operator/principals", authOperator, sigNone, `{"id": "op-fuzz"}`, 409, wire.CodePrincipalExists},
	} {
		t.Run(c.name, func(t *testing.T) {
			rig.t = t
			req, err := rig.request(c.method, rig.vars.Replace(c.path), c.auth, c.sig, "application/json", "", []byte(rig.vars.Replace(c.body)))
			if err != nil {
				t.Fatal(err)
			}
			rec := rig.serve(req)
			rig.check(req, rec)
			if rec.Code != c.want || fuzzErrorCode(rec.Body.Bytes()) != c.code {
				t.Fatalf("answered %d %s, want %d %s", rec.Code, rec.Body, c.want, c.code)
			}
		})
	}
}

// BenchmarkFuzzRig measures the setup every fuzz input pays.
func BenchmarkFuzzRig(b *testing.B) {
	for b.Loop() {
		newFuzzRig(b)
	}
}
