package tlsserve

import (
	"errors"
	"flag"
	"fmt"
	"net/mail"
	"net/url"
	"slices"
	"strings"
	"time"

	"golang.org/x/crypto/acme"
)

// DefaultACMEDir is the ACME cache directory when -acme-dir is not given.
const DefaultACMEDir = "nodelane-acme"

// DefaultHSTSMaxAge is the Strict-Transport-Security max-age when
// -hsts-max-age is not given: a year.
const DefaultHSTSMaxAge = 365 * 24 * time.Hour

// ErrFlags is wrapped by every error Flags.Check returns.
var ErrFlags = errors.New("bad TLS flags")

// Flags are the server's TLS flags, filled by the FlagSet they were
// registered on.
type Flags struct {
	// CertFile and KeyFile are a PEM certificate chain (leaf first) and
	// its private key: -tls-cert and -tls-key.
	CertFile, KeyFile string
	// ACMEDomains are the names certificates are obtained for through
	// ACME: -acme-domain, repeatable. Lowercase after Check.
	ACMEDomains []string
	// ACMEDir caches the ACME account key and the certificates:
	// -acme-dir. Defaults to DefaultACMEDir.
	ACMEDir string
	// ACMEDirectoryURL is the ACME server's directory:
	// -acme-directory-url. Defaults to Let's Encrypt's
	// (acme.LetsEncryptURL).
	ACMEDirectoryURL string
	// ACMEEmail is the ACME account's contact: -acme-email. Optional.
	ACMEEmail string
	// ACMECAFile holds the roots trusted for the ACME server itself (a
	// private ACME server's): -acme-ca-file. Defaults to the system
	// roots.
	ACMECAFile string
	// HTTPAddr is the plain HTTP listener's address: -http-addr. It
	// answers ACME HTTP-01 challenges and redirects everything else to
	// https. Optional; only with TLS.
	HTTPAddr string
	// HSTSMaxAge is the max-age of the Strict-Transport-Security header
	// of every answer over TLS: -hsts-max-age, whole seconds. 0 sends
	// none. Defaults to DefaultHSTSMaxAge.
	HSTSMaxAge time.Duration

	fs *flag.FlagSet
}

// RegisterFlags defines the TLS flags on fs; call the returned Flags'
// Check once fs is parsed.
func RegisterFlags(fs *flag.FlagSet) *Flags {
	f := &Flags{fs: fs}
	fs.StringVar(&f.CertFile, "tls-cert", "", "serve TLS with this PEM certificate chain (leaf first), reloaded on SIGHUP and when the file changes; with -tls-key")
	fs.StringVar(&f.KeyFile, "tls-key", "", "the PEM private key of -tls-cert (never logged)")
	fs.Func("acme-domain", "serve TLS with a certificate obtained through ACME for `NAME` (repeatable); the ACME server must reach NAME on port 443 (TLS-ALPN-01) or, with -http-addr, port 80 (HTTP-01)", func(s string) error {
		f.ACMEDomains = append(f.ACMEDomains, s)
		return nil
	})
	fs.StringVar(&f.ACMEDir, "acme-dir", DefaultACMEDir, "with -acme-domain: cache of the ACME account key and certificates (created 0700; keep it across restarts)")
	fs.StringVar(&f.ACMEDirectoryURL, "acme-directory-url", "", "with -acme-domain: the ACME server's directory URL (default Let's Encrypt's, "+acme.LetsEncryptURL+")")
	fs.StringVar(&f.ACMEEmail, "acme-email", "", "with -acme-domain: contact address of the ACME account (optional)")
	fs.StringVar(&f.ACMECAFile, "acme-ca-file", "", "with -acme-domain: PEM roots to trust for the ACME server itself instead of the system roots (a private ACME server)")
	fs.StringVar(&f.HTTPAddr, "http-addr", "", "with TLS: plain HTTP listen address (e.g. :80) that answers ACME HTTP-01 challenges and redirects everything else to https")
	fs.DurationVar(&f.HSTSMaxAge, "hsts-max-age", DefaultHSTSMaxAge, "with TLS: the max-age of the Strict-Transport-Security header every answer carries (0: none)")
	return f
}

// Enabled reports whether the flags ask for TLS.
func (f *Flags) Enabled() bool { return f.CertFile != "" || f.KeyFile != "" || len(f.ACMEDomains) > 0 }

