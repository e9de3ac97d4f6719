package cmd

// ACME end to end: pebble (Let's Encrypt's test ACME server) runs in this
// process with a DNS server that sends cp.nodelane.test to 127.0.0.1;
// the server binary obtains its certificate from it through one
// challenge type at a time (the other's port is closed), and a worker
// binary that trusts only pebble's root completes a job over it.

import (
	"bytes"
	"crypto/x509"
	"encoding/pem"
	"fmt"
	"log"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/nodelane/nodelane/internal/syncbuf"
	"github.com/nodelane/nodelane/internal/waitfor"

	"github.com/letsencrypt/pebble/v2/ca"
	"github.com/letsencrypt/pebble/v2/db"
	"github.com/letsencrypt/pebble/v2/va"
	"github.com/letsencrypt/pebble/v2/wfe"
	"github.com/miekg/dns"
	"github.com/nodelane/nodelane/internal/testpki"
)

// acmeDomain is the name the certificates are for: autocert refuses
// names without a dot, and only the test's DNS server knows this one.
const acmeDomain = "cp.nodelane.test"

// TestACMEE2E checks that the server obtains its certificate from an ACME
// server through each challenge type, serves it, caches it across a
// restart, and that a worker trusting only the ACME server's root
// completes a job over it. pebble reads PEBBLE_VA_NOSLEEP and
// PEBBLE_WFE_NONCEREJECT, which TestMain sets.
func TestACMEE2E(t *testing.T) {
	t.Parallel()
	for _, challenge := range []string{"tls-alpn-01", "http-01"} {
		t.Run(challenge, func(t *testing.T) {
			t.Parallel()
			start := time.Now()
			testACME(t, challenge)
			t.Logf("%s: %v", challenge, time.Since(start).Round(100*time.Millisecond))
		})
	}
}

func testACME(t *testing.T, challenge string) {
	addr := freeAddr(t)   // the server's TLS listener
	closed := freeAddr(t) // nothing listens here
	var httpAddr string
	// Where pebble validates: the challenge under test's port is the
	// server's, the other one is closed, so only that challenge can pass.
	tlsPort, httpPort := port(t, addr), port(t, closed)
	if challenge == "http-01" {
		httpAddr = freeAddr(t)
		tlsPort, httpPort = port(t, closed), port(t, httpAddr)
	}
	p := startPebble(t, httpPort, tlsPort, startDNS(t, acmeDomain, net.IPv4(127, 0, 0, 1)))

	dir := t.TempDir()
	acmeCAFile, rootFile := filepath.Join(dir, "acme-ca.pem"), filepath.Join(dir, "pebble-root.pem")
	testpki.WriteAtomic(t, acmeCAFile, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: p.srv.Certificate().Raw}))
	testpki.WriteAtomic(t, rootFile, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: p.root.Raw}))
	roots := x509.NewCertPool()
	roots.AddCert(p.root)
	acmeDir := filepath.Join(dir, "acme")
	args := []string{"-acme-domain", acmeDomain, "-acme-dir", acmeDir, "-acme-directory-url", p.srv.URL + wfe.DirectoryPath,
		"-acme-ca-file", acmeCAFile, "-acme-email", "ops@nodelane.test"}
	if httpAddr != "" {
		args = append(args, "-http-addr", httpAddr)
	}

	// The operator's first call waits for the certificate: its
	// connection verifies against pebble's root only.
	c := newTLSCluster(t, addr, acmeDomain, roots, args...)
	cert, err := servedCert(t, addr, acmeDomain, roots)
	if err != nil {
		t.Fatalf("the served certificate does not verify against pebble's root: %v", err)
	}
	if cert.Issuer.CommonName != p.intermediate.Subject.CommonName || len(cert.DNSNames) != 1 || cert.DNSNames[0] != acmeDomain {
		t.Fatalf("served a certificate for %q issued by %q, want %s by %q", cert.DNSNames, cert.Issuer.CommonName, acmeDomain, p.intermediate.Subject.CommonName)
	}
	// Obtained at start, in the background, and logged.
	waitfor.Within(c.t, startTimeout, "the certificate obtained at start logged", func() bool {
		return strings.Contains(c.server.stderr.String(), `msg="ACME certificate ready" domain=`+acmeDomain)
	})
	if !strings.Contains(c.server.stderr.String(), "console=https://"+acmeDomain+":"+port(t, addr)+"/console/") {
		t.Errorf("the server does not log the console's https URL:\n%s", c.server.stderr)
	}
	// The challenge pebble validated.
	pl := p.log.String()
	if tried := strings.Contains(pl, "Attempting to validate w/ HTTP"); tried != (challenge == "http-01") {
		t.Errorf("pebble validated over HTTP: %t, want %t", tried, challenge == "http-01")
	}
	if !strings.Contains(pl, "set VALID by completed challenge") {
		t.Errorf("pebble validated no challenge:\n%s", pl)
	}
	// The cache: the account key and the certificate, private to the server.
	for _, name := range []string{"", "acme_account+key", acmeDomain} {
		fi, err := os.Stat(filepath.Join(acmeDir, name))
		if err != nil || fi.Mode().Perm()&0o077 != 0 {
			t.Errorf("-acme-dir/%s: %v %v", name, fi, err)
		}
	}

	// A worker trusting only pebble's root, dialling the name's address
	// with -connect, completes a job.
	c.startWorkerVia("node-acme", c.base(), "-ca-file", rootFile, "-connect", addr)
	c.workerID("node-acme")
	c.checkSucceeded(c.waitDone(c.dispatch("status_check", nil).Job.ID, "succeeded"))

	if httpAddr != "" {
		// Anything but a challenge is redirected to https.
		noFollow := &http.Client{Timeout: 10 * time.Second, CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
		req, _ := http.NewRequest("GET", "http://"+httpAddr+"/console/", nil)
		req.Host = acmeDomain
		resp, err := noFollow.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if want := "https://" + acmeDomain + ":" + port(t, addr) + "/console/"; resp.StatusCode != http.StatusPermanentRedirect || resp.Header.Get("Location") != want {
			t.Fatalf("GET /console/ on -http-addr: %d %q, want 308 %q", resp.StatusCode, resp.Header.Get("Location"), want)
		}
	}
	c.checkNoTokensLogged()

	// SIGTERM stops the server (both listeners); started again on the
	// same -acme-dir, it serves the cached certificate without a new order.
	orders := strings.Count(p.log.String(), "Added order")
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
	c.startServer()
	again, err := servedCert(t, addr, acmeDomain, roots)
	if err != nil || again.SerialNumber.Cmp(cert.SerialNumber) != 0 {
		t.Fatalf("after a restart: %v, %v; want the cached certificate %v", again, err, cert.SerialNumber)
	}
	if n := strings.Count(p.log.String(), "Added order"); n != orders {
		t.Fatalf("the restarted server placed %d new orders, want none", n-orders)
	}
}

