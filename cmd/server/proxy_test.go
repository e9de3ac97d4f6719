package main

import (
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"encoding/json"
	"errors"
	"io/fs"
	"net"
	"net/http"
	"net/http/httputil"
	"net/url"
	"os"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/nodelane/nodelane/internal/syncbuf"

	"github.com/nodelane/nodelane/internal/testdb"
	"github.com/nodelane/nodelane/internal/waitfor"
	"github.com/nodelane/nodelane/workerapi/client"
	"github.com/nodelane/nodelane/workerapi/wire"
)

// TestServerProxyFlagsRefused checks that -public-url and -trusted-proxy
// refuse a wrong value, naming the flag, before anything is bound or
// created.
func TestServerProxyFlagsRefused(t *testing.T) {
	t.Parallel()
	f := newFiles(t, testdb.Dialects()[0])
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"-public-url", "cp.example.com"}, "-public-url"},
		{[]string{"-public-url", "ftp://cp.example.com/"}, "-public-url"},
		{[]string{"-public-url", "https://cp.example.com/?x=1"}, "-public-url"},
		{[]string{"-public-url", "https://cp.example.com/#x"}, "-public-url"},
		{[]string{"-public-url", "https:///nodelane"}, "-public-url"},
		{[]string{"-trusted-proxy", "10.0.0.0/33"}, "-trusted-proxy"},
		{[]string{"-trusted-proxy", "proxy.internal"}, "-trusted-proxy"},
		{[]string{"-trusted-proxy", ""}, "-trusted-proxy"},
	} {
		var stdout, stderr syncbuf.Buffer
		err := run(context.Background(), append(f.args("127.0.0.1:0"), tc.args...), &stdout, &stderr)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%q: %v, want an error naming %s", tc.args, err, tc.want)
		}
		if stdout.String() != "" {
			t.Errorf("%q: printed %q", tc.args, stdout.String())
		}
	}
	if _, err := os.Stat(f.tokens); !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("tokens file after refused flags: %v", err)
	}
	// A password in -public-url is not repeated.
	var stdout, stderr syncbuf.Buffer
	err := run(context.Background(), append(f.args("127.0.0.1:0"), "-public-url", "https://ops:hunter2@cp.example.com/"), &stdout, &stderr)
	if err == nil || strings.Contains(err.Error(), "hunter2") || strings.Contains(stderr.String(), "hunter2") {
		t.Errorf("-public-url with a password: %v (stderr %q), want a refusal without it", err, stderr.String())
	}
}

// TestServerBehindProxy runs the server behind a Host-rewriting,
// prefix-stripping ReverseProxy with -public-url: a worker configured
// with the proxy's URL registers and heartbeats, and the request log's
// client_addr is the address the trusted proxy reports, not a spoofed
// one.
func TestServerBehindProxy(t *testing.T) {
	t.Parallel()
	f := newFiles(t, testdb.Dialects()[0])
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	public := "http://" + ln.Addr().String() + "/nodelane"
	s := serve(t, append(f.args("127.0.0.1:0"), "-public-url", public,
		"-trusted-proxy", "127.0.0.1", "-trusted-proxy", "::1/128", "-trusted-proxy", "10.0.0.0/8", "-log-level", "debug")...)
	target, err := url.Parse("http://" + s.addr)
	if err != nil {
		t.Fatal(err)
	}
	var proxied atomic.Int64
	rp := &httputil.ReverseProxy{Rewrite: func(pr *httputil.ProxyRequest) {
		proxied.Add(1)
		pr.Out.Header["X-Forwarded-For"] = pr.In.Header["X-Forwarded-For"]
		pr.SetURL(target)
		pr.SetXForwarded()
		pr.Out.Header.Set("X-Forwarded-Prefix", "/nodelane")
	}}
	ps := &http.Server{Handler: http.StripPrefix("/nodelane", rp)}
	go ps.Serve(ln)
	t.Cleanup(func() { ps.Close() })

	var b []byte
	if b, err = os.ReadFile(f.tokens); err != nil {
		t.Fatal(err)
	}
	prov := jsonField(t, b, "provisioning_token")
	_, key, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	id, err := client.NewIdentity(key)
	if err != nil {
		t.Fatal(err)
	}
	// The worker connects from 127.0.0.2, which is not trusted, and sends
	// an X-Forwarded-For of its own to lie about its address; the trusted
	// proxy (127.0.0.1) appends the worker's real address.
	tr := http.DefaultTransport.(*http.Transport).Clone()
	tr.DialContext = (&net.Dialer{LocalAddr: &net.TCPAddr{IP: net.IPv4(127, 0, 0, 2)}}).DialContext
	hc := &http.Client{Transport: headerTransport{rt: tr, h: map[string]string{"X-Forwarded-For": "192.0.2.66"}}}
	c, err := client.New(public, &client.Config{Identity: id, HTTPClient: hc, MaxAttempts: 1})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	if _, err := c.Register(ctx, prov, wire.RegisterRequest{NodeID: "node-p", Capabilities: wire.Capabilities{JobTypes: []string{"status_check"}}}); err != nil {
		t.Fatalf("register through the proxy: %v", err)
	}
	if _, err := c.Heartbeat(ctx, wire.HeartbeatRequest{Status: "idle"}); err != nil {
		t.Fatalf("heartbeat through the proxy: %v", err)
	}
	if proxied.Load() < 2 {
		t.Fatalf("%d requests went through the proxy", proxied.Load())
	}
	// The request is logged once answered: maybe after the answer arrived.
	var line string
	waitfor.Until(t, "the heartbeat's request log line", func() bool {
		for l := range strings.Lines(s.stderr.String()) {
			if strings.Contains(l, "route=/workers/heartbeat") {
				line = l
			}
		}
		return line != ""
	})
	// The right-most address that is not a trusted proxy's.
	if !strings.Contains(line, "client_addr=127.0.0.2 ") {
		t.Errorf("heartbeat log line %q lacks client_addr=127.0.0.2", line)
	}
}

// headerTransport sets headers on every request it sends through rt.
type headerTransport struct {
	rt http.RoundTripper
	h  map[string]string
}

func (t headerTransport) RoundTrip(r *http.Request) (*http.Response, error) {
	r = r.Clone(r.Context())
	for k, v := range t.h {
		r.Header.Set(k, v)
	}
	return t.rt.RoundTrip(r)
}

// jsonField is the string field name of the JSON object b.
func jsonField(t *testing.T, b []byte, name string) string {
	t.Helper()
	var m map[string]any
	if err := json.Unmarshal(b, &m); err != nil {
		t.Fatal(err)
	}
	v, _ := m[name].(string)
	if v == "" {
		t.Fatalf("no %s in %s", name, redactTokens(string(b)))
	}
	return v
}

// redactTokens hides what looks like a token.
func redactTokens(s string) string {
	for _, f := range strings.Fields(s) {
		if i := strings.Index(f, "nlc_"); i >= 0 {
			s = strings.ReplaceAll(s, f, f[:i]+"nlc_…")
		}
	}
	return s
}
