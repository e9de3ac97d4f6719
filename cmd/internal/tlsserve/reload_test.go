package tlsserve

import (
	"crypto/tls"
	"crypto/x509"
	"encoding/base64"
	"encoding/pem"
	"errors"
	"io/fs"
	"log/slog"
	"math/big"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nodelane/nodelane/internal/syncbuf"

	"github.com/nodelane/nodelane/internal/testclock"
	"github.com/nodelane/nodelane/internal/testpki"
	"github.com/nodelane/nodelane/workerapi/client"
)

// fixture is a Reloader over two files in a temporary directory, with a
// test clock and a captured log.
type fixture struct {
	dir, certFile, keyFile string
	clock                  *testclock.Clock
	log                    *syncbuf.Buffer
	r                      *Reloader
	keys                   [][]byte // every key written, which the log must never show
}

func newFixture(t *testing.T, first testpki.Leaf) *fixture {
	t.Helper()
	dir := t.TempDir()
	f := &fixture{dir: dir, certFile: filepath.Join(dir, "cert.pem"), keyFile: filepath.Join(dir, "key.pem"),
		clock: testclock.New(time.Now()), log: &syncbuf.Buffer{}}
	f.write(t, first)
	r, err := NewReloader(f.certFile, f.keyFile, &ReloaderConfig{Now: f.clock.Now,
		Logger: slog.New(slog.NewTextHandler(f.log, &slog.HandlerOptions{Level: slog.LevelDebug}))})
	if err != nil {
		t.Fatal(err)
	}
	f.r = r
	t.Cleanup(func() { f.checkNoKeyLogged(t) })
	return f
}

func (f *fixture) write(t *testing.T, l testpki.Leaf) {
	t.Helper()
	testpki.WriteAtomic(t, f.certFile, l.CertPEM)
	testpki.WriteAtomic(t, f.keyFile, l.KeyPEM)
	f.keys = append(f.keys, l.KeyPEM)
}

// served is the serial of the certificate a handshake gets.
func (f *fixture) served(t *testing.T) *big.Int {
	t.Helper()
	c, err := f.r.GetCertificate(&tls.ClientHelloInfo{ServerName: "localhost"})
	if err != nil || c == nil {
		t.Fatalf("GetCertificate: %v, %v", c, err)
	}
	leaf, err := x509.ParseCertificate(c.Certificate[0])
	if err != nil {
		t.Fatal(err)
	}
	return leaf.SerialNumber
}

func (f *fixture) checkNoKeyLogged(t *testing.T) {
	t.Helper()
	out := f.log.String()
	if strings.Contains(out, "PRIVATE KEY") {
		t.Errorf("the log shows a PEM key:\n%s", out)
	}
	for _, k := range f.keys {
		p, _ := pem.Decode(k)
		if p == nil {
			continue
		}
		b64 := base64.StdEncoding.EncodeToString(p.Bytes)
		if strings.Contains(out, b64[len(b64)/2:len(b64)/2+16]) {
			t.Errorf("the log shows a key's bytes:\n%s", out)
		}
	}
}

