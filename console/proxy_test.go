package console_test

import (
	"errors"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"strings"
	"testing"

	"github.com/nodelane/nodelane/console"
)

// Behind a proxy that rewrites Host and strips /nodelane, a console told
// its PublicURL links, redirects and scopes its cookie under the public
// path, and takes a form post from a browser that sends Origin but no
// Sec-Fetch-Site.
func TestBehindProxy(t *testing.T) {
	t.Parallel()
	front := httptest.NewUnstartedServer(nil)
	public := "http://" + front.Listener.Addr().String() + "/nodelane/console"
	f := newFixture(t, func(c *console.Config) { c.PublicURL = public })
	backend, err := url.Parse(f.srv.URL)
	if err != nil {
		t.Fatal(err)
	}
	front.Config.Handler = &httputil.ReverseProxy{Rewrite: func(pr *httputil.ProxyRequest) {
		pr.SetURL(backend) // Host becomes the backend's
		pr.Out.URL.Path = strings.TrimPrefix(pr.In.URL.Path, "/nodelane")
		pr.Out.URL.RawPath = ""
	}}
	front.Start()
	t.Cleanup(front.Close)

	b := f.browser(t)
	b.f = &fixture{env: f.env, srv: front, url: public}
	p := b.get(t, "/")
	if want := public + "/signin"; p.url != want || p.code != http.StatusOK {
		t.Fatalf("GET / unsigned went to %s (%d), want %s", p.url, p.code, want)
	}
	mustContain(t, "sign-in page", p, `action="/nodelane/console/signin"`, `href="/nodelane/console/static/console.css"`)

	// An older browser: Origin, no Sec-Fetch-Site, and the Host the
	// console sees is the backend's.
	req, err := http.NewRequest(http.MethodPost, public+"/signin", strings.NewReader(url.Values{"token": {f.env.OperatorToken}}.Encode()))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	req.Header.Set("Origin", "http://"+front.Listener.Addr().String())
	p = b.do(t, req)
	if p.code != http.StatusOK || p.url != public+"/" || !strings.Contains(p.body, "<h1>Overview</h1>") {
		t.Fatalf("sign-in through the proxy: %d at %s:\n%s", p.code, p.url, p.body)
	}
	mustContain(t, "overview", p, `href="/nodelane/console/workers"`)
	cs := b.jar.Cookies(mustURL(t, public+"/workers"))
	if len(cs) != 1 || cs[0].Name != console.CookieName {
		t.Fatalf("cookies sent under the public path: %v", cs)
	}
	if cs := b.jar.Cookies(mustURL(t, "http://"+front.Listener.Addr().String()+"/console/")); len(cs) != 0 {
		t.Errorf("the cookie is sent outside the public path: %v", cs)
	}
	if p := b.get(t, "/workers"); p.code != http.StatusOK || !strings.Contains(p.body, "<h1>Workers</h1>") {
		t.Errorf("GET /workers signed in: %d\n%s", p.code, p.body)
	}

	// Another origin is still refused.
	req, _ = http.NewRequest(http.MethodPost, public+"/signout", strings.NewReader(""))
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	req.Header.Set("Origin", "http://evil.example")
	if p := b.do(t, req); p.code != http.StatusForbidden {
		t.Errorf("a cross-origin post through the proxy: %d, want 403", p.code)
	}
}

// PublicURL must be an absolute http(s) URL; the error never repeats it.
func TestPublicURLConfig(t *testing.T) {
	t.Parallel()
	for _, bad := range []string{"/console", "ftp://cp.example.com/console", "https://cp.example.com/console?x=1",
		"https://cp.example.com/console#top", "https://user:hunter2@cp.example.com/console", "https:///console"} {
		_, err := console.New(console.Config{API: http.NotFoundHandler(), VerifierKey: "k+1+AQ", PublicURL: bad})
		if !errors.Is(err, console.ErrConfig) || strings.Contains(err.Error(), "hunter2") {
			t.Errorf("PublicURL %q: %v, want ErrConfig without the value", bad, err)
		}
	}
}
