package examples

// The server over TLS with real processes: certificate files made here,
// reloaded on SIGHUP and on change, a worker trusting the test CA
// (-ca-file) completing jobs, and the -http-addr listener redirecting.

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"io"
	"math/big"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/nodelane/nodelane/workerapi/client"
)

// testCA is a certificate authority made by the test.
type testCA struct {
	cert *x509.Certificate
	key  *ecdsa.PrivateKey
	pem  []byte
	n    int64
}

func newTestCA(t *testing.T) *testCA {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "nodelane e2e CA"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(24 * time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		t.Fatal(err)
	}
	return &testCA{cert: cert, key: key, pem: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), n: 1}
}

func (ca *testCA) pool() *x509.CertPool {
	p := x509.NewCertPool()
	p.AddCert(ca.cert)
	return p
}

// testLeaf is a server certificate for 127.0.0.1 and localhost with its
// key, in PEM.
type testLeaf struct {
	cert            *x509.Certificate
	certPEM, keyPEM []byte
}

func (ca *testCA) leaf(t *testing.T) testLeaf {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	ca.n++
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(ca.n), Subject: pkix.Name{CommonName: "localhost"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(24 * time.Hour),
		DNSNames: []string{"localhost"}, IPAddresses: []net.IP{net.IPv4(127, 0, 0, 1)},
		KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.cert, &key.PublicKey, ca.key)
	if err != nil {
		t.Fatal(err)
	}
	kder, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		t.Fatal(err)
	}
	return testLeaf{cert: cert, certPEM: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}),
		keyPEM: pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: kder})}
}

// writeFile writes name through a new file renamed over it (what
// certbot and most tools do).
func writeFile(t *testing.T, name string, b []byte) {
	t.Helper()
	if err := os.WriteFile(name+".new", b, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(name+".new", name); err != nil {
		t.Fatal(err)
	}
}

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
	c.eventually(startTimeout, what, func() bool {
		got, err := servedCert(c.t, c.addr, name, roots)
		return err == nil && got.SerialNumber.Cmp(want.SerialNumber) == 0
	})
}

func TestTLSFilesE2E(t *testing.T) {
	ca := newTestCA(t)
	certDir := t.TempDir()
	caFile, certFile, keyFile := filepath.Join(certDir, "ca.pem"), filepath.Join(certDir, "cert.pem"), filepath.Join(certDir, "key.pem")
	writeFile(t, caFile, ca.pem)
	l1 := ca.leaf(t)
	// Padded (PEM decoding skips blank lines) so that the next pair can
	// be written over it in place.
	pad := []byte(strings.Repeat("\n", 64))
	writeFile(t, certFile, append(l1.certPEM, pad...))
	writeFile(t, keyFile, append(l1.keyPEM, pad...))
	addr, httpAddr := freeAddr(t), freeAddr(t)
	_, port, _ := net.SplitHostPort(addr)
	c := newTLSCluster(t, addr, "127.0.0.1", ca.pool(), "-tls-cert", certFile, "-tls-key", keyFile, "-http-addr", httpAddr)

	// The log gives the pin for -pin-sha256 and the console's https URL.
	logs := c.server.stderr.String()
	if !strings.Contains(logs, `pin_sha256="`+client.PublicKeyPin(l1.cert)+`"`) {
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
	l2 := ca.leaf(t)
	loads := func() int {
		s := c.server.stderr.String()
		return strings.Count(s, `msg="TLS certificate reloaded"`) + strings.Count(s, "files changed but do not load")
	}
	before := loads()
	rewriteSameStamp(t, certFile, l2.certPEM)
	rewriteSameStamp(t, keyFile, l2.keyPEM)
	time.Sleep(1100 * time.Millisecond) // past the interval: the next handshake compares the stamps
	got, err := servedCert(t, addr, "127.0.0.1", ca.pool())
	switch {
	case err != nil:
		t.Fatal(err)
	case loads() != before:
		// A handshake checked the files while they were being rewritten,
		// between a write and the time put back: the signal proves less.
		t.Logf("the files were read while being rewritten")
	case got.SerialNumber.Cmp(l1.cert.SerialNumber) != 0:
		t.Fatalf("files rewritten with the same stamps were noticed without a SIGHUP: serves %v", got.SerialNumber)
	}
	if err := c.server.cmd.Process.Signal(syscall.SIGHUP); err != nil {
		t.Fatal(err)
	}
	c.waitServed("the certificate loaded on SIGHUP", "127.0.0.1", ca.pool(), l2.cert)
	if !strings.Contains(c.server.stderr.String(), "SIGHUP") {
		t.Errorf("the SIGHUP is not logged:\n%s", c.server.stderr)
	}

	// The files replaced (renamed over), no signal: a handshake notices.
	l3 := ca.leaf(t)
	writeFile(t, keyFile, l3.keyPEM)
	writeFile(t, certFile, l3.certPEM)
	c.waitServed("the replaced certificate files noticed", "127.0.0.1", ca.pool(), l3.cert)
	if !strings.Contains(c.server.stderr.String(), `pin_sha256="`+client.PublicKeyPin(l3.cert)+`"`) {
		t.Errorf("the reload does not log the new pin:\n%s", c.server.stderr)
	}

	// A pair that does not match, then SIGHUP: logged, the old certificate
	// stays, the server serves on.
	l4 := ca.leaf(t)
	writeFile(t, certFile, l4.certPEM)
	if err := c.server.cmd.Process.Signal(syscall.SIGHUP); err != nil {
		t.Fatal(err)
	}
	c.eventually(startTimeout, "the failed reload logged", func() bool {
		return strings.Contains(c.server.stderr.String(), "private key does not match public key")
	})
	if got, err := servedCert(t, addr, "localhost", ca.pool()); err != nil || got.SerialNumber.Cmp(l3.cert.SerialNumber) != 0 {
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
	if _, err := tls.Dial("tcp", addr, &tls.Config{RootCAs: ca.pool(), MinVersion: tls.VersionTLS10, MaxVersion: tls.VersionTLS11}); err == nil {
		t.Fatal("a TLS 1.1 handshake succeeded")
	}

	// The key is never logged.
	for _, l := range []testLeaf{l1, l2, l3, l4} {
		p, _ := pem.Decode(l.keyPEM)
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
