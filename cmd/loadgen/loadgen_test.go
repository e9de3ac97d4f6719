package main

import (
	"bytes"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nodelane/nodelane/cmd/internal/controlplane"
	"github.com/nodelane/nodelane/internal/testdb"
	"github.com/nodelane/nodelane/internal/testpki"
	"github.com/nodelane/nodelane/workerapi/wire"
)

// startServer starts a control plane on db over loopback, as
// cmd/server does, and returns its base URL and a tokens file as the
// server's -tokens-file.
func startServer(t *testing.T, db testdb.DB) (base, tokensFile string) {
	return startServerTLS(t, db, nil)
}

// startServerTLS is startServer serving https with leaf, when not nil.
func startServerTLS(t *testing.T, db testdb.DB, leaf *testpki.Leaf) (base, tokensFile string) {
	t.Helper()
	ctx := t.Context()
	dir := t.TempDir()
	cp, err := controlplane.Open(ctx, controlplane.Options{
		DB: db.DSN, SecretsFile: filepath.Join(dir, "secrets.json"), MaintainInterval: 100 * time.Millisecond,
		Logger: slog.New(slog.DiscardHandler),
	})
	if err != nil {
		t.Fatal(err)
	}
	boot, err := cp.Server.Bootstrap(ctx)
	if err != nil || !boot.Created {
		t.Fatalf("bootstrap: %v (created %v)", err, boot != nil && boot.Created)
	}
	tokensFile = filepath.Join(dir, "tokens.json")
	if err := controlplane.WriteFileAtomic(tokensFile, controlplane.Tokens{
		OperatorToken: boot.OperatorToken, ProvisioningToken: boot.ProvisioningToken, ReceiptPublicKey: cp.Server.ReceiptVerifierKey(),
	}); err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	scheme := "http"
	if leaf != nil {
		ln, scheme = tls.NewListener(ln, &tls.Config{Certificates: []tls.Certificate{leaf.Pair}, MinVersion: tls.VersionTLS12}), "https"
	}
	srv := &http.Server{Handler: cp.Server.Handler(), ReadHeaderTimeout: 10 * time.Second}
	served := make(chan error, 1)
	go func() { served <- srv.Serve(ln) }()
	if err := cp.Server.Start(ctx); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		sctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_ = srv.Shutdown(sctx)
		<-served
		if err := cp.Close(sctx); err != nil {
			t.Errorf("closing the control plane: %v", err)
		}
	})
	return scheme + "://" + ln.Addr().String(), tokensFile
}

