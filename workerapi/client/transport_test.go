package client_test

import (
	"context"
	"crypto/ecdsa"
	"crypto/ed25519"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"errors"
	"math/big"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nodelane/nodelane/internal/apitest"
	"github.com/nodelane/nodelane/workerapi/client"
	"github.com/nodelane/nodelane/workerapi/wire"
)

// testPKI is a CA made in the test and a leaf it signed.
type testPKI struct {
	ca, leaf *x509.Certificate
	pair     tls.Certificate
}

// newTestPKI makes a CA and a leaf for names (DNS names or IP addresses).
func newTestPKI(t *testing.T, names ...string) *testPKI {
	t.Helper()
	caKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	now := time.Now()
	caTmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "nodelane test CA"},
		NotBefore: now.Add(-time.Hour), NotAfter: now.Add(time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign,
	}
	caDER, err := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, &caKey.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	ca, err := x509.ParseCertificate(caDER)
	if err != nil {
		t.Fatal(err)
	}
	leafKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	leafTmpl := &x509.Certificate{
		SerialNumber: big.NewInt(2), Subject: pkix.Name{CommonName: names[0]},
		NotBefore: now.Add(-time.Hour), NotAfter: now.Add(time.Hour),
		KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}
	for _, n := range names {
		if ip := net.ParseIP(n); ip != nil {
			leafTmpl.IPAddresses = append(leafTmpl.IPAddresses, ip)
		} else {
			leafTmpl.DNSNames = append(leafTmpl.DNSNames, n)
		}
	}
	leafDER, err := x509.CreateCertificate(rand.Reader, leafTmpl, ca, &leafKey.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	leaf, err := x509.ParseCertificate(leafDER)
	if err != nil {
		t.Fatal(err)
	}
	return &testPKI{ca: ca, leaf: leaf, pair: tls.Certificate{Certificate: [][]byte{leafDER}, PrivateKey: leafKey, Leaf: leaf}}
}

func (p *testPKI) pool() *x509.CertPool {
	pool := x509.NewCertPool()
	pool.AddCert(p.ca)
	return pool
}

// tlsServer serves env's handler over TLS with pki's leaf, counting the
// requests that reached it.
func tlsServer(t *testing.T, env *apitest.Env, pki *testPKI) (*httptest.Server, *atomic.Int64) {
	t.Helper()
	var reached atomic.Int64
	h := env.Server.Handler()
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		reached.Add(1)
		h.ServeHTTP(w, r)
	}))
	srv.TLS = &tls.Config{Certificates: []tls.Certificate{pki.pair}}
	srv.StartTLS()
	t.Cleanup(srv.Close)
	return srv, &reached
}

// A Client talks to a control plane over TLS with the roots, pins and
// dialer of its Config; a handshake it refuses sends nothing.
func TestClientTLS(t *testing.T) {
	env := apitest.New(t, "sqlite")
	pki := newTestPKI(t, "cp.nodelane.test", "127.0.0.1")
	srv, reached := tlsServer(t, env, pki)
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
		if err := register(t, base, "tls-roots", func(c *client.Config) { c.RootCAs = pki.pool() }); err != nil {
			t.Fatal(err)
		}
	})
	t.Run("pin of the leaf", func(t *testing.T) {
		pin := client.PublicKeyPin(pki.leaf)
		if err := register(t, base, "tls-pin-leaf", func(c *client.Config) {
			c.RootCAs, c.PinnedPublicKeys = pki.pool(), []string{client.PublicKeyPin(pki.ca), pin}
		}); err != nil {
			t.Fatal(err)
		}
	})
	t.Run("pin of the CA", func(t *testing.T) {
		// The server sends only its leaf: the CA's key is matched in the
		// chain the leaf was verified through.
		if err := register(t, base, "tls-pin-ca", func(c *client.Config) {
			c.RootCAs, c.PinnedPublicKeys = pki.pool(), []string{client.PublicKeyPin(pki.ca)}
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
			c.RootCAs = pki.pool()
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
			other := newTestPKI(t, "127.0.0.1")
			c.RootCAs, c.PinnedPublicKeys = pki.pool(), []string{client.PublicKeyPin(other.leaf)}
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
