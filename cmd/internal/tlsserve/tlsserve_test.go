package tlsserve

import (
	"bufio"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"flag"
	"io"
	"log"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"golang.org/x/crypto/acme"

	"github.com/nodelane/nodelane/internal/testpki"
)

func parse(t *testing.T, args ...string) (*Flags, error) {
	t.Helper()
	fs := flag.NewFlagSet("server", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	f := RegisterFlags(fs)
	if err := fs.Parse(args); err != nil {
		t.Fatalf("parse %q: %v", args, err)
	}
	return f, f.Check()
}

func TestFlagsCheck(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name string
		args []string
		want string // "" for valid
	}{
		{"none", nil, ""},
		{"files", []string{"-tls-cert", "c.pem", "-tls-key", "k.pem"}, ""},
		{"files and http", []string{"-tls-cert", "c.pem", "-tls-key", "k.pem", "-http-addr", ":80"}, ""},
		{"acme", []string{"-acme-domain", "cp.example.com", "-acme-domain", "CP2.example.com.", "-acme-dir", "/var/lib/x",
			"-acme-directory-url", "https://acme.example.com/dir", "-acme-email", "ops@example.com", "-acme-ca-file", "ca.pem", "-http-addr", ":80"}, ""},
		{"cert without key", []string{"-tls-cert", "c.pem"}, "-tls-cert and -tls-key go together"},
		{"key without cert", []string{"-tls-key", "k.pem"}, "-tls-cert and -tls-key go together"},
		{"files and acme", []string{"-tls-cert", "c.pem", "-tls-key", "k.pem", "-acme-domain", "cp.example.com"}, "exclusive"},
		{"http without tls", []string{"-http-addr", ":80"}, "-http-addr needs TLS"},
		{"acme-dir alone", []string{"-acme-dir", "d"}, "-acme-dir needs -acme-domain"},
		{"acme-dir default given", []string{"-acme-dir", DefaultACMEDir}, "-acme-dir needs -acme-domain"},
		{"acme-directory-url alone", []string{"-acme-directory-url", "https://a.example/dir"}, "-acme-directory-url needs -acme-domain"},
		{"acme-email alone", []string{"-acme-email", "a@example.com"}, "-acme-email needs -acme-domain"},
		{"acme-ca-file alone", []string{"-acme-ca-file", "ca.pem"}, "-acme-ca-file needs -acme-domain"},
		{"acme-ca-file with files", []string{"-tls-cert", "c.pem", "-tls-key", "k.pem", "-acme-ca-file", "ca.pem"}, "-acme-ca-file needs -acme-domain"},
		{"single label", []string{"-acme-domain", "localhost"}, "at least one dot"},
		{"wildcard", []string{"-acme-domain", "*.example.com"}, "DNS-01"},
		{"ip", []string{"-acme-domain", "192.0.2.1"}, "IP address"},
		{"port", []string{"-acme-domain", "cp.example.com:443"}, `character ':'`},
		{"scheme", []string{"-acme-domain", "https://cp.example.com"}, `character ':'`},
		{"unicode", []string{"-acme-domain", "bücher.example"}, "punycode"},
		{"empty label", []string{"-acme-domain", "cp..example.com"}, "bad label"},
		{"hyphen label", []string{"-acme-domain", "-cp.example.com"}, "bad label"},
		{"empty", []string{"-acme-domain", ""}, "empty name"},
		{"twice", []string{"-acme-domain", "cp.example.com", "-acme-domain", "CP.example.com"}, "given twice"},
		{"empty acme-dir", []string{"-acme-domain", "cp.example.com", "-acme-dir", ""}, "-acme-dir must not be empty"},
		{"http directory", []string{"-acme-domain", "cp.example.com", "-acme-directory-url", "http://acme.example.com/dir"}, "https://"},
		{"relative directory", []string{"-acme-domain", "cp.example.com", "-acme-directory-url", "acme.example.com/dir"}, "https://"},
		{"userinfo directory", []string{"-acme-domain", "cp.example.com", "-acme-directory-url", "https://u:p@acme.example.com/dir"}, "https://"},
		{"email display name", []string{"-acme-domain", "cp.example.com", "-acme-email", "Ops <ops@example.com>"}, "bare address"},
		{"email garbage", []string{"-acme-domain", "cp.example.com", "-acme-email", "ops"}, "bare address"},
		{"negative hsts", []string{"-tls-cert", "c.pem", "-tls-key", "k.pem", "-hsts-max-age", "-1s"}, "-hsts-max-age"},
		{"fractional hsts", []string{"-tls-cert", "c.pem", "-tls-key", "k.pem", "-hsts-max-age", "1.5s"}, "whole seconds"},
		{"hsts without tls", []string{"-hsts-max-age", "1h"}, "-hsts-max-age needs TLS"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			f, err := parse(t, tc.args...)
			if tc.want == "" {
				if err != nil {
					t.Fatal(err)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tc.want) || !errors.Is(err, ErrFlags) {
				t.Fatalf("error %v, want one saying %q (ErrFlags)", err, tc.want)
			}
			_ = f
		})
	}
	f, err := parse(t, "-acme-domain", "CP.Example.com.", "-acme-domain", "b.example.com")
	if err != nil {
		t.Fatal(err)
	}
	if want := []string{"cp.example.com", "b.example.com"}; !slices.Equal(f.ACMEDomains, want) || f.ACMEDir != DefaultACMEDir {
		t.Fatalf("domains %q dir %q", f.ACMEDomains, f.ACMEDir)
	}
}

