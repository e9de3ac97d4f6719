package cmd

import (
	"net"
	"net/http"
	"net/http/httputil"
	"net/url"
	"strings"
	"testing"

	"github.com/nodelane/nodelane/internal/waitfor"
)

// TestE2EBehindProxy runs the example server behind a real
// httputil.ReverseProxy that rewrites Host (SetURL) and serves it under
// /nodelane, stripping the prefix: with -public-url set to the proxy's
// URL, a worker process pointed at the proxy registers and completes a
// job. (TestE2EBehindProxyWithoutPublicURL: a worker pointed at the
// proxy of a server without -public-url is refused, told that the proxy
// changed @authority and @path.)
func TestE2EBehindProxy(t *testing.T) {
	t.Parallel()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	public := "http://" + ln.Addr().String() + "/nodelane"
	c := newCluster(t, "-public-url", public, "-trusted-proxy", "127.0.0.1")
	serveProxy(t, ln, c.base(), "/nodelane")

	w := c.startWorkerVia("node-p", public)
	c.workerID("node-p")
	d := c.dispatch("status_check", nil)
	c.checkSucceeded(c.waitDone(d.Job.ID, "succeeded"))
	if w.exited() {
		t.Fatalf("the worker exited: %s", w.stderr.String())
	}
	c.checkNoTokensLogged()
}

// TestE2EBehindProxyWithoutPublicURL checks that a worker behind a proxy
// that rewrites Host and strips a prefix, with no -public-url on the
// server, is refused and told why.
func TestE2EBehindProxyWithoutPublicURL(t *testing.T) {
	t.Parallel()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	public := "http://" + ln.Addr().String() + "/nodelane"
	c := newCluster(t)
	serveProxy(t, ln, c.base(), "/nodelane")
	w := c.startWorkerVia("node-p", public)
	// Quotes may be escaped in the worker's log: look for the parts.
	want := []string{"401 bad_signature", "signed for @authority", ln.Addr().String(), `@path`, "/nodelane/workers/register", "-public-url"}
	waitfor.Within(c.t, startTimeout, "the worker to report the refusal", func() bool {
		out := w.stderr.String()
		for _, s := range want {
			if !strings.Contains(out, s) {
				return false
			}
		}
		return true
	})
}

// serveProxy serves a ReverseProxy to target on ln that strips prefix,
// rewrites Host and sends X-Forwarded-* headers, until the test ends.
func serveProxy(t *testing.T, ln net.Listener, target, prefix string) {
	t.Helper()
	u, err := url.Parse(target)
	if err != nil {
		t.Fatal(err)
	}
	rp := &httputil.ReverseProxy{Rewrite: func(pr *httputil.ProxyRequest) {
		pr.SetURL(u)
		pr.SetXForwarded()
		pr.Out.Header.Set("X-Forwarded-Prefix", prefix)
	}}
	srv := &http.Server{Handler: http.StripPrefix(prefix, rp)}
	go srv.Serve(ln)
	t.Cleanup(func() { srv.Close() })
}
