package main

import (
	"io"
	"net/http"
	"net/http/cookiejar"
	"net/url"
	"strings"
	"testing"

	"github.com/nodelane/nodelane/console"
	"github.com/nodelane/nodelane/internal/testdb"
)

// TestConsoleMounted checks that the server mounts the console at
// /console/ beside the API: an operator signs in with the printed token
// and reads the overview.
func TestConsoleMounted(t *testing.T) {
	t.Parallel()
	d := testdb.Dialects()[0] // SQLite
	f := newFiles(t, d)
	s := serve(t, f.args("127.0.0.1:0")...)
	token := operatorToken(t, s.stdout.String())
	if !strings.Contains(s.stderr.String(), "console=http://"+s.addr+"/console/") {
		t.Errorf("the server does not log the console's URL:\n%s", s.stderr)
	}
	jar, _ := cookiejar.New(nil)
	hc := &http.Client{Jar: jar}
	base := "http://" + s.addr
	resp, err := hc.Get(base + "/console")
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK || resp.Request.URL.Path != "/console/signin" || resp.Header.Get("Content-Security-Policy") != console.ContentSecurityPolicy {
		t.Fatalf("GET /console: %d at %s\n%s", resp.StatusCode, resp.Request.URL, b)
	}
	req, _ := http.NewRequest(http.MethodPost, base+"/console/signin", strings.NewReader(url.Values{"token": {token}}.Encode()))
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	req.Header.Set("Origin", base)
	resp, err = hc.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	b, _ = io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK || !strings.Contains(string(b), "<h1>Overview</h1>") || strings.Contains(string(b), "Refused") {
		t.Fatalf("sign-in: %d at %s\n%s", resp.StatusCode, resp.Request.URL, b)
	}
	// The API is where it was.
	if code := get(t, s.addr, token, "/operator/envelope", nil); code != http.StatusOK {
		t.Fatalf("GET /operator/envelope: %d", code)
	}
}

// TestConsoleSignInLimited checks that the server limits the console's
// sign-ins per client address, past its trusted proxies (issue 29):
// behind a trusted proxy, one client's 11th sign-in in a burst is
// refused 429 and another client's is not.
func TestConsoleSignInLimited(t *testing.T) {
	t.Parallel()
	d := testdb.Dialects()[0] // SQLite
	f := newFiles(t, d)
	s := serve(t, append(f.args("127.0.0.1:0"), "-trusted-proxy", "127.0.0.1")...)
	token := operatorToken(t, s.stdout.String())
	base := "http://" + s.addr
	signIn := func(client, token string) (int, http.Header) {
		req, _ := http.NewRequest(http.MethodPost, base+"/console/signin", strings.NewReader(url.Values{"token": {token}}.Encode()))
		req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
		req.Header.Set("Origin", base)
		req.Header.Set("X-Forwarded-For", client)
		hc := &http.Client{CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
		resp, err := hc.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		return resp.StatusCode, resp.Header
	}
	for i := range console.DefaultSignInBurst {
		if code, _ := signIn("198.51.100.1", "nlc_wrong"); code != http.StatusUnauthorized {
			t.Fatalf("sign-in %d: %d, want 401", i+1, code)
		}
	}
	if code, h := signIn("198.51.100.1", token); code != http.StatusTooManyRequests || h.Get("Retry-After") == "" {
		t.Fatalf("sign-in past the burst: %d, Retry-After %q; want 429 with Retry-After", code, h.Get("Retry-After"))
	}
	if code, _ := signIn("198.51.100.2", token); code != http.StatusSeeOther {
		t.Fatalf("another client's sign-in: %d, want 303", code)
	}
}