func TestReloaderChangeDetection(t *testing.T) {
	t.Parallel()
	ca := testpki.NewCA(t, "tlsserve test CA")
	a, b := ca.Leaf(t), ca.Leaf(t)
	f := newFixture(t, a)
	if got := f.served(t); got.Cmp(a.Cert.SerialNumber) != 0 {
		t.Fatalf("serves %v, want %v", got, a.Cert.SerialNumber)
	}
	if !strings.Contains(f.log.String(), `pin_sha256="`+client.PublicKeyPin(a.Cert)+`"`) {
		t.Errorf("the load is not logged with the pin:\n%s", f.log)
	}

	f.write(t, b)
	// The first check after the load is due a second after it.
	f.clock.Advance(999 * time.Millisecond)
	if got := f.served(t); got.Cmp(a.Cert.SerialNumber) != 0 {
		t.Fatalf("within the check interval the new files are already served (%v)", got)
	}
	f.clock.Advance(time.Millisecond)
	if got := f.served(t); got.Cmp(b.Cert.SerialNumber) != 0 {
		t.Fatalf("after the check interval serves %v, want the new %v", got, b.Cert.SerialNumber)
	}
	if !strings.Contains(f.log.String(), "TLS certificate reloaded") || !strings.Contains(f.log.String(), `pin_sha256="`+client.PublicKeyPin(b.Cert)+`"`) {
		t.Errorf("the reload is not logged with the new pin:\n%s", f.log)
	}
	if f.r.Leaf().SerialNumber.Cmp(b.Cert.SerialNumber) != 0 {
		t.Errorf("Leaf is %v", f.r.Leaf().SerialNumber)
	}

	// Unchanged files are not read again: a file made unreadable in place
	// (same stamp) goes unnoticed.
	before := strings.Count(f.log.String(), "TLS certificate")
	f.clock.Advance(time.Hour)
	f.served(t)
	if after := strings.Count(f.log.String(), "TLS certificate"); after != before {
		t.Errorf("unchanged files were reloaded:\n%s", f.log)
	}

	// A clock that went back still checks.
	c := ca.Leaf(t)
	f.write(t, c)
	f.clock.Advance(-time.Minute)
	if got := f.served(t); got.Cmp(c.Cert.SerialNumber) != 0 {
		t.Fatalf("after the clock went back serves %v, want %v", got, c.Cert.SerialNumber)
	}
}

// A file replaced by one of the same size and modification time is told
// apart by its inode; a symlink retargeted (certbot's live/ directory) is
// followed.
func TestReloaderSameSizeAndTimeAndSymlinks(t *testing.T) {
	t.Parallel()
	ca := testpki.NewCA(t, "tlsserve test CA")
	a, b := ca.Leaf(t), ca.Leaf(t)
	// Same sizes: pad the shorter PEM with trailing newlines, which PEM
	// decoding skips.
	pad := func(x, y []byte) ([]byte, []byte) {
		for len(x) < len(y) {
			x = append(x, '\n')
		}
		for len(y) < len(x) {
			y = append(y, '\n')
		}
		return x, y
	}
	a.CertPEM, b.CertPEM = pad(a.CertPEM, b.CertPEM)
	a.KeyPEM, b.KeyPEM = pad(a.KeyPEM, b.KeyPEM)
	f := newFixture(t, a)
	mtime := time.Now().Add(-time.Hour).Truncate(time.Second)
	for _, n := range []string{f.certFile, f.keyFile} {
		if err := os.Chtimes(n, mtime, mtime); err != nil {
			t.Fatal(err)
		}
	}
	if err := f.r.Reload(); err != nil { // stamps with the times set
		t.Fatal(err)
	}
	f.write(t, b)
	for _, n := range []string{f.certFile, f.keyFile} {
		if err := os.Chtimes(n, mtime, mtime); err != nil {
			t.Fatal(err)
		}
	}
	f.clock.Advance(time.Second)
	if got := f.served(t); got.Cmp(b.Cert.SerialNumber) != 0 {
		t.Fatalf("a file replaced with the same size and time: serves %v, want %v", got, b.Cert.SerialNumber)
	}

	// certbot: live/cert.pem -> ../archive/certN.pem, retargeted on renewal.
	live, archive := filepath.Join(f.dir, "live"), filepath.Join(f.dir, "archive")
	for _, d := range []string{live, archive} {
		if err := os.Mkdir(d, 0o700); err != nil {
			t.Fatal(err)
		}
	}
	link := func(n int, l testpki.Leaf) {
		t.Helper()
		for _, x := range []struct {
			name string
			b    []byte
		}{{"cert", l.CertPEM}, {"key", l.KeyPEM}} {
			target := filepath.Join(archive, x.name+string(rune('0'+n))+".pem")
			if err := os.WriteFile(target, x.b, 0o600); err != nil {
				t.Fatal(err)
			}
			tmp := filepath.Join(live, x.name+".tmp")
			if err := os.Symlink(target, tmp); err != nil {
				t.Fatal(err)
			}
			if err := os.Rename(tmp, filepath.Join(live, x.name+".pem")); err != nil {
				t.Fatal(err)
			}
		}
	}
	c, d := ca.Leaf(t), ca.Leaf(t)
	link(1, c)
	r, err := NewReloader(filepath.Join(live, "cert.pem"), filepath.Join(live, "key.pem"), &ReloaderConfig{Now: f.clock.Now})
	if err != nil {
		t.Fatal(err)
	}
	link(2, d)
	f.clock.Advance(time.Second)
	got, _ := r.GetCertificate(nil)
	if got.Leaf.SerialNumber.Cmp(d.Cert.SerialNumber) != 0 {
		t.Fatalf("after the symlinks were retargeted serves %v, want %v", got.Leaf.SerialNumber, d.Cert.SerialNumber)
	}
}

