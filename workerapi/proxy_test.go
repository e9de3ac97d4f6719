package workerapi_test

import (
	"bytes"
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"encoding/json"
	"errors"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/netip"
	"net/url"
	"strings"
	"sync"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/nodelane/nodelane/internal/apitest"
	"github.com/nodelane/nodelane/lease"
	"github.com/nodelane/nodelane/workerapi"
	"github.com/nodelane/nodelane/workerapi/client"
	"github.com/nodelane/nodelane/workerapi/wire"
)

// A proxy in front of the control plane: a real httputil.ReverseProxy,
// over loopback, that forwards to the Server with SetURL (so Host becomes
// the Server's address) and, when prefix is set, serves it under prefix and
// strips it. It sends X-Forwarded-For, -Host and -Proto (SetXForwarded),
// and X-Forwarded-Prefix when it strips one.
type frontProxy struct {
	// URL is the URL workers use: the proxy's address and prefix.
	URL string
	ln  net.Listener
}

// listenProxy binds the proxy's address first, so that the Server can be
// told its public origin before the proxy forwards to it.
func listenProxy(t *testing.T, prefix string) *frontProxy {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	return &frontProxy{URL: "http://" + ln.Addr().String() + prefix, ln: ln}
}

// serve starts the proxy in front of target, stripping prefix (rewriteHost
// false keeps the Host the client sent, as nginx's proxy_set_header Host
// $host does).
func (p *frontProxy) serve(t *testing.T, target, prefix string, rewriteHost bool) {
	t.Helper()
	u, err := url.Parse(target)
	if err != nil {
		t.Fatal(err)
	}
	var h http.Handler = &httputil.ReverseProxy{Rewrite: func(pr *httputil.ProxyRequest) {
		pr.SetURL(u)
		pr.SetXForwarded()
		if !rewriteHost {
			pr.Out.Host = pr.In.Host
		}
		if prefix != "" {
			pr.Out.Header.Set("X-Forwarded-Prefix", prefix)
		}
	}}
	if prefix != "" {
		h = http.StripPrefix(prefix, h)
	}
	srv := httptest.NewUnstartedServer(h)
	srv.Listener.Close()
	srv.Listener = p.ln
	srv.Start()
	t.Cleanup(srv.Close)
}

func proxyClient(t *testing.T, base string) *client.Client {
	t.Helper()
	_, key, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	id, err := client.NewIdentity(key)
	if err != nil {
		t.Fatal(err)
	}
	c, err := client.New(base, &client.Config{Identity: id, MaxAttempts: 1})
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func proxyRegistration(node string) wire.RegisterRequest {
	return wire.RegisterRequest{
		NodeID: node, Name: node, Hostname: node + ".local", Role: "local_gpu_compute",
		Capabilities:   wire.Capabilities{JobTypes: []string{"status_check"}},
		GovernorLimits: wire.GovernorLimits{MaxJobs: 1},
		Version:        "worker/test", HeartbeatIntervalSeconds: 30,
	}
}

// With PublicOrigin set to the URL workers use, the whole worker flow
// passes through a proxy that rewrites Host and strips a prefix: register,
// heartbeat, a long-polled lease, accept, status, complete.
func TestProxyPublicOrigin(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name        string
		prefix      string
		rewriteHost bool
	}{
		{"Host rewritten", "", true},
		{"prefix stripped", "/nodelane", false},
		{"Host rewritten and prefix stripped", "/nodelane", true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			p := listenProxy(t, tc.prefix)
			env := apitest.New(t, "sqlite", apitest.Started(), apitest.WithConfig(func(c *workerapi.Config) {
				c.PublicOrigin = p.URL
			}))
			p.serve(t, env.URL, tc.prefix, tc.rewriteHost)
			ctx := context.Background()
			c := proxyClient(t, p.URL)
			if _, err := c.Register(ctx, env.ProvisioningToken, proxyRegistration("node-p")); err != nil {
				t.Fatalf("register through the proxy: %v", err)
			}
			if _, err := c.Heartbeat(ctx, wire.HeartbeatRequest{Status: "idle"}); err != nil {
				t.Fatalf("heartbeat: %v", err)
			}
			job := env.Enqueue(t, lease.NewJob{Type: "status_check"})
			lr, err := c.Lease(ctx, wire.LeaseRequest{SupportedJobTypes: []string{"status_check"}, WaitSeconds: 5})
			if err != nil || len(lr.Leases) != 1 || lr.Leases[0].Job.ID != job.ID {
				t.Fatalf("lease: %v, %+v", err, lr)
			}
			tok := lr.Leases[0].LeaseToken
			if _, err := c.Accept(ctx, job.ID, wire.TokenRequest{LeaseToken: tok}); err != nil {
				t.Fatalf("accept: %v", err)
			}
			if _, err := c.Status(ctx, job.ID, wire.StatusRequest{LeaseToken: tok, EventType: "progress", Message: "half"}); err != nil {
				t.Fatalf("status: %v", err)
			}
			if _, err := c.Complete(ctx, job.ID, wire.CompleteRequest{LeaseToken: tok}); err != nil {
				t.Fatalf("complete: %v", err)
			}
			if j := env.Job(t, job.ID); j.State != lease.StateSucceeded {
				t.Errorf("job %s is %s, want %s", job.ID, j.State, lease.StateSucceeded)
			}
		})
	}
}

