package client_test

import (
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/nodelane/nodelane/internal/apitest"
	"github.com/nodelane/nodelane/internal/testpki"
	"github.com/nodelane/nodelane/workerapi/client"
	"github.com/nodelane/nodelane/workerapi/wire"
)

// tlsServer serves env's handler over TLS with leaf, counting the
// requests that reached it.
func tlsServer(t *testing.T, env *apitest.Env, leaf testpki.Leaf) (*httptest.Server, *atomic.Int64) {
	t.Helper()
	var reached atomic.Int64
	h := env.Server.Handler()
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		reached.Add(1)
		h.ServeHTTP(w, r)
	}))
	srv.TLS = &tls.Config{Certificates: []tls.Certificate{leaf.Pair}}
	srv.StartTLS()
	t.Cleanup(srv.Close)
	return srv, &reached
}

// A Client talks to a control plane over TLS with the roots, pins and
// dialer of its Config; a handshake it refuses sends nothing.
func TestClientTLS(t *testing.T) {
	t.Parallel()
	env := apitest.New(t, "sqlite")
	ca := testpki.NewCA(t, "nodelane client test CA")
	leaf := ca.Leaf(t, "cp.nodelane.test", "127.0.0.1")
	srv, reached := tlsServer(t, env, leaf)
	addr := srv.Listener.Addr().String()
	base := "https://" + addr
	ctx := context.Background()

	register := func(t *testing.T, url, node string, mod func(*client.Config)) error {
		t.Helper()
		c := newClClient(t, url, func(c *client.Config) { c.MaxAttempts = 1; mod(c) })
		_, err := c.Register(ctx, env.ProvisioningToken, clRegistration(node))
		if err == nil {
			_, err = c.Heartbeat(ctx, wire.HeartbeatRequest{Status: "idle"})
		}
		return err
	}
	t.Run("roots", func(t *testing.T) {
		if err := register(t, base, "tls-roots", func(c *client.Config) { c.RootCAs = ca.Pool() }); err != nil {
			t.Fatal(err)
		}
	})
	t.Run("pin of the leaf", func(t *testing.T) {
		pin := client.PublicKeyPin(leaf.Cert)
		if err := register(t, base, "tls-pin-leaf", func(c *client.Config) {
			c.RootCAs, c.PinnedPublicKeys = ca.Pool(), []string{client.PublicKeyPin(ca.Cert), pin}
		}); err != nil {
			t.Fatal(err)
		}
	})
	t.Run("pin of the CA", func(t *testing.T) {
		// The server sends only its leaf: the CA's key is matched in the
		// chain the leaf was verified through.
		if err := register(t, base, "tls-pin-ca", func(c *client.Config) {
			c.RootCAs, c.PinnedPublicKeys = ca.Pool(), []string{client.PublicKeyPin(ca.Cert)}
		}); err != nil {
			t.Fatal(err)
		}
	})
	t.Run("dial another address", func(t *testing.T) {
		// The name in the URL is the TLS name and the signed @authority;
		// the connection goes where DialContext says.
		_, port, _ := net.SplitHostPort(addr)
		var dialed atomic.Int64
		var d net.Dialer
		if err := register(t, "https://cp.nodelane.test:"+port, "tls-dial", func(c *client.Config) {
			c.RootCAs = ca.Pool()
			c.DialContext = func(ctx context.Context, network, _ string) (net.Conn, error) {
				dialed.Add(1)
				return d.DialContext(ctx, network, addr)
			}
		}); err != nil {
			t.Fatal(err)
		}
		if dialed.Load() == 0 {
			t.Error("DialContext was not used")
		}
	})

	refused := []struct {
		name  string
		mod   func(*client.Config)
		check func(error) bool
	}{
		{"untrusted CA", func(*client.Config) {}, func(err error) bool {
			var ve *tls.CertificateVerificationError
			return errors.As(err, &ve)
		}},
		{"wrong pin", func(c *client.Config) {
			other := testpki.NewCA(t, "another CA").Leaf(t)
			c.RootCAs, c.PinnedPublicKeys = ca.Pool(), []string{client.PublicKeyPin(other.Cert)}
		}, func(err error) bool { return errors.Is(err, client.ErrPinMismatch) }},
	}
	for _, tt := range refused {
		t.Run(tt.name, func(t *testing.T) {
			before := reached.Load()
			err := register(t, base, "tls-refused", tt.mod)
			if err == nil || !tt.check(err) {
				t.Fatalf("register: %v, want a refused handshake", err)
			}
			if n := reached.Load() - before; n != 0 {
				t.Errorf("%d requests reached the server through a refused handshake", n)
			}
		})
	}
}

