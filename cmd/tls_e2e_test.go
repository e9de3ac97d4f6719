package cmd

// The server over TLS with real processes: certificate files made here,
// reloaded on SIGHUP and on change, a worker trusting the test CA
// (-ca-file) completing jobs, and the -http-addr listener redirecting.

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/pem"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/nodelane/nodelane/internal/testpki"
	"github.com/nodelane/nodelane/internal/waitfor"
	"github.com/nodelane/nodelane/workerapi/client"
)

// newTLSCluster starts a server bound at addr serving TLS (its flags in
// serverArgs) that the operator reaches as https://host:port, trusting
// roots, with every connection dialled to addr.
func newTLSCluster(t *testing.T, addr, host string, roots *x509.CertPool, serverArgs ...string) *cluster {
	t.Helper()
	serverBin, workerBin := binaries(t)
	_, port, err := net.SplitHostPort(addr)
	if err != nil {
		t.Fatal(err)
	}
	tr := &http.Transport{
		TLSClientConfig: &tls.Config{RootCAs: roots},
		DialContext: func(ctx context.Context, network, _ string) (net.Conn, error) {
			return (&net.Dialer{}).DialContext(ctx, network, addr)
		},
	}
	t.Cleanup(tr.CloseIdleConnections)
	c := &cluster{t: t, serverBin: serverBin, workerBin: workerBin, dir: t.TempDir(), addr: addr,
		hc: &http.Client{Timeout: 30 * time.Second, Transport: tr}, serverArgs: serverArgs,
		baseURL: "https://" + net.JoinHostPort(host, port)}
	c.startServer()
	if c.tokens.OperatorToken == "" || c.tokens.ProvisioningToken == "" {
		t.Fatal("no tokens")
	}
	return c
}

// servedCert is the certificate a new TLS connection to addr is served,
// verified against roots for name.
func servedCert(t *testing.T, addr, name string, roots *x509.CertPool) (*x509.Certificate, error) {
	t.Helper()
	d := &net.Dialer{Timeout: 10 * time.Second}
	conn, err := tls.DialWithDialer(d, "tcp", addr, &tls.Config{RootCAs: roots, ServerName: name})
	if err != nil {
		return nil, err
	}
	defer conn.Close()
	return conn.ConnectionState().PeerCertificates[0], nil
}

// waitServed waits until new connections are served want.
func (c *cluster) waitServed(what string, name string, roots *x509.CertPool, want *x509.Certificate) {
	c.t.Helper()
	waitfor.Within(c.t, startTimeout, what, func() bool {
		got, err := servedCert(c.t, c.addr, name, roots)
		return err == nil && got.SerialNumber.Cmp(want.SerialNumber) == 0
	})
}