// A pair that does not load keeps the certificate served; the failure is
// logged once per change of the files, and the next good change is served.
func TestReloaderBadPairKeepsOld(t *testing.T) {
	t.Parallel()
	ca := testpki.NewCA(t, "tlsserve test CA")
	a, b, c := ca.Leaf(t), ca.Leaf(t), ca.Leaf(t)
	f := newFixture(t, a)

	// b's certificate with c's key: a mismatch, as when a tool has
	// written one file and not yet the other.
	testpki.WriteAtomic(t, f.certFile, b.CertPEM)
	testpki.WriteAtomic(t, f.keyFile, c.KeyPEM)
	f.keys = append(f.keys, c.KeyPEM)
	for range 3 {
		f.clock.Advance(time.Second)
		if got := f.served(t); got.Cmp(a.Cert.SerialNumber) != 0 {
			t.Fatalf("a mismatched pair: serves %v, want the old %v", got, a.Cert.SerialNumber)
		}
	}
	if n := strings.Count(f.log.String(), "level=ERROR"); n != 1 {
		t.Fatalf("a mismatched pair logged %d errors, want 1:\n%s", n, f.log)
	}
	if !strings.Contains(f.log.String(), "private key does not match public key") || !strings.Contains(f.log.String(), f.certFile) {
		t.Errorf("the error does not say what and where:\n%s", f.log)
	}
	// The key written next completes the pair.
	testpki.WriteAtomic(t, f.keyFile, b.KeyPEM)
	f.keys = append(f.keys, b.KeyPEM)
	f.clock.Advance(time.Second)
	if got := f.served(t); got.Cmp(b.Cert.SerialNumber) != 0 {
		t.Fatalf("the completed pair: serves %v, want %v", got, b.Cert.SerialNumber)
	}

	// Garbage in the certificate file, then a file removed: each is one
	// error, the old certificate stays.
	testpki.WriteAtomic(t, f.certFile, []byte("not a certificate\n"))
	f.clock.Advance(time.Second)
	f.served(t)
	if err := os.Remove(f.keyFile); err != nil {
		t.Fatal(err)
	}
	f.clock.Advance(time.Second)
	if got := f.served(t); got.Cmp(b.Cert.SerialNumber) != 0 {
		t.Fatalf("serves %v, want %v", got, b.Cert.SerialNumber)
	}
	if n := strings.Count(f.log.String(), "level=ERROR"); n != 3 {
		t.Fatalf("%d errors logged, want 3:\n%s", n, f.log)
	}
}

// Reload (SIGHUP) reads the files now, whatever the clock; a failed
// Reload returns the error and keeps the certificate.
func TestReloaderReload(t *testing.T) {
	t.Parallel()
	ca := testpki.NewCA(t, "tlsserve test CA")
	a, b, c := ca.Leaf(t), ca.Leaf(t), ca.Leaf(t)
	f := newFixture(t, a)
	f.write(t, b)
	if err := f.r.Reload(); err != nil {
		t.Fatal(err)
	}
	if got := f.served(t); got.Cmp(b.Cert.SerialNumber) != 0 {
		t.Fatalf("after Reload serves %v, want %v", got, b.Cert.SerialNumber)
	}
	testpki.WriteAtomic(t, f.keyFile, c.KeyPEM)
	f.keys = append(f.keys, c.KeyPEM)
	err := f.r.Reload()
	if err == nil || !strings.Contains(err.Error(), f.keyFile) {
		t.Fatalf("Reload of a mismatched pair: %v", err)
	}
	f.clock.Advance(time.Hour)
	if got := f.served(t); got.Cmp(b.Cert.SerialNumber) != 0 {
		t.Fatalf("after a failed Reload serves %v, want %v", got, b.Cert.SerialNumber)
	}
}

