package console_test

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"log/slog"
	"mime/multipart"
	"net/http"
	"net/netip"
	"net/url"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nodelane/nodelane/console"
	"github.com/nodelane/nodelane/credential"
	"github.com/nodelane/nodelane/internal/apitest"
	"github.com/nodelane/nodelane/receipts"
	"github.com/nodelane/nodelane/workerapi"
	"github.com/nodelane/nodelane/workerapi/wire"
)

// TestSignInNeedsOperatorScope checks that only a credential with an
// operator scope signs in (issue 29): before, any token the API did not
// answer 401 got a session, a provisioning, a worker's and a banned
// worker's included.
func TestSignInNeedsOperatorScope(t *testing.T) {
	t.Parallel()
	f := newFixture(t, func(c *console.Config) { c.SignInBurst = 100 })
	n := registerNode(t, f, "gpu-1")
	banned := registerNode(t, f, "gpu-2")
	if code, body := f.env.Operator(t, http.MethodPost, "/operator/workers/"+banned.WorkerID+"/ban", wire.ReasonRequest{Reason: "x"}); code != http.StatusOK {
		t.Fatalf("ban: %d %s", code, body)
	}
	nodeScoped, _ := f.env.Credential(t, apitest.OperatorID, credential.ScopeNodeAuditSubmit)
	for _, tc := range []struct{ name, token string }{
		{"provisioning token", f.env.ProvisioningToken},
		{"worker token", n.Token},
		{"banned worker's token", banned.Token},
		{"operator principal without an operator scope", nodeScoped},
	} {
		t.Run(tc.name, func(t *testing.T) {
			b := f.browser(t)
			p := b.post(t, "/signin", url.Values{"token": {tc.token}})
			if p.code != http.StatusForbidden && p.code != http.StatusUnauthorized {
				t.Errorf("sign-in: %d, want 403 or 401", p.code)
			}
			mustContain(t, tc.name, p, `class="flash error"`)
			if cs := b.jar.Cookies(mustURL(t, f.url+"/")); len(cs) != 0 {
				t.Errorf("the refused sign-in set cookies %v", cs)
			}
			if p := b.get(t, "/"); !strings.HasSuffix(p.url, "/signin") {
				t.Errorf("after the refused sign-in, / went to %s", p.url)
			}
		})
	}
	p := f.browser(t).post(t, "/signin", url.Values{"token": {f.env.ProvisioningToken}})
	mustContain(t, "provisioning token", p, "That token holds no operator scope")
}

// TestSignInRateLimited checks that sign-ins are limited per client
// address: past the burst, 429 with Retry-After, for that address only,
// until its bucket refills.
func TestSignInRateLimited(t *testing.T) {
	t.Parallel()
	now := time.Now()
	var mu sync.Mutex
	clock := func() time.Time { mu.Lock(); defer mu.Unlock(); return now }
	f := newFixture(t, func(c *console.Config) {
		c.SignInBurst, c.SignInInterval, c.Now = 3, time.Minute, clock
		c.ClientAddr = func(r *http.Request) string { return r.Header.Get("X-Test-Client") }
	})
	signIn := func(client, token string) page {
		b := f.browser(t)
		req, _ := http.NewRequest(http.MethodPost, f.url+"/signin", strings.NewReader(url.Values{"token": {token}}.Encode()))
		req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
		req.Header.Set("Origin", f.srv.URL)
		req.Header.Set("X-Test-Client", client)
		return b.do(t, req)
	}
	// Refused sign-ins count too.
	for _, tok := range []string{"nlc_wrong", "nlc_wrong", f.env.OperatorToken} {
		if p := signIn("a", tok); p.code == http.StatusTooManyRequests {
			t.Fatalf("sign-in within the burst: 429")
		}
	}
	p := signIn("a", f.env.OperatorToken)
	if p.code != http.StatusTooManyRequests || p.header.Get("Retry-After") != "60" {
		t.Fatalf("the 4th sign-in with a burst of 3: %d, Retry-After %q", p.code, p.header.Get("Retry-After"))
	}
	mustContain(t, "limited sign-in", p, "Too many sign-ins from your address: try again in 60 s.")
	if p := signIn("b", f.env.OperatorToken); p.code != http.StatusOK || !strings.Contains(p.body, "<h1>Overview</h1>") {
		t.Errorf("another address's sign-in: %d", p.code)
	}
	mu.Lock()
	now = now.Add(time.Minute)
	mu.Unlock()
	if p := signIn("a", f.env.OperatorToken); p.code != http.StatusOK {
		t.Errorf("a sign-in a minute later: %d", p.code)
	}
	if p := signIn("a", f.env.OperatorToken); p.code != http.StatusTooManyRequests {
		t.Errorf("a second sign-in a minute later: %d, want 429", p.code)
	}
}

// TestRevokeEndsSessions checks that revoking a credential ends its
// sessions: the next request of each fails, and the one after is sent to
// sign in, on SQLite and PostgreSQL.
func TestRevokeEndsSessions(t *testing.T) {
	t.Parallel()
	for _, dialect := range []string{"sqlite", "postgres"} {
		t.Run(dialect, func(t *testing.T) {
			t.Parallel()
			f := newFixtureOn(t, dialect, nil, nil)
			tok, id := f.env.Credential(t, apitest.OperatorID, credential.ScopeOperatorJobs, credential.ScopeOperatorWorkers)
			b1, b2, other := f.browser(t), f.browser(t), f.browser(t)
			b1.signIn(t, tok)
			b2.signIn(t, tok)
			other.signIn(t, f.env.OperatorToken)
			if code, body := f.env.Operator(t, http.MethodPost, "/operator/credentials/"+id+"/revoke", wire.ReasonRequest{Reason: "left"}); code != http.StatusOK {
				t.Fatalf("revoke: %d %s", code, body)
			}
			p := b1.get(t, "/jobs")
			if p.code != http.StatusUnauthorized {
				t.Errorf("the revoked token's next page: %d, want 401", p.code)
			}
			mustContain(t, "revoked", p, "token_revoked")
			for i, b := range []*browser{b1, b2} {
				if p := b.get(t, "/workers"); !strings.HasSuffix(p.url, "/signin") {
					t.Errorf("session %d of the revoked token is still live: %d %s", i+1, p.code, p.url)
				}
			}
			if p := other.get(t, "/jobs"); p.code != http.StatusOK {
				t.Errorf("another credential's session: %d", p.code)
			}
		})
	}
}