// New refuses plain http to another machine unless told otherwise, and
// the TLS settings beside a caller's HTTPClient.
func TestClientInsecureHTTP(t *testing.T) {
	t.Parallel()
	_, key, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	id, err := client.NewIdentity(key)
	if err != nil {
		t.Fatal(err)
	}
	for _, base := range []string{"http://127.0.0.1:8080", "http://127.0.0.2", "http://[::1]:8080", "http://localhost:8080", "https://cp.example.com"} {
		if _, err := client.New(base, &client.Config{Identity: id}); err != nil {
			t.Errorf("New(%s): %v", base, err)
		}
	}
	for _, base := range []string{"http://cp.example.com", "http://10.0.0.5:8080", "http://[2001:db8::1]/nodelane", "http://localhost.example.com"} {
		_, err := client.New(base, &client.Config{Identity: id})
		if !errors.Is(err, client.ErrConfig) || !strings.Contains(err.Error(), "AllowInsecureHTTP") {
			t.Errorf("New(%s): %v, want ErrConfig naming AllowInsecureHTTP", base, err)
		}
		if _, err := client.New(base, &client.Config{Identity: id, AllowInsecureHTTP: true}); err != nil {
			t.Errorf("New(%s) with AllowInsecureHTTP: %v", base, err)
		}
	}
	bad := []struct {
		name string
		cfg  client.Config
		want string
	}{
		{"roots beside an HTTPClient", client.Config{HTTPClient: http.DefaultClient, RootCAs: x509.NewCertPool()}, "HTTPClient"},
		{"pins beside an HTTPClient", client.Config{HTTPClient: http.DefaultClient, PinnedPublicKeys: []string{strings.Repeat("A", 43) + "="}}, "HTTPClient"},
		{"dialer beside an HTTPClient", client.Config{HTTPClient: http.DefaultClient, DialContext: (&net.Dialer{}).DialContext}, "HTTPClient"},
		{"pin not base64", client.Config{PinnedPublicKeys: []string{"not a pin"}}, "PinnedPublicKeys[0]"},
		{"pin of the wrong size", client.Config{PinnedPublicKeys: []string{"AAAA"}}, "PinnedPublicKeys[0]"},
	}
	for _, tt := range bad {
		cfg := tt.cfg
		cfg.Identity = id
		_, err := client.New("https://cp.example.com", &cfg)
		if !errors.Is(err, client.ErrConfig) || !strings.Contains(err.Error(), tt.want) {
			t.Errorf("%s: %v, want ErrConfig naming %s", tt.name, err, tt.want)
		}
	}
	if _, err := client.New("https://user:secret@cp.example.com", &client.Config{Identity: id}); !errors.Is(err, client.ErrConfig) || strings.Contains(err.Error(), "secret") {
		t.Errorf("a base URL with a password: %v, want ErrConfig without the password", err)
	}
}

// A redirect is not followed: the error names where it led.
func TestClientRedirect(t *testing.T) {
	t.Parallel()
	var posts atomic.Int64
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		posts.Add(1)
		http.Redirect(w, r, "https://cp.example.com"+r.URL.Path, http.StatusPermanentRedirect)
	}))
	defer srv.Close()
	c := newClClient(t, srv.URL, nil)
	_, err := c.Register(context.Background(), "nlc_x", clRegistration("redirected"))
	var ae *client.APIError
	if !errors.As(err, &ae) || ae.Status != http.StatusPermanentRedirect || !strings.Contains(ae.Message, "https://cp.example.com/workers/register") {
		t.Fatalf("register: %v, want a 308 naming the Location", err)
	}
	if n := posts.Load(); n != 1 {
		t.Errorf("%d requests, want 1: a redirect is final", n)
	}
}