func port(t *testing.T, addr string) string {
	t.Helper()
	_, p, err := net.SplitHostPort(addr)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// pebble is an ACME server run in this process.
type pebble struct {
	srv                *httptest.Server // the ACME API over TLS
	root, intermediate *x509.Certificate
	log                *syncbuf.Buffer
}

// startPebble runs pebble's CA, validation authority and API, validating
// HTTP-01 on httpPort and TLS-ALPN-01 on tlsPort of the addresses the DNS
// server at dnsAddr gives.
func startPebble(t *testing.T, httpPort, tlsPort, dnsAddr string) *pebble {
	t.Helper()
	p := &pebble{log: &syncbuf.Buffer{}}
	logger := log.New(p.log, "pebble ", log.Lmicroseconds)
	hp, tp := atoi(t, httpPort), atoi(t, tlsPort)
	store := db.NewMemoryStore()
	authority := ca.New(logger, store, "", "ecdsa", 0, 1, map[string]ca.Profile{"default": {Description: "default"}})
	validator := va.New(logger, hp, tp, false, dnsAddr, store)
	front := wfe.New(logger, store, validator, authority, []string{"pebble.letsencrypt.org"}, false, false, 0, 0)
	p.srv = httptest.NewUnstartedServer(front.Handler())
	p.srv.Config.ErrorLog = logger
	p.srv.StartTLS()
	t.Cleanup(p.srv.Close)
	p.root, p.intermediate = authority.GetRootCert(0).Cert, authority.GetIntermediateCert(0).Cert
	t.Cleanup(func() {
		if t.Failed() || os.Getenv("NODELANE_E2E_LOGS") != "" {
			t.Logf("--- pebble log:\n%s", p.log)
		}
	})
	return p
}

func atoi(t *testing.T, s string) int {
	t.Helper()
	var n int
	if _, err := fmt.Sscan(s, &n); err != nil {
		t.Fatal(err)
	}
	return n
}

// startDNS runs a DNS server over TCP (what pebble's validation authority
// asks) that answers name's A query with ip, its AAAA query with nothing,
// and any other name NXDOMAIN.
func startDNS(t *testing.T, name string, ip net.IP) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	fqdn := dns.Fqdn(name)
	var mu sync.Mutex
	var queries bytes.Buffer
	srv := &dns.Server{Listener: ln, Handler: dns.HandlerFunc(func(w dns.ResponseWriter, q *dns.Msg) {
		m := new(dns.Msg)
		m.SetReply(q)
		for _, qq := range q.Question {
			mu.Lock()
			fmt.Fprintf(&queries, "%s %s\n", qq.Name, dns.TypeToString[qq.Qtype])
			mu.Unlock()
			switch {
			case !strings.EqualFold(qq.Name, fqdn):
				m.Rcode = dns.RcodeNameError
			case qq.Qtype == dns.TypeA:
				m.Answer = append(m.Answer, &dns.A{Hdr: dns.RR_Header{Name: qq.Name, Rrtype: dns.TypeA, Class: dns.ClassINET, Ttl: 60}, A: ip})
			}
		}
		_ = w.WriteMsg(m)
	})}
	started := make(chan struct{})
	srv.NotifyStartedFunc = func() { close(started) }
	go func() { _ = srv.ActivateAndServe() }()
	select {
	case <-started:
	case <-time.After(startTimeout):
		t.Fatal("the DNS server did not start")
	}
	t.Cleanup(func() {
		_ = srv.Shutdown()
		if t.Failed() {
			mu.Lock()
			t.Logf("--- DNS queries:\n%s", queries.String())
			mu.Unlock()
		}
	})
	return ln.Addr().String()
}