// ACME reports whether certificates come from ACME.
func (f *Flags) ACME() bool { return len(f.ACMEDomains) > 0 }

// Check validates the parsed flags, normalises the ACME domains and fills
// the defaults. Its errors name the flag and wrap ErrFlags.
func (f *Flags) Check() error {
	set := map[string]bool{}
	if f.fs != nil {
		f.fs.Visit(func(fl *flag.Flag) { set[fl.Name] = true })
	}
	bad := func(format string, args ...any) error {
		return fmt.Errorf("%w: "+format, append([]any{ErrFlags}, args...)...)
	}
	switch {
	case (f.CertFile == "") != (f.KeyFile == ""):
		return bad("-tls-cert and -tls-key go together")
	case f.CertFile != "" && len(f.ACMEDomains) > 0:
		return bad("-tls-cert/-tls-key and -acme-domain are exclusive: serve either the certificate files or ACME's")
	case f.HTTPAddr != "" && !f.Enabled():
		return bad("-http-addr needs TLS (-tls-cert/-tls-key or -acme-domain): it only redirects to https")
	case f.HSTSMaxAge < 0 || f.HSTSMaxAge%time.Second != 0:
		return bad("-hsts-max-age %v: want whole seconds, 0 or more", f.HSTSMaxAge)
	case set["hsts-max-age"] && !f.Enabled():
		return bad("-hsts-max-age needs TLS: HSTS is sent over https only")
	}
	if len(f.ACMEDomains) == 0 {
		for _, name := range []string{"acme-dir", "acme-directory-url", "acme-email", "acme-ca-file"} {
			if set[name] {
				return bad("-%s needs -acme-domain", name)
			}
		}
		return nil
	}
	for i, d := range f.ACMEDomains {
		n, err := domainName(d)
		if err != nil {
			return bad("-acme-domain %q: %v", d, err)
		}
		if slices.Contains(f.ACMEDomains[:i], n) {
			return bad("-acme-domain %q is given twice", d)
		}
		f.ACMEDomains[i] = n
	}
	if f.ACMEDir == "" {
		return bad("-acme-dir must not be empty")
	}
	if f.ACMEDirectoryURL != "" {
		u, err := url.Parse(f.ACMEDirectoryURL)
		if err != nil || u.Scheme != "https" || u.Host == "" || u.User != nil || u.Fragment != "" {
			return bad("-acme-directory-url %q: want an https:// URL without userinfo or fragment", f.ACMEDirectoryURL)
		}
	}
	if f.ACMEEmail != "" {
		a, err := mail.ParseAddress(f.ACMEEmail)
		if err != nil || a.Address != f.ACMEEmail {
			return bad("-acme-email %q: want a bare address such as ops@example.com", f.ACMEEmail)
		}
	}
	return nil
}

// domainName returns s lowercased if it is a DNS name autocert can obtain
// a certificate for: ASCII letters, digits and hyphens in at least two
// labels, no wildcard, no IP address, no port.
func domainName(s string) (string, error) {
	n := strings.ToLower(strings.TrimSuffix(s, "."))
	switch {
	case n == "":
		return "", errors.New("empty name")
	case strings.HasPrefix(n, "*."):
		return "", errors.New("wildcard names need the DNS-01 challenge, which autocert does not do")
	case len(n) > 253:
		return "", errors.New("longer than 253 characters")
	}
	labels := strings.Split(n, ".")
	if len(labels) < 2 {
		return "", errors.New("a name with at least one dot is needed (autocert refuses single-label names such as localhost)")
	}
	for _, l := range labels {
		if l == "" || len(l) > 63 || l[0] == '-' || l[len(l)-1] == '-' {
			return "", fmt.Errorf("bad label %q", l)
		}
		for _, c := range l {
			if !('a' <= c && c <= 'z' || '0' <= c && c <= '9' || c == '-') {
				return "", fmt.Errorf("character %q: want letters, digits, hyphens and dots (write international names in punycode, xn--...; no port, no scheme)", c)
			}
		}
	}
	if last := labels[len(labels)-1]; strings.Trim(last, "0123456789") == "" {
		return "", errors.New("an IP address: ACME here obtains certificates for DNS names only")
	}
	return n, nil
}
