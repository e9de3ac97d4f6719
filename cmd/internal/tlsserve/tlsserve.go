// Package tlsserve serves the example control plane over HTTPS: a
// certificate and key read from files and reloaded when they change or on
// demand (Reloader), or certificates obtained and renewed through ACME
// (golang.org/x/crypto/acme/autocert, TLS-ALPN-01 on the TLS listener and
// HTTP-01 on the plain HTTP one), the plain HTTP listener's handler,
// which answers ACME HTTP-01 challenges and otherwise only redirects to
// https at a configured name, and HSTS on the TLS listener's answers.
// TLS 1.2 is the least version; everything else is Go's default.
package tlsserve

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"slices"
	"strconv"
	"strings"
	"time"

	"golang.org/x/crypto/acme"
	"golang.org/x/crypto/acme/autocert"
)

// Config are a Server's optional settings.
type Config struct {
	// Logger gets the certificates loaded and obtained, and the failures.
	// Defaults to discarding them.
	Logger *slog.Logger
	// Now is the clock of the certificate files' change checks. Defaults
	// to time.Now.
	Now func() time.Time
	// Host is the name the plain HTTP listener redirects to when a
	// request names none of the server's (the host of the server's public
	// URL). Defaults to the first ACME domain, else the certificate's
	// first DNS name, else its first IP address.
	Host string
}

// A Server holds what the TLS listener and the plain HTTP listener serve.
type Server struct {
	flags   *Flags
	log     *slog.Logger
	host    string            // Config.Host
	files   *Reloader         // with -tls-cert
	manager *autocert.Manager // with -acme-domain
	config  *tls.Config
}