// TestTLSFilesE2E checks the server over TLS from certificate files: a
// worker trusting the test CA completes jobs; the files are reloaded on
// SIGHUP and when replaced, a bad pair is refused and the old certificate
// kept; -http-addr redirects; SIGTERM stops both listeners.
func TestTLSFilesE2E(t *testing.T) {
	t.Parallel()
	ca := testpki.NewCA(t, "nodelane e2e CA")
	certDir := t.TempDir()
	caFile, certFile, keyFile := filepath.Join(certDir, "ca.pem"), filepath.Join(certDir, "cert.pem"), filepath.Join(certDir, "key.pem")
	testpki.WriteAtomic(t, caFile, ca.PEM)
	l1 := ca.Leaf(t)
	// Padded (PEM decoding skips blank lines) so that the next pair can
	// be written over it in place.
	pad := []byte(strings.Repeat("\n", 64))
	testpki.WriteAtomic(t, certFile, append(l1.CertPEM, pad...))
	testpki.WriteAtomic(t, keyFile, append(l1.KeyPEM, pad...))
	addr, httpAddr := freeAddr(t), freeAddr(t)
	_, port, _ := net.SplitHostPort(addr)
	c := newTLSCluster(t, addr, "127.0.0.1", ca.Pool(), "-tls-cert", certFile, "-tls-key", keyFile, "-http-addr", httpAddr)

	// The log gives the pin for -pin-sha256 and the console's https URL.
	logs := c.server.stderr.String()
	if !strings.Contains(logs, `pin_sha256="`+client.PublicKeyPin(l1.Cert)+`"`) {
		t.Errorf("the server does not log the certificate's pin:\n%s", logs)
	}
	if !strings.Contains(logs, "console=https://"+addr+"/console/") {
		t.Errorf("the server does not log the console's https URL:\n%s", logs)
	}

	// A worker trusting the test CA completes a job over https.
	c.startWorkerVia("node-tls", c.base(), "-ca-file", caFile)
	c.workerID("node-tls")
	c.checkSucceeded(c.waitDone(c.dispatch("status_check", nil).Job.ID, "succeeded"))

	// SIGHUP: the files rewritten in place with the same size and time,
	// which the change check cannot see, so only the signal loads them.
	l2 := ca.Leaf(t)
	loads := func() int {
		s := c.server.stderr.String()
		return strings.Count(s, `msg="TLS certificate reloaded"`) + strings.Count(s, "files changed but do not load")
	}
	before := loads()
	rewriteSameStamp(t, certFile, l2.CertPEM)
	rewriteSameStamp(t, keyFile, l2.KeyPEM)
	// The behaviour under test is that nothing is noticed once a check is
	// due: the sleep lets tlsserve's check interval (1 s) pass, so that
	// the next handshake compares the stamps.
	time.Sleep(1100 * time.Millisecond)
	got, err := servedCert(t, addr, "127.0.0.1", ca.Pool())
	switch {
	case err != nil:
		t.Fatal(err)
	case loads() != before:
		// A handshake checked the files while they were being rewritten,
		// between a write and the time put back: the signal proves less.
		t.Logf("the files were read while being rewritten")
	case got.SerialNumber.Cmp(l1.Cert.SerialNumber) != 0:
		t.Fatalf("files rewritten with the same stamps were noticed without a SIGHUP: serves %v", got.SerialNumber)
	}
	if err := c.server.cmd.Process.Signal(syscall.SIGHUP); err != nil {
		t.Fatal(err)
	}
	c.waitServed("the certificate loaded on SIGHUP", "127.0.0.1", ca.Pool(), l2.Cert)
	// When a handshake read the files mid-rewrite, l2 was served before
	// the signal arrived: wait for the server to say it handled it.
	waitfor.Within(c.t, startTimeout, "the SIGHUP logged", func() bool {
		return strings.Contains(c.server.stderr.String(), "SIGHUP: reloading")
	})

	// The files replaced (renamed over), no signal: a handshake notices.
	l3 := ca.Leaf(t)
	testpki.WriteAtomic(t, keyFile, l3.KeyPEM)
	testpki.WriteAtomic(t, certFile, l3.CertPEM)
	c.waitServed("the replaced certificate files noticed", "127.0.0.1", ca.Pool(), l3.Cert)
	// The new certificate is served from the moment it is swapped in,
	// a moment before its log line is written.
	waitfor.Within(c.t, startTimeout, "the reload logging the new pin", func() bool {
		return strings.Contains(c.server.stderr.String(), `pin_sha256="`+client.PublicKeyPin(l3.Cert)+`"`)
	})

	// A pair that does not match, then SIGHUP: logged, the old certificate
	// stays, the server serves on.
	l4 := ca.Leaf(t)
	testpki.WriteAtomic(t, certFile, l4.CertPEM)
	if err := c.server.cmd.Process.Signal(syscall.SIGHUP); err != nil {
		t.Fatal(err)
	}
	waitfor.Within(c.t, startTimeout, "the failed reload logged", func() bool {
		return strings.Contains(c.server.stderr.String(), "private key does not match public key")
	})
	if got, err := servedCert(t, addr, "localhost", ca.Pool()); err != nil || got.SerialNumber.Cmp(l3.Cert.SerialNumber) != 0 {
		t.Fatalf("after a bad pair: %v, %v; want the previous certificate", got, err)
	}
	// The worker works on, over new connections too.
	c.checkSucceeded(c.waitDone(c.dispatch("status_check", nil).Job.ID, "succeeded"))

	// Plain HTTP: -http-addr only redirects, to the TLS port.
	noFollow := &http.Client{Timeout: 10 * time.Second, CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	for _, method := range []string{"GET", "POST"} {
		req, _ := http.NewRequest(method, "http://"+httpAddr+"/operator/envelope?x=1", strings.NewReader("{}"))
		req.Header.Set("Authorization", "Bearer "+c.tokens.OperatorToken)
		resp, err := noFollow.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		want := "https://127.0.0.1:" + port + "/operator/envelope?x=1"
		if resp.StatusCode != http.StatusPermanentRedirect || resp.Header.Get("Location") != want || strings.Contains(string(b), "policy") {
			t.Fatalf("%s on -http-addr: %d Location %q, want 308 %q\n%s", method, resp.StatusCode, resp.Header.Get("Location"), want, b)
		}
	}
	// Plain HTTP on the TLS port is refused.
	resp, err := noFollow.Get("http://" + addr + "/healthz")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusBadRequest {
		t.Fatalf("plain HTTP on the TLS port: %d, want 400", resp.StatusCode)
	}
	// TLS 1.1 is refused.
	if _, err := tls.Dial("tcp", addr, &tls.Config{RootCAs: ca.Pool(), MinVersion: tls.VersionTLS10, MaxVersion: tls.VersionTLS11}); err == nil {
		t.Fatal("a TLS 1.1 handshake succeeded")
	}

	// The key is never logged.
	for _, l := range []testpki.Leaf{l1, l2, l3, l4} {
		p, _ := pem.Decode(l.KeyPEM)
		if s := c.server.stderr.String(); strings.Contains(s, "PRIVATE KEY") || strings.Contains(s, string(pem.EncodeToMemory(p))[40:80]) {
			t.Fatal("the server logged a key")
		}
	}
	c.checkNoTokensLogged()

	// SIGTERM shuts both listeners down and exits 0.
	if err := c.server.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	select {
	case <-c.server.done:
	case <-time.After(startTimeout):
		t.Fatal("the server did not stop after SIGTERM")
	}
	if !c.server.cmd.ProcessState.Success() {
		t.Fatalf("the server exited %v", c.server.cmd.ProcessState)
	}
	if conn, err := net.DialTimeout("tcp", httpAddr, 5*time.Second); err == nil {
		conn.Close()
		t.Fatal("-http-addr still accepts after the server stopped")
	}
}

// rewriteSameStamp rewrites name in place (same inode) with b padded to
// the old size, and puts its modification time back.
func rewriteSameStamp(t *testing.T, name string, b []byte) {
	t.Helper()
	fi, err := os.Stat(name)
	if err != nil {
		t.Fatal(err)
	}
	if int64(len(b)) > fi.Size() {
		t.Fatalf("the new PEM (%d bytes) is longer than the old (%d)", len(b), fi.Size())
	}
	for int64(len(b)) < fi.Size() {
		b = append(b, '\n')
	}
	f, err := os.OpenFile(name, os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.WriteAt(b, 0); err != nil {
		t.Fatal(err)
	}
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
	if err := os.Chtimes(name, fi.ModTime(), fi.ModTime()); err != nil {
		t.Fatal(err)
	}
}