func TestRedirectHandler(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name, port, method, target, host, want string
	}{
		{"get", "8443", "GET", "/console/?a=1&b=%2F", "cp.example.com", "https://cp.example.com:8443/console/?a=1&b=%2F"},
		{"port in host", "8443", "GET", "/x", "cp.example.com:8080", "https://cp.example.com:8443/x"},
		{"443 dropped", "443", "GET", "/x", "cp.example.com:80", "https://cp.example.com/x"},
		{"post keeps method (308)", "443", "POST", "/workers/register", "CP.Example.com", "https://cp.example.com/workers/register"},
		{"ipv6", "8443", "GET", "/", "[::1]:8080", "https://[::1]:8443/"},
		{"ipv6 on 443", "443", "GET", "/", "[::1]", "https://[::1]/"},
		{"escaped path", "443", "GET", "/a%20b/c%2Fd", "h.example", "https://h.example/a%20b/c%2Fd"},
		{"options star", "443", "OPTIONS", "*", "h.example", "https://h.example/"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			req := httptest.NewRequest(tc.method, tc.target, strings.NewReader("body"))
			req.Host = tc.host
			rec := httptest.NewRecorder()
			RedirectHandler(tc.port, func(h string) string { return h }).ServeHTTP(rec, req)
			if rec.Code != http.StatusPermanentRedirect || rec.Header().Get("Location") != tc.want {
				t.Fatalf("%d Location %q, want 308 %q", rec.Code, rec.Header().Get("Location"), tc.want)
			}
		})
	}
	req := httptest.NewRequest("GET", "/", nil)
	req.Host = ""
	rec := httptest.NewRecorder()
	RedirectHandler("443", func(h string) string { return h }).ServeHTTP(rec, req)
	if rec.Code != http.StatusBadRequest || rec.Header().Get("Location") != "" {
		t.Fatalf("no name: %d %q", rec.Code, rec.Header().Get("Location"))
	}
}

// filesServer is a Server of a new certificate (names localhost and
// 127.0.0.1) from files, with cfg, and the test CA's roots.
func filesServer(t *testing.T, cfg *Config, args ...string) (*Server, *x509.CertPool) {
	t.Helper()
	ca := testpki.NewCA(t, "tlsserve test CA")
	l := ca.Leaf(t)
	dir := t.TempDir()
	certFile, keyFile := filepath.Join(dir, "cert.pem"), filepath.Join(dir, "key.pem")
	testpki.WriteAtomic(t, certFile, l.CertPEM)
	testpki.WriteAtomic(t, keyFile, l.KeyPEM)
	f, err := parse(t, append([]string{"-tls-cert", certFile, "-tls-key", keyFile, "-http-addr", "127.0.0.1:0"}, args...)...)
	if err != nil {
		t.Fatal(err)
	}
	s, err := New(f, cfg)
	if err != nil {
		t.Fatal(err)
	}
	return s, ca.Pool()
}