// Without PublicOrigin, the same proxy makes register fail 401
// bad_signature, and the message names the component the proxy changed,
// found through the proxy's own headers (X-Forwarded-Host,
// X-Forwarded-Prefix).
func TestProxyWithoutPublicOrigin(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name        string
		prefix      string
		rewriteHost bool
		want        []string
		not         []string
	}{
		{"Host rewritten", "", true,
			[]string{"signed for @authority %q, and this server verifies %q", "rewrites Host", "PublicOrigin"},
			[]string{"@path"}},
		{"prefix stripped", "/nodelane", false,
			[]string{`signed for @path "/nodelane/workers/register", and this server verifies "/workers/register"`, "changes the path", "PublicOrigin"},
			[]string{"@authority"}},
		{"Host rewritten and prefix stripped", "/nodelane", true,
			[]string{`signed for @authority %q and @path "/nodelane/workers/register", and this server verifies %q and "/workers/register"`,
				"rewrites Host and changes the path", "PublicOrigin"}, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			p := listenProxy(t, tc.prefix)
			env := apitest.New(t, "sqlite")
			p.serve(t, env.URL, tc.prefix, tc.rewriteHost)
			public, server := strings.TrimPrefix(p.URL, "http://"), strings.TrimPrefix(env.URL, "http://")
			public, _, _ = strings.Cut(public, "/")
			c := proxyClient(t, p.URL)
			_, err := c.Register(context.Background(), env.ProvisioningToken, proxyRegistration("node-p"))
			var ae *client.APIError
			if !errors.As(err, &ae) || ae.Code != wire.CodeBadSignature || ae.Status != http.StatusUnauthorized {
				t.Fatalf("register without PublicOrigin: %v, want 401 bad_signature", err)
			}
			for _, w := range tc.want {
				if strings.Contains(w, "%q") {
					w = strings.Replace(w, "%q", `"`+public+`"`, 1)
					w = strings.Replace(w, "%q", `"`+server+`"`, 1)
				}
				if !strings.Contains(ae.Message, w) {
					t.Errorf("message %q does not say %q", ae.Message, w)
				}
			}
			for _, n := range tc.not {
				if strings.Contains(ae.Message, n) {
					t.Errorf("message %q names %s, which the proxy did not change", ae.Message, n)
				}
			}
		})
	}
}

// signedFor builds a request that node n signed for signedURL (its Host
// and path) and that the Server receives at env.URL+path with the Host
// host ("" for the Server's address): what a proxy forwards.
func signedFor(t *testing.T, env *apitest.Env, n *apitest.Node, signedURL, path, host string, body any) *http.Request {
	t.Helper()
	b := apitest.Body(t, body)
	req, err := http.NewRequest(http.MethodPost, signedURL, bytes.NewReader(b))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Authorization", "Bearer "+n.Token)
	n.Sign(t, req, b)
	if req.URL, err = url.Parse(env.URL + path); err != nil {
		t.Fatal(err)
	}
	req.Host = host
	return req
}

func refusal(t *testing.T, n *apitest.Node, req *http.Request) string {
	t.Helper()
	resp, body := n.Raw(t, req)
	var e wire.ErrorBody
	if err := json.Unmarshal(body, &e); err != nil || resp.StatusCode != http.StatusUnauthorized || e.Error.Code != wire.CodeBadSignature {
		t.Fatalf("%d %s, want 401 bad_signature", resp.StatusCode, body)
	}
	return e.Error.Message
}