func TestNewReloaderErrors(t *testing.T) {
	t.Parallel()
	ca := testpki.NewCA(t, "tlsserve test CA")
	a, b := ca.Leaf(t), ca.Leaf(t)
	dir := t.TempDir()
	put := func(name string, body []byte) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, body, 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	cert, key := put("cert.pem", a.CertPEM), put("key.pem", a.KeyPEM)
	otherKey := put("other-key.pem", b.KeyPEM)
	groupKey, worldKey := put("group-key.pem", a.KeyPEM), put("world-key.pem", a.KeyPEM)
	for p, mode := range map[string]os.FileMode{groupKey: 0o640, worldKey: 0o644} {
		if err := os.Chmod(p, mode); err != nil {
			t.Fatal(err)
		}
	}
	garbage := put("garbage.pem", []byte("hello\n"))
	missing := filepath.Join(dir, "missing.pem")
	for _, tc := range []struct {
		name, cert, key string
		want            []string
		is              error
	}{
		{"missing cert", missing, key, []string{"TLS certificate", missing}, fs.ErrNotExist},
		{"missing key", cert, missing, []string{"TLS key", missing}, fs.ErrNotExist},
		{"no PEM certificate", garbage, key, []string{garbage}, ErrNoCertificate},
		{"key for a certificate", cert, cert, []string{cert, "key"}, nil},
		{"garbage key", cert, garbage, []string{garbage}, nil},
		{"mismatched key", cert, otherKey, []string{otherKey, "does not match"}, nil},
		{"group-readable key", cert, groupKey, []string{groupKey, "mode 0640", "chmod 600"}, ErrKeyReadable},
		{"world-readable key", cert, worldKey, []string{worldKey, "mode 0644", "chmod 600"}, ErrKeyReadable},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			_, err := NewReloader(tc.cert, tc.key, nil)
			if err == nil {
				t.Fatal("loaded")
			}
			for _, w := range tc.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q does not say %q", err, w)
				}
			}
			if tc.is != nil && !errors.Is(err, tc.is) {
				t.Errorf("error %v is not %v", err, tc.is)
			}
			if strings.Contains(err.Error(), "PRIVATE KEY") || strings.Contains(err.Error(), "BEGIN") {
				t.Errorf("error shows PEM: %v", err)
			}
		})
	}
}

// A key file that group or others may read is refused on a reload too,
// whether on SIGHUP (Reload) or noticed by a handshake: the certificate
// served stays, and the log names the file and its mode.
func TestReloaderRefusesReadableKey(t *testing.T) {
	t.Parallel()
	ca := testpki.NewCA(t, "tlsserve test CA")
	a, b := ca.Leaf(t), ca.Leaf(t)
	f := newFixture(t, a)
	f.write(t, b)
	if err := os.Chmod(f.keyFile, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := f.r.Reload(); !errors.Is(err, ErrKeyReadable) || !strings.Contains(err.Error(), f.keyFile) {
		t.Fatalf("Reload of a 0644 key: %v, want ErrKeyReadable naming %s", err, f.keyFile)
	}
	f.clock.Advance(time.Hour)
	if got := f.served(t); got.Cmp(a.Cert.SerialNumber) != 0 {
		t.Fatalf("after a 0644 key serves %v, want the previous %v", got, a.Cert.SerialNumber)
	}
	if !strings.Contains(f.log.String(), "mode 0644") {
		t.Errorf("the log does not give the key's mode:\n%s", f.log.String())
	}
	// Made private, it loads at the next check.
	if err := os.Chmod(f.keyFile, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := f.r.Reload(); err != nil {
		t.Fatal(err)
	}
	if got := f.served(t); got.Cmp(b.Cert.SerialNumber) != 0 {
		t.Fatalf("after chmod 600 serves %v, want %v", got, b.Cert.SerialNumber)
	}
}