// The plain HTTP listener redirects to one of the server's own names,
// never to the one a request's Host gives: over real HTTP on loopback, a
// hostile Host goes to the configured host (Config.Host, else the
// certificate's first name), a Host that is one of the names stays.
func TestRedirectConfiguredHost(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name, host, reqHost, want string
	}{
		{"hostile host, certificate's name", "", "evil.example", "https://localhost:8443/a?b=1"},
		{"hostile host, Config.Host", "CP.example.com", "evil.example:80", "https://cp.example.com:8443/a?b=1"},
		{"a name of the certificate", "cp.example.com", "LOCALHOST.", "https://localhost:8443/a?b=1"},
		{"an address of the certificate", "", "127.0.0.1:80", "https://127.0.0.1:8443/a?b=1"},
		{"Config.Host itself", "cp.example.com", "cp.example.com", "https://cp.example.com:8443/a?b=1"},
		{"no Host", "cp.example.com", "", "https://cp.example.com:8443/a?b=1"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			s, _ := filesServer(t, &Config{Host: tc.host})
			hs := httptest.NewServer(s.HTTPHandler("8443"))
			defer hs.Close()
			conn, err := net.Dial("tcp", hs.Listener.Addr().String())
			if err != nil {
				t.Fatal(err)
			}
			defer conn.Close()
			// Written by hand: net/http's client always sends a Host.
			host := "Host: " + tc.reqHost + "\r\n"
			if tc.reqHost == "" {
				host = "Host:\r\n"
			}
			if _, err := io.WriteString(conn, "GET /a?b=1 HTTP/1.1\r\n"+host+"Connection: close\r\n\r\n"); err != nil {
				t.Fatal(err)
			}
			resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
			if err != nil {
				t.Fatal(err)
			}
			resp.Body.Close()
			if resp.StatusCode != http.StatusPermanentRedirect || resp.Header.Get("Location") != tc.want {
				t.Fatalf("Host %q: %d Location %q, want 308 %q", tc.reqHost, resp.StatusCode, resp.Header.Get("Location"), tc.want)
			}
			if resp.Header.Get("Strict-Transport-Security") != "" {
				t.Errorf("plain HTTP sends HSTS: %q", resp.Header.Get("Strict-Transport-Security"))
			}
		})
	}
}

// Every answer over TLS carries Strict-Transport-Security, with
// -hsts-max-age's max-age (a year by default); -hsts-max-age 0 sends none.
func TestHSTS(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		args []string
		want string
	}{
		{nil, "max-age=31536000"},
		{[]string{"-hsts-max-age", "1h"}, "max-age=3600"},
		{[]string{"-hsts-max-age", "0"}, ""},
	} {
		t.Run(tc.want, func(t *testing.T) {
			t.Parallel()
			s, roots := filesServer(t, nil, tc.args...)
			hs := httptest.NewUnstartedServer(s.HSTS(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				http.Error(w, "nope", http.StatusNotFound) // errors too
			})))
			hs.TLS = s.TLSConfig()
			hs.StartTLS()
			defer hs.Close()
			hc := &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: roots, ServerName: "localhost"}}}
			resp, err := hc.Get(hs.URL)
			if err != nil {
				t.Fatal(err)
			}
			resp.Body.Close()
			if resp.StatusCode != http.StatusNotFound || resp.Header.Get("Strict-Transport-Security") != tc.want {
				t.Fatalf("%d Strict-Transport-Security %q, want 404 %q", resp.StatusCode, resp.Header.Get("Strict-Transport-Security"), tc.want)
			}
		})
	}
}

// Serving a certificate file over real TLS on loopback: TLS 1.2 at
// least, the certificate verifies against its CA, and the plain HTTP
// handler only redirects.
func TestServerFiles(t *testing.T) {
	t.Parallel()
	ca := testpki.NewCA(t, "tlsserve test CA")
	l := ca.Leaf(t)
	dir := t.TempDir()
	certFile, keyFile := filepath.Join(dir, "cert.pem"), filepath.Join(dir, "key.pem")
	testpki.WriteAtomic(t, certFile, l.CertPEM)
	testpki.WriteAtomic(t, keyFile, l.KeyPEM)
	f, err := parse(t, "-tls-cert", certFile, "-tls-key", keyFile, "-http-addr", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	s, err := New(f, nil)
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "hello") }),
		ErrorLog: log.New(io.Discard, "", 0)}
	go srv.Serve(tls.NewListener(ln, s.TLSConfig()))
	defer srv.Close()
	url := "https://" + ln.Addr().String()
	roots := x509.NewCertPool()
	roots.AddCert(ca.Cert)
	hc := &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: roots}}}
	resp, err := hc.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if string(b) != "hello" || resp.TLS.PeerCertificates[0].SerialNumber.Cmp(l.Cert.SerialNumber) != 0 {
		t.Fatalf("%q from %v", b, resp.TLS.PeerCertificates[0].SerialNumber)
	}
	if _, err := tls.Dial("tcp", ln.Addr().String(), &tls.Config{RootCAs: roots, MinVersion: tls.VersionTLS10, MaxVersion: tls.VersionTLS11}); err == nil || !strings.Contains(err.Error(), "protocol version") {
		t.Fatalf("a TLS 1.1 handshake: %v, want a protocol version alert", err)
	}
	_, port, _ := net.SplitHostPort(ln.Addr().String())
	if got, want := s.URL(ln.Addr(), "/console/"), "https://127.0.0.1:"+port+"/console/"; got != want {
		t.Errorf("URL %q, want %q", got, want)
	}
	if got := s.URL(&net.TCPAddr{IP: net.IPv6zero, Port: 8443}, "/"); got != "https://localhost:8443/" {
		t.Errorf("URL on every address: %q, want the certificate's first DNS name", got)
	}
	if slices.Contains(s.TLSConfig().NextProtos, acme.ALPNProto) {
		t.Errorf("certificate files offer %s", acme.ALPNProto)
	}
	if err := s.Reload(); err != nil {
		t.Fatal(err)
	}
	req := httptest.NewRequest("GET", "/.well-known/acme-challenge/x", nil)
	req.Host = "localhost"
	rec := httptest.NewRecorder()
	s.HTTPHandler(port).ServeHTTP(rec, req)
	if rec.Code != http.StatusPermanentRedirect || rec.Header().Get("Location") != "https://localhost:"+port+"/.well-known/acme-challenge/x" {
		t.Fatalf("without ACME a challenge path is redirected: %d %q", rec.Code, rec.Header().Get("Location"))
	}
}

