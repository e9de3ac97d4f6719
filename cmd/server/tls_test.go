package main

import (
	"context"
	"crypto/tls"
	"errors"
	"io/fs"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/nodelane/nodelane/internal/syncbuf"

	"github.com/nodelane/nodelane/cmd/internal/tlsserve"
	"github.com/nodelane/nodelane/internal/testdb"
	"github.com/nodelane/nodelane/internal/testpki"
)

// Over TLS every answer carries Strict-Transport-Security, and
// -http-addr redirects a request with a hostile Host to -public-url's
// host, not to the one the request gives, and sends no HSTS.
func TestTLSHSTSAndRedirect(t *testing.T) {
	t.Parallel()
	ca := testpki.NewCA(t, "server test CA")
	l := ca.Leaf(t)
	dir := t.TempDir()
	certFile, keyFile := filepath.Join(dir, "cert.pem"), filepath.Join(dir, "key.pem")
	testpki.WriteAtomic(t, certFile, l.CertPEM)
	testpki.WriteAtomic(t, keyFile, l.KeyPEM)
	f := newFiles(t, testdb.Dialects()[0])
	s := serve(t, append(f.args("127.0.0.1:0"), "-tls-cert", certFile, "-tls-key", keyFile,
		"-http-addr", "127.0.0.1:0", "-public-url", "https://cp.example.com")...)
	hc := &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: ca.Pool()}}}
	defer hc.CloseIdleConnections()
	resp, err := hc.Get("https://" + s.addr + "/healthz")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if got := resp.Header.Get("Strict-Transport-Security"); resp.StatusCode != http.StatusOK || got != "max-age=31536000" {
		t.Errorf("GET /healthz over TLS: %d Strict-Transport-Security %q, want 200 max-age=31536000", resp.StatusCode, got)
	}

	m := regexp.MustCompile(`msg="plain HTTP listener" http_addr=(\S+)`).FindStringSubmatch(s.stderr.String())
	if m == nil {
		t.Fatalf("no plain HTTP listener logged:\n%s", s.stderr.String())
	}
	req, _ := http.NewRequest("GET", "http://"+m[1]+"/console/?x=1", nil)
	req.Host = "evil.example"
	noFollow := &http.Client{CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	resp, err = noFollow.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	_, port, _ := net.SplitHostPort(s.addr)
	if want := "https://cp.example.com:" + port + "/console/?x=1"; resp.StatusCode != http.StatusPermanentRedirect || resp.Header.Get("Location") != want {
		t.Errorf("Host evil.example on -http-addr: %d Location %q, want 308 %q", resp.StatusCode, resp.Header.Get("Location"), want)
	}
	if got := resp.Header.Get("Strict-Transport-Security"); got != "" {
		t.Errorf("plain HTTP sends Strict-Transport-Security %q", got)
	}
}

// TestTLSFlagErrors checks that bad TLS flags and files stop the server
// before it binds or bootstraps, with an error naming the flag or the
// file.
func TestTLSFlagErrors(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	garbage := filepath.Join(dir, "garbage.pem")
	if err := os.WriteFile(garbage, []byte("not PEM\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	missing := filepath.Join(dir, "missing.pem")
	openKey := filepath.Join(dir, "open-key.pem")
	if err := os.WriteFile(openKey, testpki.NewCA(t, "server test CA").Leaf(t).KeyPEM, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(openKey, 0o644); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name  string
		flags []string
		want  string
		is    error
	}{
		{"http-addr without TLS", []string{"-http-addr", "127.0.0.1:0"}, "-http-addr needs TLS", tlsserve.ErrFlags},
		{"cert without key", []string{"-tls-cert", garbage}, "-tls-key", tlsserve.ErrFlags},
		{"files and ACME", []string{"-tls-cert", garbage, "-tls-key", garbage, "-acme-domain", "cp.example.com"}, "exclusive", tlsserve.ErrFlags},
		{"acme flag without a domain", []string{"-acme-email", "ops@example.com"}, "-acme-email needs -acme-domain", tlsserve.ErrFlags},
		{"bad domain", []string{"-acme-domain", "localhost"}, "-acme-domain", tlsserve.ErrFlags},
		{"missing certificate", []string{"-tls-cert", missing, "-tls-key", garbage}, missing, fs.ErrNotExist},
		{"garbage certificate", []string{"-tls-cert", garbage, "-tls-key", garbage}, garbage, tlsserve.ErrNoCertificate},
		{"world-readable key", []string{"-tls-cert", garbage, "-tls-key", openKey}, openKey + ": is readable by group or others (mode 0644)", tlsserve.ErrKeyReadable},
		{"hsts without TLS", []string{"-hsts-max-age", "1h"}, "-hsts-max-age needs TLS", tlsserve.ErrFlags},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			f := newFiles(t, testdb.Dialects()[0])
			var stdout, stderr syncbuf.Buffer
			err := run(context.Background(), append(f.args("127.0.0.1:0"), tc.flags...), &stdout, &stderr)
			if err == nil || !strings.Contains(err.Error(), tc.want) || !errors.Is(err, tc.is) {
				t.Fatalf("error %v, want one saying %q (%v)", err, tc.want, tc.is)
			}
			if stdout.String() != "" {
				t.Fatalf("printed %q", stdout.String())
			}
			for _, p := range []string{f.tokens, f.secrets} {
				if _, err := os.Stat(p); !errors.Is(err, fs.ErrNotExist) {
					t.Fatalf("%s exists after a bad start: %v", p, err)
				}
			}
		})
	}
}