// intAfter returns the integer the output holds after prefix, or fails.
func intAfter(t *testing.T, out, pattern string) int {
	t.Helper()
	m := regexp.MustCompile(pattern).FindStringSubmatch(out)
	if m == nil {
		t.Fatalf("the output has no %q:\n%s", pattern, out)
	}
	n, err := strconv.Atoi(m[1])
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// TestRunTLS runs a small load over https, trusting the server's CA with
// -ca-file; without it the run fails.
func TestRunTLS(t *testing.T) {
	t.Parallel()
	ca := testpki.NewCA(t, "loadgen test CA")
	leaf := ca.Leaf(t)
	base, tokens := startServerTLS(t, testdb.SQLite(t), &leaf)
	caFile := filepath.Join(t.TempDir(), "ca.pem")
	if err := os.WriteFile(caFile, ca.PEM, 0o644); err != nil {
		t.Fatal(err)
	}
	args := []string{"-server", base, "-tokens-file", tokens, "-nodes", "2", "-jobs", "20", "-max-jobs", "5", "-wait-seconds", "2", "-timeout", "1m"}
	var out bytes.Buffer
	if err := run(t.Context(), append(args, "-ca-file", caFile), &out, io.Discard); err != nil {
		t.Fatalf("run over https: %v\n%s", err, out.String())
	}
	if n := intAfter(t, out.String(), `, (\d+) completed, 0 failed`); n != 20 {
		t.Errorf("%d jobs completed over https, want 20", n)
	}
	if err := run(t.Context(), args, io.Discard, io.Discard); err == nil {
		t.Error("a run over https without the server's CA succeeded")
	}
	if err := run(t.Context(), append(args, "-ca-file", tokens), io.Discard, io.Discard); err == nil || !strings.Contains(err.Error(), "no PEM certificate") {
		t.Errorf("-ca-file of a tokens file: %v", err)
	}
}

// TestRun runs a small load of each flow on each database and checks its
// counts and checks; then it breaks a record of the run and sees each
// check fail. The v02 flow's completions wait for their proofs
// (-wait-for-proofs), the batched flow's do not: its receipt check reads
// every proof from GET /operator/receipts/{id}, and its jobs are
// dispatched in batches (-dispatch-batch).
func TestRun(t *testing.T) {
	t.Parallel()
	for _, d := range testdb.Dialects() {
		for _, flow := range []string{flowV02, flowBatched} {
			t.Run(d.Name+"/"+flow, func(t *testing.T) {
				t.Parallel()
				testRun(t, d.New(t), flow)
			})
		}
	}
}

// testRun is one case of TestRun.
func testRun(t *testing.T, db testdb.DB, flow string) {
	base, tokens := startServer(t, db)
	args := []string{"-server", base, "-tokens-file", tokens, "-nodes", "4", "-jobs", "60", "-max-jobs", "5",
		"-wait-seconds", "2", "-timeout", "2m", "-server-pid", strconv.Itoa(os.Getpid()), "-flow", flow}
	if db.Dialect == "postgres" {
		args = append(args, "-pg", db.DSN, "-pg-settle", "0")
	}
	wait := flow == flowV02
	if wait {
		args = append(args, "-wait-for-proofs")
	} else {
		// The batched flow dispatches 7 jobs a request (the last request 4).
		args = append(args, "-dispatch-batch", "7")
	}
	cfg, err := parseFlags(args, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	l, err := newLoad(cfg, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	var out bytes.Buffer
	err = l.run(t.Context(), &out)
	t.Logf("output:\n%s", out.String())
	if err != nil {
		t.Fatalf("run: %v", err)
	}
	got := out.String()
	if n := intAfter(t, got, `jobs: (\d+) dispatched`); n != 60 {
		t.Errorf("%d jobs dispatched, want 60", n)
	}
	if n := intAfter(t, got, `, (\d+) completed, 0 failed`); n != 60 {
		t.Errorf("%d jobs completed, want 60", n)
	}
	if n := intAfter(t, got, `check receipts: ok: (\d+) receipts of 60 completions verified`); n != 120 {
		t.Errorf("%d receipts verified, want 120", n)
	}
	// The proofs came with the answers only when they waited for them.
	fetched := 120
	if wait {
		fetched = 0
	}
	if n := intAfter(t, got, `\((\d+) proofs read from GET /operator/receipts/\{id\}\)`); n != fetched {
		t.Errorf("%d proofs read from GET /operator/receipts/{id}, want %d", n, fetched)
	}
	for _, want := range []string{
		"registered 4 nodes",
		"(0 dispatch errors)",
		"check exactly once: ok: 60 jobs dispatched, each completed once",
		"server RSS: ",
		"dispatch→lease",
	} {
		if !strings.Contains(got, want) {
			t.Errorf("the output does not say %q", want)
		}
	}
	if db.Dialect == "postgres" && !regexp.MustCompile(`postgres: \d+ commits \([0-9.]+ per job\)`).MatchString(got) {
		t.Errorf("the output does not count commits per job")
	}
	// The server runs in this process: its CPU time is this
	// process's, which cannot be zero after 60 jobs.
	if m := regexp.MustCompile(`CPU: server ([0-9.]+) s \([0-9.]+ ms per job, pid \d+\); `).FindStringSubmatch(got); m == nil || m[1] == "0.00" {
		t.Errorf("the output does not give the server's CPU time: %q", m)
	}
	if db.Dialect == "postgres" {
		m := regexp.MustCompile(`; postgres ([0-9.]+) s in (\d+) backends of the database \([0-9.]+ ms per job\)`).FindStringSubmatch(got)
		if m == nil || m[1] == "0.00" || m[2] == "0" {
			t.Errorf("the output does not give PostgreSQL's CPU time: %q", m)
		}
	} else if !strings.Contains(got, "; postgres not read (give -pg)") {
		t.Errorf("the output does not say PostgreSQL's CPU time was not read")
	}
	rows := []string{rowRegister, rowHeartbeat, rowDispatch, rowLease, rowAccept, rowComplete, rowDispatchLease}
	none := []string{rowCompleteBatch}
	if flow == flowBatched {
		// The lease accepts every grant: no accept, no complete
		// alone.
		rows = []string{rowRegister, rowHeartbeat, rowDispatch, rowLease, rowCompleteBatch, rowDispatchLease}
		none = []string{rowAccept, rowComplete}
		if !strings.Contains(got, "grants the lease left leased, accepted one by one: 0\n") {
			t.Errorf("the output does not say that the lease accepted every grant")
		}
		if m := l.stats.get(rowCompleteBatch); m.n >= 60 {
			t.Errorf("%d batch completes for 60 jobs leased 5 at a time", m.n)
		}
	}
	for _, row := range rows {
		if m := l.stats.get(row); m.n == 0 || m.errs != 0 {
			t.Errorf("%s: %d calls, %d errors", row, m.n, m.errs)
		}
	}
	for _, row := range none {
		if m := l.stats.get(row); m.n != 0 || m.errs != 0 {
			t.Errorf("flow %s: %s: %d calls, %d errors, want none", flow, row, m.n, m.errs)
		}
	}

	// The checks must be able to fail: tamper with the records.
	ctx := t.Context()
	ours, _ := l.snapshot()
	twice, tampered := ours[0], ours[1]
	l.mu.Lock()
	l.jobs[twice].completes = 2
	body := l.jobs[tampered].answer.Receipts[1].Body
	body[len(body)-2] ^= 1
	l.mu.Unlock()
	if res := l.exactlyOnce(ctx); len(res.problems) != 1 || !strings.Contains(res.problems[0], twice+": completed 2 times") {
		t.Errorf("exactly once with a job completed twice: %q", res.problems)
	}
	if res := l.verifyReceipts(ctx); len(res.problems) != 1 || !strings.Contains(res.problems[0], tampered) {
		t.Errorf("receipts with a body changed: %q", res.problems)
	}
	l.mu.Lock()
	l.jobs[twice].completes = 1
	l.jobs[tampered].answer.Receipts[1].Body[len(body)-2] ^= 1
	l.jobs[tampered].answer.Proofs = nil // read the proofs from GET /operator/receipts/{id}
	l.mu.Unlock()
	if wait {
		fetched = 2
	}
	if res := l.verifyReceipts(ctx); len(res.problems) != 0 || !strings.Contains(res.summary, fmt.Sprintf("(%d proofs read from GET", fetched)) {
		t.Errorf("receipts after the fix: %q, %s", res.problems, res.summary)
	}
	// A job the server does not know, as if its dispatch had been lost.
	l.mu.Lock()
	l.ours = append(l.ours, "job_ffffffffffffffffffffffffffffffff")
	l.jobs["job_ffffffffffffffffffffffffffffffff"] = &jobRecord{dispatchedAt: time.Now()}
	l.mu.Unlock()
	res := l.exactlyOnce(ctx)
	if len(res.problems) != 2 || !strings.Contains(res.problems[0], "not completed: "+errNotLeased.Error()) ||
		!strings.Contains(res.problems[1], "not listed by GET /operator/jobs") {
		t.Errorf("exactly once with a job lost: %q", res.problems)
	}
}

// TestFleet runs a tiny fleet: every node heartbeats, the long-polls
// answer, nothing fails.
func TestFleet(t *testing.T) {
	t.Parallel()
	base, tokens := startServer(t, testdb.SQLite(t))
	var out bytes.Buffer
	err := run(t.Context(), []string{"-server", base, "-tokens-file", tokens, "-mode", "fleet", "-nodes", "20",
		"-heartbeat-interval", "500ms", "-duration", "5s", "-long-polls", "5", "-wait-seconds", "1",
		"-server-pid", strconv.Itoa(os.Getpid())}, &out, io.Discard)
	t.Logf("output:\n%s", out.String())
	if err != nil {
		t.Fatalf("run: %v", err)
	}
	got := out.String()
	if n := intAfter(t, got, `registered (\d+) nodes`); n != 20 {
		t.Errorf("%d nodes registered, want 20", n)
	}
	// Each node's first heartbeat is due within one interval; the run
	// lasts ten, so that a server slowed by the race detector on a loaded
	// machine still answers each node once (2.5 s was seen to fall short).
	if n := intAfter(t, got, `heartbeats: (\d+) answered`); n < 20 {
		t.Errorf("%d heartbeats, want at least one per node", n)
	}
	for _, want := range []string{"0 failed", "0 jobs leased and released", "check fleet: ok", "server RSS: "} {
		if !strings.Contains(got, want) {
			t.Errorf("the output does not say %q", want)
		}
	}
}

// TestUsage checks that bad flags and missing tokens are usage errors that say
// what is wrong, before anything is sent.
func TestUsage(t *testing.T) {
	dir := t.TempDir()
	tokens := filepath.Join(dir, "tokens.json")
	if err := os.WriteFile(tokens, []byte(`{"operator_token":"nlc_op","provisioning_token":"nlc_prov"}`), 0o600); err != nil {
		t.Fatal(err)
	}
	twoWords := filepath.Join(dir, "two")
	if err := os.WriteFile(twoWords, []byte("nlc_a nlc_b\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	oneWord := filepath.Join(dir, "one")
	if err := os.WriteFile(oneWord, []byte("nlc_a\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name string
		args []string
		want string
	}{
		{"mode", []string{"-mode", "burst", "-tokens-file", tokens}, "-mode is run or fleet"},
		{"flow", []string{"-flow", "v03", "-tokens-file", tokens}, "-flow is v02 or batched"},
		{"server pid", []string{"-server-pid", "12,x", "-tokens-file", tokens}, `"x" is not a process id`},
		{"server pid zero", []string{"-server-pid", "0", "-tokens-file", tokens}, `"0" is not a process id`},
		{"nodes", []string{"-nodes", "0", "-tokens-file", tokens}, "-nodes must be at least 1"},
		{"max jobs", []string{"-max-jobs", "33", "-tokens-file", tokens}, "-max-jobs is 1 to 32"},
		{"wait", []string{"-wait-seconds", "61", "-tokens-file", tokens}, "-wait-seconds is 0 to 60"},
		{"server", []string{"-server", "ftp://x", "-tokens-file", tokens}, "is not an http(s) URL"},
		{"fleet without wait", []string{"-mode", "fleet", "-wait-seconds", "0", "-tokens-file", tokens}, "makes no long-poll"},
		{"no tokens", []string{}, "no provisioning token"},
		{"token file of two words", []string{"-provisioning-token-file", twoWords}, "holds more than one word"},
		{"no operator token", []string{"-provisioning-token-file", oneWord}, "no operator token"},
		{"no receipt key", []string{"-tokens-file", tokens}, "no receipt verifier key"},
		{"unreadable tokens file", []string{"-tokens-file", filepath.Join(dir, "absent")}, "-tokens-file"},
		{"arguments", []string{"-tokens-file", tokens, "extra"}, "unexpected arguments"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Setenv(operatorEnv, "")
			t.Setenv(provisioningEnv, "")
			err := run(t.Context(), tc.args, io.Discard, io.Discard)
			var usage errUsage
			if !errors.As(err, &usage) || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("err = %v, want a usage error saying %q", err, tc.want)
			}
		})
	}
	// A fleet needs no operator token nor receipt key.
	t.Setenv(provisioningEnv, "nlc_prov")
	if _, err := parseFlags([]string{"-mode", "fleet"}, io.Discard); err != nil {
		t.Errorf("fleet with the provisioning token in the environment: %v", err)
	}
}

// TestRunBatchRefused runs the batched flow through a proxy that answers
// the batch complete route 404, as a server older than it would: every
// job fails, the report says why, and the run fails.
func TestRunBatchRefused(t *testing.T) {
	t.Parallel()
	base, tokens := startServer(t, testdb.SQLite(t))
	u, err := url.Parse(base)
	if err != nil {
		t.Fatal(err)
	}
	rp := httputil.NewSingleHostReverseProxy(u) // keeps the incoming Host, which the signature covers
	var refused atomic.Int64
	proxy := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == wire.PathCompleteBatch {
			refused.Add(1)
			http.NotFound(w, r)
			return
		}
		rp.ServeHTTP(w, r)
	}))
	t.Cleanup(proxy.Close)
	var out bytes.Buffer
	err = run(t.Context(), []string{"-server", proxy.URL, "-tokens-file", tokens, "-nodes", "2", "-jobs", "10", "-max-jobs", "5",
		"-wait-seconds", "2", "-timeout", "1m", "-flow", flowBatched}, &out, io.Discard)
	t.Logf("output:\n%s", out.String())
	if !errors.Is(err, errChecksFailed) {
		t.Errorf("run: %v, want %v", err, errChecksFailed)
	}
	got := out.String()
	for _, want := range []string{", 0 completed, 10 failed", "first complete (batch) error: ", "check exactly once: FAILED: "} {
		if !strings.Contains(got, want) {
			t.Errorf("the output does not say %q", want)
		}
	}
	if refused.Load() == 0 {
		t.Error("no batch complete reached the proxy")
	}
}