// New prepares serving TLS as f (checked) says: it loads the certificate
// files, or creates the ACME cache directory and reads -acme-ca-file. It
// fails, naming the file at fault, before anything is served.
func New(f *Flags, cfg *Config) (*Server, error) {
	if cfg == nil {
		cfg = &Config{}
	}
	s := &Server{flags: f, log: cfg.Logger, host: hostname(cfg.Host)}
	if s.log == nil {
		s.log = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	switch {
	case f.CertFile != "":
		r, err := NewReloader(f.CertFile, f.KeyFile, &ReloaderConfig{Now: cfg.Now, Logger: s.log})
		if err != nil {
			return nil, err
		}
		s.files = r
		s.config = &tls.Config{GetCertificate: r.GetCertificate, NextProtos: []string{"h2", "http/1.1"}}
	case f.ACME():
		m, err := newManager(f)
		if err != nil {
			return nil, err
		}
		s.manager = m
		s.config = m.TLSConfig() // with acme.ALPNProto, for TLS-ALPN-01
		challenges := "tls-alpn-01 (on the TLS listener)"
		if f.HTTPAddr != "" {
			challenges += ", http-01 (on -http-addr)"
		}
		s.log.Info("TLS certificates from ACME", "domains", strings.Join(f.ACMEDomains, ","),
			"directory", m.Client.DirectoryURL, "acme_dir", f.ACMEDir, "challenges", challenges)
	default:
		return nil, fmt.Errorf("%w: no TLS flag given", ErrFlags)
	}
	s.config.MinVersion = tls.VersionTLS12
	return s, nil
}

// newManager is the autocert Manager of the ACME flags.
func newManager(f *Flags) (*autocert.Manager, error) {
	// DirCache would create the directory 0700 on its first write; made
	// here, a directory that cannot be made stops the server at start.
	if err := os.MkdirAll(f.ACMEDir, 0o700); err != nil {
		return nil, fmt.Errorf("-acme-dir: %w", err)
	}
	fi, err := os.Stat(f.ACMEDir)
	if err != nil {
		return nil, fmt.Errorf("-acme-dir: %w", err)
	}
	if !fi.IsDir() {
		return nil, fmt.Errorf("-acme-dir %s is not a directory", f.ACMEDir)
	}
	if fi.Mode().Perm()&0o077 != 0 {
		return nil, fmt.Errorf("-acme-dir %s is open to others (mode %v) and holds private keys: chmod 700 it", f.ACMEDir, fi.Mode().Perm())
	}
	client := &acme.Client{DirectoryURL: f.ACMEDirectoryURL, UserAgent: "nodelane-server"}
	if client.DirectoryURL == "" {
		client.DirectoryURL = acme.LetsEncryptURL
	}
	if f.ACMECAFile != "" {
		b, err := os.ReadFile(f.ACMECAFile)
		if err != nil {
			return nil, fmt.Errorf("-acme-ca-file: %w", err)
		}
		roots := x509.NewCertPool()
		if !roots.AppendCertsFromPEM(b) {
			return nil, fmt.Errorf("-acme-ca-file %s: %w", f.ACMECAFile, ErrNoCertificate)
		}
		tr := http.DefaultTransport.(*http.Transport).Clone()
		tr.TLSClientConfig = &tls.Config{RootCAs: roots, MinVersion: tls.VersionTLS12}
		client.HTTPClient = &http.Client{Transport: tr}
	}
	return &autocert.Manager{
		// Asking for -acme-domain is accepting the CA's terms.
		Prompt:     autocert.AcceptTOS,
		Cache:      autocert.DirCache(f.ACMEDir),
		HostPolicy: autocert.HostWhitelist(f.ACMEDomains...),
		Client:     client,
		Email:      f.ACMEEmail,
	}, nil
}

// ACME reports whether the certificates come from ACME.
func (s *Server) ACME() bool { return s.manager != nil }

// TLSConfig is the configuration of the TLS listener (a copy).
func (s *Server) TLSConfig() *tls.Config { return s.config.Clone() }

// Reload reloads the certificate files now (SIGHUP). Under ACME there is
// nothing to reload: it logs so and returns nil.
func (s *Server) Reload() error {
	if s.files == nil {
		s.log.Info("nothing to reload: the certificates come from ACME, which renews them itself")
		return nil
	}
	return s.files.Reload()
}

// Start obtains, in the background, the certificate of each ACME domain
// that is not in the cache yet, so that the first worker does not wait
// for it and a failure shows in the log at start. The TLS listener (and
// the HTTP one, if any) must be serving: the ACME server validates
// through them. A no-op with certificate files.
func (s *Server) Start(ctx context.Context) {
	if s.manager == nil {
		return
	}
	for _, d := range s.flags.ACMEDomains {
		go func() {
			// A hello that offers ECDSA, as the workers' does, so that the
			// certificate obtained is the one they are served.
			c, err := s.manager.GetCertificate(&tls.ClientHelloInfo{
				ServerName:       d,
				CipherSuites:     []uint16{tls.TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256},
				SignatureSchemes: []tls.SignatureScheme{tls.ECDSAWithP256AndSHA256},
				SupportedCurves:  []tls.CurveID{tls.CurveP256},
			})
			if ctx.Err() != nil {
				return
			}
			if err != nil {
				s.log.Error("ACME: obtaining the certificate failed; retried on the next handshake for it", "domain", d, "err", err,
					"hint", "the ACME server must reach this name on port 443 (tls-alpn-01) or, with -http-addr, on port 80 (http-01); its own log says which validation failed")
				return
			}
			l := c.Leaf
			if l == nil {
				if l, err = x509.ParseCertificate(c.Certificate[0]); err != nil {
					s.log.Error("ACME: the certificate obtained does not parse", "domain", d, "err", err)
					return
				}
			}
			s.log.Info("ACME certificate ready", "domain", d, "issuer", l.Issuer.CommonName, "not_after", l.NotAfter.UTC())
		}()
	}
}

// URL is the https URL of path on the TLS listener at addr: the host is
// the first ACME domain, else addr's, or the certificate's first DNS name
// when addr listens on every address; the port is addr's unless 443.
func (s *Server) URL(addr net.Addr, path string) string {
	host, port, err := net.SplitHostPort(addr.String())
	if err != nil {
		return "https://" + addr.String() + path
	}
	switch ip := net.ParseIP(host); {
	case s.manager != nil:
		host = s.flags.ACMEDomains[0]
	case (host == "" || ip != nil && ip.IsUnspecified()) && len(s.files.Leaf().DNSNames) > 0:
		host = s.files.Leaf().DNSNames[0]
	}
	if port == "443" {
		if strings.Contains(host, ":") {
			host = "[" + host + "]"
		}
		return "https://" + host + path
	}
	return "https://" + net.JoinHostPort(host, port) + path
}

// HSTS wraps h, the TLS listener's handler, so that every answer tells
// browsers to reach this name over https only (Strict-Transport-Security,
// max-age -hsts-max-age; nothing with -hsts-max-age 0). Plain HTTP never
// sends it: browsers ignore it there.
func (s *Server) HSTS(h http.Handler) http.Handler {
	secs := int64(s.flags.HSTSMaxAge / time.Second)
	if secs <= 0 {
		return h
	}
	value := "max-age=" + strconv.FormatInt(secs, 10)
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Strict-Transport-Security", value)
		h.ServeHTTP(w, r)
	})
}

