package tlsserve

import (
	"crypto/tls"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"strings"
	"sync"
	"time"

	"github.com/nodelane/nodelane/workerapi/client"
)

// DefaultCheckInterval is how often, at most, a Reloader stats its files
// on a handshake.
const DefaultCheckInterval = time.Second

// ErrKeyReadable is wrapped by the error of a key file that group or
// others may read: it is refused, at start and on every reload.
var ErrKeyReadable = errors.New("is readable by group or others")

// ErrNoCertificate is wrapped by the error of a certificate file that
// holds no PEM CERTIFICATE block.
var ErrNoCertificate = errors.New("no PEM CERTIFICATE block")

// ReloaderConfig are a Reloader's optional settings.
type ReloaderConfig struct {
	// Now is the clock of the change checks. Defaults to time.Now.
	Now func() time.Time
	// CheckInterval is the least time between two checks of the files'
	// stamps on handshakes. Defaults to DefaultCheckInterval.
	CheckInterval time.Duration
	// Logger gets a line for each certificate loaded and each failed
	// reload. Defaults to discarding them.
	Logger *slog.Logger
}

// A Reloader serves a certificate and key pair read from files through
// tls.Config.GetCertificate. It reloads them when told to (Reload) and
// when they change: on a handshake, at most once per CheckInterval, it
// stats both files and reloads when a file's modification time, size or
// inode differ from the ones it last read (certbot and similar tools
// replace files or retarget symlinks). A reload that fails keeps the
// certificate served; the failure is logged once per change of the
// files. Neither logs nor errors ever hold the key.
type Reloader struct {
	certFile, keyFile string
	now               func() time.Time
	interval          time.Duration
	log               *slog.Logger

	mu      sync.Mutex
	cert    *tls.Certificate
	stamps  [2]stamp  // of the files last read, whether or not they loaded
	checked time.Time // when the stamps were last compared
}