// The diagnosis of a signature that does not verify: it names the
// component a proxy changed only when the signature verifies over the
// value the proxy's headers suggest, and refuses the request all the
// same. Headers that lie name nothing; they never let a request in.
func TestBadSignatureDiagnosis(t *testing.T) {
	t.Parallel()
	env := apitest.New(t, "sqlite")
	n := env.NewNode(t, "node-d")
	n.Register(t, proxyRegistration("node-d"))
	server := strings.TrimPrefix(env.URL, "http://")
	hb := wire.HeartbeatRequest{Status: "idle"}
	const route = "/workers/heartbeat"
	long := strings.Repeat("a", 600) + ".example"
	generic := `(this server verified it over @authority "` + server + `" and @path "` + route + `")`

	for _, tc := range []struct {
		name      string
		signedURL string
		path      string
		headers   map[string]string
		want      string
		not       []string
	}{
		{"Host, told by X-Forwarded-Host", "http://cp.example.com" + route, route,
			map[string]string{"X-Forwarded-Host": "cp.example.com"},
			`it was signed for @authority "cp.example.com", and this server verifies "` + server + `": a proxy in front rewrites Host; set the public origin`,
			[]string{"@path"}},
		{"Host with its default port, told by X-Forwarded-Host and -Proto", "https://cp.example.com" + route, route,
			map[string]string{"X-Forwarded-Host": "CP.example.com:443, other.example", "X-Forwarded-Proto": "https"},
			`it was signed for @authority "cp.example.com", and this server verifies "` + server + `"`, nil},
		{"Host, told by Forwarded", "http://cp.example.com:8443" + route, route,
			map[string]string{"Forwarded": `for=192.0.2.60;proto=http;host="cp.example.com:8443", for=10.0.0.1`},
			`it was signed for @authority "cp.example.com:8443"`, []string{"@path"}},
		{"path, told by X-Forwarded-Prefix", env.URL + "/nodelane" + route, route,
			map[string]string{"X-Forwarded-Prefix": "/nodelane/"},
			`it was signed for @path "/nodelane` + route + `", and this server verifies "` + route + `": a proxy in front changes the path`,
			[]string{"@authority"}},
		{"both", "http://cp.example.com/nodelane" + route, route,
			map[string]string{"X-Forwarded-Host": "cp.example.com", "X-Forwarded-Prefix": "/nodelane"},
			`it was signed for @authority "cp.example.com" and @path "/nodelane` + route + `", and this server verifies "` + server + `" and "` + route + `"`, nil},
		{"neither: no hint", "http://cp.example.com/nodelane" + route, route, nil, generic, []string{"signed for"}},
		{"hints that lie", "http://cp.example.com/nodelane" + route, route,
			map[string]string{"X-Forwarded-Host": "evil.example", "Forwarded": "host=evil.example", "X-Forwarded-Prefix": "/evil"},
			generic, []string{"signed for", "evil"}},
		{"a hint that is half right", "http://cp.example.com/nodelane" + route, route,
			map[string]string{"X-Forwarded-Host": "cp.example.com", "X-Forwarded-Prefix": "/evil"},
			generic, []string{"signed for"}},
		{"an overlong hint is not tried", "http://" + long + route, route,
			map[string]string{"X-Forwarded-Host": long},
			generic, []string{"signed for"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			req := signedFor(t, env, n, tc.signedURL, tc.path, "", hb)
			for k, v := range tc.headers {
				req.Header.Set(k, v)
			}
			msg := refusal(t, n, req)
			if !strings.Contains(msg, tc.want) {
				t.Errorf("message %q\ndoes not say %q", msg, tc.want)
			}
			for _, s := range tc.not {
				if strings.Contains(msg, s) {
					t.Errorf("message %q says %q", msg, s)
				}
			}
		})
	}

	// The cases above run in parallel once the ones below, which run in
	// turn, are done: none changes what another sees.

	// A signature that verifies is accepted whatever the hints say.
	t.Run("hints never matter to a good signature", func(t *testing.T) {
		req := n.Request(t, http.MethodPost, route, hb)
		req.Header.Set("X-Forwarded-Host", "evil.example")
		req.Header.Set("X-Forwarded-Prefix", "/evil")
		if resp, body := n.Raw(t, req); resp.StatusCode != http.StatusOK {
			t.Fatalf("%d %s, want 200", resp.StatusCode, body)
		}
	})
	// A signature over the right values but by another key than the
	// caller's is refused as before, without a diagnosis.
	t.Run("another key", func(t *testing.T) {
		other := env.NewNode(t, "node-other")
		other.Token = n.Token
		req := signedFor(t, env, other, "http://cp.example.com"+route, route, "", hb)
		req.Header.Set("X-Forwarded-Host", "cp.example.com")
		msg := refusal(t, n, req)
		if !strings.Contains(msg, "is not the caller's key") || strings.Contains(msg, "signed for") {
			t.Errorf("message %q, want the keyid refusal without a diagnosis", msg)
		}
	})
	// A diagnosed signature is still a refusal: its nonce is not
	// consumed, and the same bytes sent unchanged to the right place are
	// refused the same way (the request never ran).
	t.Run("the refused request did not run", func(t *testing.T) {
		before := env.Dump(t)
		req := signedFor(t, env, n, "http://cp.example.com"+route, route, "", hb)
		req.Header.Set("X-Forwarded-Host", "cp.example.com")
		refusal(t, n, req)
		if d := cmp.Diff(before, env.Dump(t)); d != "" {
			t.Errorf("a refused request changed the database (-before +after):\n%s", d)
		}
	})
}