// syncBuffer is a log sink for a test to read while the server writes.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// TestActionLogsBrowserAddr checks that the API's log line of a console
// action names the browser's address, found with the API's own
// trusted-proxy rule, rather than client_addr=console.
func TestActionLogsBrowserAddr(t *testing.T) {
	t.Parallel()
	var logs syncBuffer
	f := newFixtureOn(t, "sqlite", func(c *workerapi.Config) {
		c.Logger = slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
		c.TrustedProxies = []netip.Prefix{netip.MustParsePrefix("127.0.0.0/8")}
	}, nil)
	b := f.browser(t)
	b.signIn(t, f.env.OperatorToken)
	form := url.Values{"job_type": {"status_check"}}
	req, _ := http.NewRequest(http.MethodPost, f.url+"/jobs", strings.NewReader(form.Encode()))
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	req.Header.Set("Origin", f.srv.URL)
	req.Header.Set("X-Forwarded-For", "203.0.113.7")
	b.do(t, req)
	var line string
	for l := range strings.Lines(logs.String()) {
		if strings.Contains(l, "route=/operator/jobs") && strings.Contains(l, "method=POST") {
			line = l
		}
	}
	if !strings.Contains(line, "client_addr=203.0.113.7 ") {
		t.Errorf("the dispatch's log line does not name the browser's address 203.0.113.7:\n%s", line)
	}
	if strings.Contains(logs.String(), "client_addr=console") {
		t.Errorf("a console request is logged as client_addr=console:\n%s", logs.String())
	}
}

// TestVerifyNeedsReceiptsScope checks that verifying an export needs
// operator:receipts: before issue 29 any session's upload was read.
func TestVerifyNeedsReceiptsScope(t *testing.T) {
	t.Parallel()
	f := newFixture(t, nil)
	tok, _ := f.env.Credential(t, apitest.OperatorID, credential.ScopeOperatorJobs)
	b := f.browser(t)
	b.signIn(t, tok)
	req, _ := http.NewRequest(http.MethodPost, f.url+"/receipts/verify", strings.NewReader(strings.Repeat("x", 1<<20)))
	req.Header.Set("Content-Type", "multipart/form-data; boundary=x")
	req.Header.Set("Origin", f.srv.URL)
	p := b.do(t, req)
	if p.code != http.StatusForbidden {
		t.Errorf("verify without operator:receipts: %d, want 403", p.code)
	}
	mustContain(t, "verify", p, "Refused (403): this page needs operator:receipts")
}

// blanks is a reader of n bytes of blank lines.
type blanks struct{ n int64 }

func (b *blanks) Read(p []byte) (int, error) {
	if b.n == 0 {
		return 0, io.EOF
	}
	p = p[:min(int64(len(p)), b.n)]
	for i := range p {
		p[i] = ' '
		if i%4096 == 4095 {
			p[i] = '\n'
		}
	}
	b.n -= int64(len(p))
	return len(p), nil
}

// TestVerifyExportStreams checks that the console verifies an export as
// it arrives: one of 40 MiB, past the 32 MiB it used to hold in memory
// (and refuse beyond), verifies, and the process allocates far less than
// the upload while it does. It is not parallel, so that what the process
// allocates meanwhile is this request's.
func TestVerifyExportStreams(t *testing.T) {
	f := newFixture(t, nil)
	b := f.browser(t)
	b.signIn(t, f.env.OperatorToken)
	n := registerNode(t, f, "gpu-1")
	runJob(t, n, dispatch(t, b, url.Values{"job_type": {"status_check"}}))
	if _, err := f.env.Server.Sequence(context.Background()); err != nil {
		t.Fatal(err)
	}
	var export bytes.Buffer
	cp, err := receipts.NewLog(f.env.DB.ReceiptStore(), &receipts.Config{Origin: f.env.Config.Origin}).Export(context.Background(), &export)
	if err != nil {
		t.Fatal(err)
	}
	pr, pw := io.Pipe()
	mw := multipart.NewWriter(pw)
	go func() {
		w, _ := mw.CreateFormFile("checkpoint", "checkpoint")
		w.Write(cp.Note)
		w, _ = mw.CreateFormFile("export", "export")
		w.Write(export.Bytes())
		io.Copy(w, &blanks{n: 40 << 20})
		pw.CloseWithError(mw.Close())
	}()
	req, _ := http.NewRequest(http.MethodPost, f.url+"/receipts/verify", pr)
	req.Header.Set("Content-Type", mw.FormDataContentType())
	req.Header.Set("Origin", f.srv.URL)
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	p := b.do(t, req)
	runtime.ReadMemStats(&after)
	mustContain(t, "40 MiB export", p, fmt.Sprintf("✔ Verified: %d receipts", cp.Size))
	if n := after.TotalAlloc - before.TotalAlloc; n > 16<<20 {
		t.Errorf("verifying a 40 MiB export allocated %d MiB, want under 16", n>>20)
	}
}