// NewReloader loads the pair and returns a Reloader serving it. The error
// names the file at fault.
func NewReloader(certFile, keyFile string, cfg *ReloaderConfig) (*Reloader, error) {
	if cfg == nil {
		cfg = &ReloaderConfig{}
	}
	r := &Reloader{certFile: certFile, keyFile: keyFile, now: cfg.Now, interval: cfg.CheckInterval, log: cfg.Logger}
	if r.now == nil {
		r.now = time.Now
	}
	if r.interval <= 0 {
		r.interval = DefaultCheckInterval
	}
	if r.log == nil {
		r.log = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if err := r.loadLocked("loaded"); err != nil {
		return nil, err
	}
	return r, nil
}

// GetCertificate returns the certificate to serve, first reloading it if
// the files changed. It never fails: a failed reload keeps the previous
// certificate.
func (r *Reloader) GetCertificate(*tls.ClientHelloInfo) (*tls.Certificate, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	now := r.now()
	if d := now.Sub(r.checked); d < 0 || d >= r.interval {
		r.checked = now
		if r.stampsLocked() != r.stamps {
			if err := r.loadLocked("reloaded"); err != nil {
				r.log.Error("the TLS certificate files changed but do not load; serving the previous certificate until they change again",
					"cert_file", r.certFile, "key_file", r.keyFile, "err", err)
			}
		}
	}
	return r.cert, nil
}

// Reload reads the files now, whether or not they changed (the server
// calls it on SIGHUP). On error the previous certificate stays served.
func (r *Reloader) Reload() error {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.checked = r.now()
	if err := r.loadLocked("reloaded"); err != nil {
		r.log.Error("reloading the TLS certificate failed; serving the previous certificate",
			"cert_file", r.certFile, "key_file", r.keyFile, "err", err)
		return err
	}
	return nil
}

// Leaf is the certificate served.
func (r *Reloader) Leaf() *x509.Certificate {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.cert.Leaf
}

// loadLocked reads the pair, records the stamps it read and, if it loads,
// serves it and logs msg with the certificate's names and pin.
func (r *Reloader) loadLocked(msg string) error {
	// Stamped before reading: a change while reading shows at the next
	// check.
	r.stamps = r.stampsLocked()
	c, err := LoadKeyPair(r.certFile, r.keyFile)
	if err != nil {
		return err
	}
	r.cert = c
	l := c.Leaf
	attrs := []any{"cert_file", r.certFile, "names", certNames(l), "not_after", l.NotAfter.UTC(), "pin_sha256", client.PublicKeyPin(l)}
	r.log.Info("TLS certificate "+msg, attrs...)
	if now := r.now(); now.After(l.NotAfter) || now.Before(l.NotBefore) {
		r.log.Warn("the TLS certificate is not valid now", "cert_file", r.certFile, "not_before", l.NotBefore.UTC(), "not_after", l.NotAfter.UTC())
	}
	return nil
}

func (r *Reloader) stampsLocked() [2]stamp {
	return [2]stamp{statStamp(r.certFile), statStamp(r.keyFile)}
}

// LoadKeyPair reads a PEM certificate chain (leaf first) and its PEM
// private key, which group and others must not be able to read
// (ErrKeyReadable). Its error names the file at fault, never the key's
// bytes.
func LoadKeyPair(certFile, keyFile string) (*tls.Certificate, error) {
	certPEM, err := os.ReadFile(certFile)
	if err != nil {
		return nil, fmt.Errorf("TLS certificate: %w", err)
	}
	keyPEM, err := readPrivate(keyFile)
	if err != nil {
		return nil, err
	}
	if !hasCertificate(certPEM) {
		return nil, fmt.Errorf("TLS certificate %s: %w", certFile, ErrNoCertificate)
	}
	c, err := tls.X509KeyPair(certPEM, keyPEM)
	if err != nil {
		// X509KeyPair's errors say what is wrong ("private key does not
		// match public key", "failed to parse private key") without any
		// of the input.
		return nil, fmt.Errorf("TLS key pair %s (certificate) and %s (key): %w", certFile, keyFile, err)
	}
	if c.Leaf == nil {
		if c.Leaf, err = x509.ParseCertificate(c.Certificate[0]); err != nil {
			return nil, fmt.Errorf("TLS certificate %s: %w", certFile, err)
		}
	}
	return &c, nil
}

// readPrivate reads the key file, refusing one that group or others may
// read (ErrKeyReadable), as the server refuses such a secrets file.
func readPrivate(name string) ([]byte, error) {
	f, err := os.Open(name)
	if err != nil {
		return nil, fmt.Errorf("TLS key: %w", err)
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return nil, fmt.Errorf("TLS key: %w", err)
	}
	if perm := fi.Mode().Perm(); perm&0o077 != 0 {
		return nil, fmt.Errorf("TLS key %s: %w (mode %04o): chmod 600 it", name, ErrKeyReadable, perm)
	}
	b, err := io.ReadAll(f)
	if err != nil {
		return nil, fmt.Errorf("TLS key: %w", err)
	}
	return b, nil
}

func hasCertificate(b []byte) bool {
	for {
		var p *pem.Block
		p, b = pem.Decode(b)
		if p == nil {
			return false
		}
		if p.Type == "CERTIFICATE" {
			return true
		}
	}
}

// certNames lists a certificate's DNS names and IP addresses, else its
// common name.
func certNames(c *x509.Certificate) string {
	var names []string
	names = append(names, c.DNSNames...)
	for _, ip := range c.IPAddresses {
		names = append(names, ip.String())
	}
	if len(names) == 0 {
		names = append(names, c.Subject.CommonName)
	}
	return strings.Join(names, ",")
}

// stamp identifies a file's content cheaply: what os.Stat says of the
// file a name leads to (through symlinks). A file that cannot be stat'ed
// has the stamp of its error.
type stamp struct {
	modTime  int64 // UnixNano
	size     int64
	dev, ino uint64
	err      string
}

func statStamp(name string) stamp {
	fi, err := os.Stat(name)
	if err != nil {
		return stamp{err: err.Error()}
	}
	s := stamp{modTime: fi.ModTime().UnixNano(), size: fi.Size()}
	s.dev, s.ino = fileID(fi)
	return s
}