func TestServerACMESetup(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	caFile := filepath.Join(dir, "ca.pem")
	if err := os.WriteFile(caFile, testpki.NewCA(t, "tlsserve test CA").Leaf(t).CertPEM, 0o600); err != nil {
		t.Fatal(err)
	}
	acmeDir := filepath.Join(dir, "acme", "cache")
	f, err := parse(t, "-acme-domain", "cp.example.com", "-acme-dir", acmeDir, "-acme-ca-file", caFile,
		"-acme-directory-url", "https://127.0.0.1:1/dir", "-http-addr", ":0")
	if err != nil {
		t.Fatal(err)
	}
	s, err := New(f, nil)
	if err != nil {
		t.Fatal(err)
	}
	fi, err := os.Stat(acmeDir)
	if err != nil || fi.Mode().Perm() != 0o700 {
		t.Fatalf("-acme-dir: %v %v", fi.Mode(), err)
	}
	cfg := s.TLSConfig()
	if !slices.Contains(cfg.NextProtos, acme.ALPNProto) || cfg.MinVersion != tls.VersionTLS12 {
		t.Fatalf("ACME TLS config: protos %q, min version %x", cfg.NextProtos, cfg.MinVersion)
	}
	if got := s.URL(&net.TCPAddr{IP: net.IPv6zero, Port: 443}, "/console/"); got != "https://cp.example.com/console/" {
		t.Errorf("URL %q", got)
	}
	if err := s.Reload(); err != nil {
		t.Errorf("Reload under ACME: %v", err)
	}
	// The HTTP handler: not a challenge, redirected; a challenge for a name
	// not configured, refused; one for the name with a port in Host
	// reaches autocert (which has no such token: 404).
	for _, tc := range []struct {
		path, host string
		code       int
	}{
		{"/x?y=1", "cp.example.com", http.StatusPermanentRedirect},
		{"/.well-known/acme-challenge/tok", "other.example.com", http.StatusForbidden},
		{"/.well-known/acme-challenge/tok", "CP.example.com:8080", http.StatusNotFound},
	} {
		req := httptest.NewRequest("GET", tc.path, nil)
		req.Host = tc.host
		rec := httptest.NewRecorder()
		s.HTTPHandler("8443").ServeHTTP(rec, req)
		if rec.Code != tc.code {
			t.Errorf("GET %s Host %s: %d, want %d", tc.path, tc.host, rec.Code, tc.code)
		}
	}

	// Bad setups stop the server at start.
	open := filepath.Join(dir, "open")
	if err := os.Mkdir(open, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(open, 0o755); err != nil {
		t.Fatal(err)
	}
	notDir := filepath.Join(dir, "file")
	os.WriteFile(notDir, nil, 0o600)
	garbage := filepath.Join(dir, "garbage.pem")
	os.WriteFile(garbage, []byte("nope"), 0o600)
	for _, tc := range []struct {
		name string
		args []string
		want string
	}{
		{"open dir", []string{"-acme-dir", open}, "chmod 700"},
		{"not a dir", []string{"-acme-dir", notDir}, "not a directory"},
		{"missing ca file", []string{"-acme-dir", acmeDir, "-acme-ca-file", filepath.Join(dir, "missing.pem")}, "missing.pem"},
		{"garbage ca file", []string{"-acme-dir", acmeDir, "-acme-ca-file", garbage}, "garbage.pem"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			f, err := parse(t, append([]string{"-acme-domain", "cp.example.com"}, tc.args...)...)
			if err != nil {
				t.Fatal(err)
			}
			if _, err := New(f, nil); err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("error %v, want one saying %q", err, tc.want)
			}
		})
	}
}