// HTTPHandler is the plain HTTP listener's handler: under ACME it answers
// HTTP-01 challenges (autocert's Manager.HTTPHandler) for the configured
// domains; every other request is redirected (308) over https, on
// tlsPort, to the same path at the name it asked for if that is one of
// the server's (Config.Host, the ACME domains, the certificate's names),
// else at Config.Host or its default: never at a name only the request
// gives. Nothing else is served over plain HTTP. Under ACME, HTTP-01 is
// tried only once HTTPHandler has been called: call it before Start.
func (s *Server) HTTPHandler(tlsPort string) http.Handler {
	redirect := RedirectHandler(tlsPort, s.redirectHost)
	if s.manager == nil {
		return redirect
	}
	acmeHandler := s.manager.HTTPHandler(redirect)
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		// autocert checks the Host against the domains as it is, port and
		// all; the port of the listener is no part of the name.
		r2 := *r
		r2.Host = hostname(r.Host)
		acmeHandler.ServeHTTP(w, &r2)
	})
}

// redirectHost is the name a request for host is redirected to: host
// itself if it is one of the server's names, else the first of them
// (Config.Host first), else "".
func (s *Server) redirectHost(host string) string {
	var names []string
	if s.host != "" {
		names = append(names, s.host)
	}
	names = append(names, s.flags.ACMEDomains...)
	if s.files != nil {
		l := s.files.Leaf()
		for _, n := range l.DNSNames {
			names = append(names, strings.ToLower(n))
		}
		for _, ip := range l.IPAddresses {
			names = append(names, ip.String())
		}
	}
	if ip := net.ParseIP(host); ip != nil {
		host = ip.String()
	}
	switch {
	case slices.Contains(names, host):
		return host
	case len(names) > 0:
		return names[0]
	}
	return ""
}

// RedirectHandler redirects every request (308, so that the method and
// body stay) to the same path and query over https on tlsPort (the port
// left out when it is 443), at the name that name gives for the
// request's host (lowercased, without port or final dot). The request's
// Host is never trusted as the target: name decides. When name gives ""
// the request is answered 400.
func RedirectHandler(tlsPort string, name func(host string) string) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		host := name(hostname(r.Host))
		if host == "" {
			http.Error(w, "no name to redirect to https at", http.StatusBadRequest)
			return
		}
		if tlsPort != "443" {
			host = net.JoinHostPort(host, tlsPort)
		} else if strings.Contains(host, ":") {
			host = "[" + host + "]"
		}
		uri := r.URL.RequestURI()
		if !strings.HasPrefix(uri, "/") { // OPTIONS *
			uri = "/"
		}
		w.Header().Set("Cache-Control", "no-store")
		http.Redirect(w, r, "https://"+host+uri, http.StatusPermanentRedirect)
	})
}

// hostname is a Host header's name without port, brackets or final dot,
// lowercased.
func hostname(hostport string) string {
	h := hostport
	if host, _, err := net.SplitHostPort(hostport); err == nil {
		h = host
	}
	h = strings.TrimSuffix(strings.TrimPrefix(h, "["), "]")
	return strings.ToLower(strings.TrimSuffix(h, "."))
}