// With PublicOrigin set, a worker that signs for another URL (one that
// reaches the Server directly, say) is told that the public origin is not
// the URL it uses, naming the component.
func TestPublicOriginMismatch(t *testing.T) {
	t.Parallel()
	env := apitest.New(t, "sqlite", apitest.WithConfig(func(c *workerapi.Config) {
		c.PublicOrigin = "https://CP.example.com:443/nodelane/"
	}))
	n := env.NewNode(t, "node-m")
	// Register signed for the public origin, received at the root.
	reg := proxyRegistration("node-m")
	reg.PublicKey = n.PublicKey
	n.Token = env.ProvisioningToken
	req := signedFor(t, env, n, "https://cp.example.com/nodelane/workers/register", "/workers/register", "", reg)
	resp, body := n.Raw(t, req)
	if resp.StatusCode != http.StatusCreated {
		t.Fatalf("register signed for the public origin: %d %s", resp.StatusCode, body)
	}
	var out wire.RegisterResponse
	if err := json.Unmarshal(body, &out); err != nil {
		t.Fatal(err)
	}
	n.Token = out.WorkerToken

	// The same worker signing for the Server's own address is refused,
	// and told why.
	server := strings.TrimPrefix(env.URL, "http://")
	msg := refusal(t, n, n.Request(t, http.MethodPost, "/workers/heartbeat", wire.HeartbeatRequest{Status: "idle"}))
	for _, w := range []string{
		`it was signed for @authority "` + server + `" and @path "/workers/heartbeat", and this server verifies "cp.example.com" and "/nodelane/workers/heartbeat"`,
		"the public origin (workerapi.Config.PublicOrigin, server -public-url) is not the URL this worker uses",
	} {
		if !strings.Contains(msg, w) {
			t.Errorf("message %q\ndoes not say %q", msg, w)
		}
	}
	// A query is verified as received.
	req = signedFor(t, env, n, "https://cp.example.com/nodelane/workers/heartbeat?x=%20y", "/workers/heartbeat?x=%20y", "", wire.HeartbeatRequest{Status: "idle"})
	if resp, body := n.Raw(t, req); resp.StatusCode != http.StatusOK {
		t.Fatalf("heartbeat with a query, signed for the public origin: %d %s", resp.StatusCode, body)
	}
}

// The request log's client_addr: the peer's address, and X-Forwarded-For
// only from a trusted proxy.
func TestTrustedProxiesLog(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name    string
		trusted []netip.Prefix
		want    string
	}{
		{"untrusted peer spoofing X-Forwarded-For", nil, "client_addr=127.0.0.1 "},
		{"trusted peer", []netip.Prefix{netip.MustParsePrefix("127.0.0.0/8")}, "client_addr=198.51.100.1 "},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			var logs syncLog
			env := apitest.New(t, "sqlite", apitest.WithConfig(func(c *workerapi.Config) {
				c.TrustedProxies = tc.trusted
				c.Logger = slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
			}))
			n := env.NewNode(t, "node-l")
			n.Register(t, proxyRegistration("node-l"))
			req := n.Request(t, http.MethodPost, "/workers/heartbeat", wire.HeartbeatRequest{Status: "idle"})
			req.Header.Set("X-Forwarded-For", "203.0.113.9, 198.51.100.1")
			if resp, body := n.Raw(t, req); resp.StatusCode != http.StatusOK {
				t.Fatalf("heartbeat: %d %s", resp.StatusCode, body)
			}
			var line string
			for _, l := range strings.Split(logs.String(), "\n") {
				if strings.Contains(l, "route=/workers/heartbeat") {
					line = l
				}
			}
			if !strings.Contains(line, tc.want) {
				t.Errorf("log line %q does not hold %q", line, tc.want)
			}
		})
	}
}

type syncLog struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncLog) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncLog) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}
