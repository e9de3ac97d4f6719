package workerapi

import (
	"crypto/ed25519"
	"crypto/tls"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"strings"

	"github.com/nodelane/nodelane/replay"
)

// A worker signs @authority and @path as it sends them: the host and path
// of the URL it was configured with (PROTOCOL.md §4.4). A proxy that
// rewrites Host or strips a path prefix changes both before the Server
// sees them, so a Server behind one verifies against its public origin
// (Config.PublicOrigin) instead of what it received.

// publicOrigin is Config.PublicOrigin, parsed.
type publicOrigin struct {
	https bool
	// authority is the origin's host, lowercased, without the default
	// port of its scheme: the @authority its workers sign.
	authority string
	// prefix is the origin's escaped path without any trailing "/": what
	// the workers' @path starts with, before the path the handler routes.
	prefix string
}

// parsePublicOrigin parses Config.PublicOrigin: an absolute http or https
// URL, optionally with a path, and without userinfo, query or fragment.
func parsePublicOrigin(s string) (*publicOrigin, error) {
	bad := func(why string) error {
		return fmt.Errorf("%w: PublicOrigin %q %s", ErrConfig, s, why)
	}
	u, err := url.Parse(s)
	if err != nil {
		// The url package's error quotes the value; a URL that does not
		// parse may hold a password, so it is not repeated.
		return nil, fmt.Errorf("%w: PublicOrigin does not parse as a URL", ErrConfig)
	}
	if u.User != nil {
		// Userinfo may be a password: the value is not repeated.
		return nil, fmt.Errorf("%w: PublicOrigin has userinfo (user@ or user:password@): workers sign no credentials into the URL", ErrConfig)
	}
	switch {
	case u.Scheme != "http" && u.Scheme != "https", u.Opaque != "":
		return nil, bad("is not an absolute http:// or https:// URL")
	case u.Hostname() == "":
		return nil, bad("has no host")
	case u.RawQuery != "" || u.ForceQuery:
		return nil, bad("has a query")
	case u.Fragment != "" || strings.Contains(s, "#"):
		return nil, bad("has a fragment")
	case strings.HasSuffix(u.Host, ":"):
		return nil, bad("has an empty port")
	}
	o := &publicOrigin{https: u.Scheme == "https", prefix: strings.TrimRight(u.EscapedPath(), "/")}
	o.authority = strings.ToLower(u.Host)
	if o.https {
		o.authority = strings.TrimSuffix(o.authority, ":443")
	} else {
		o.authority = strings.TrimSuffix(o.authority, ":80")
	}
	return o, nil
}

// request returns a view of r as received at the public origin, for
// package replay to verify: a shallow copy whose Host is the origin's
// authority, whose request-target is the origin's path prefix, then the
// path the handler routes (r.URL, after any http.StripPrefix of the
// host), then r's query as received, and whose scheme is the origin's.
func (o *publicOrigin) request(r *http.Request) *http.Request {
	return withTarget(r, o.https, o.authority, o.prefix+r.URL.EscapedPath())
}

// withTarget returns a shallow copy of the received request r that
// package replay reads as received over https (or plain http) with Host
// host and the request-target path, then r's query as received. Nothing of
// r changes: the copy has its own URL, and a TLS state only to say https
// (replay reads the scheme from r.TLS, and so which default port it strips
// from @authority).
func withTarget(r *http.Request, https bool, host, path string) *http.Request {
	if path == "" {
		path = "/"
	}
	v := new(http.Request)
	*v = *r
	u := *r.URL
	v.URL = &u
	v.Host = host
	v.RequestURI = path + receivedQuery(r)
	if https {
		u.Scheme = "https"
		if v.TLS == nil {
			v.TLS = &tls.ConnectionState{}
		}
	} else {
		u.Scheme = "http"
		v.TLS = nil
	}
	return v
}

// receivedQuery is "?" and the query of r's request-target as received, or
// "" when it had none.
func receivedQuery(r *http.Request) string {
	if r.RequestURI != "" {
		if _, q, ok := strings.Cut(r.RequestURI, "?"); ok {
			return "?" + q
		}
		return ""
	}
	if r.URL.RawQuery != "" || r.URL.ForceQuery {
		return "?" + r.URL.RawQuery
	}
	return ""
}

// maxDiagnoses caps the extra signature verifications one refused
// signature costs: the diagnosis runs only for a caller that holds a valid
// credential, whose signature names its own key and does not verify.
const maxDiagnoses = 8

// maxHint bounds the length of a proxy header a diagnosis tries.
const maxHint = 512

// diagnose explains a signature that does not verify. verified is the view
// of r that err came from (r itself, or r as received at the public
// origin). When the signature names the caller's key and fails to verify,
// diagnose verifies it over at most maxDiagnoses other pairs of @authority
// and @path: the public origin's and the received ones (whichever were not
// verified), and those that the headers of a proxy suggest
// (X-Forwarded-Host, Forwarded's host=, X-Forwarded-Prefix). A pair that
// verifies names the component(s) that differ; a pair that does not
// verify names nothing. Either way the request is refused: the headers
// are never trusted, only the signature over the values they suggest. Any
// other error is returned as it is.
//
// The message shows the value the worker signed and the value the server
// verified. Neither is a secret: the first is the host and path of the
// URL the worker was configured with, the second the Host and path the
// proxy sent (at most an upstream address) or the configured public
// origin; and only a caller that presented a valid credential gets this
// far. Without both values an operator cannot tell which setting to fix.
func (s *Server) diagnose(r, verified *http.Request, pub ed25519.PublicKey, err error) error {
	if !errors.Is(err, replay.ErrBadSignature) || len(pub) != ed25519.PublicKeySize {
		return err
	}
	sig, perr := replay.ParseSignature(r.Header, replay.Label)
	if perr != nil {
		return err
	}
	if keyID, _ := sig.Params.Get("keyid"); keyID != replay.KeyID(pub) {
		return err // another key's signature: nothing to diagnose
	}
	auth, aerr := replay.ComponentValue(verified, replay.ComponentAuthority)
	path, perr := replay.ComponentValue(verified, replay.ComponentPath)
	if aerr != nil || perr != nil {
		return err
	}
	hosts, paths := s.alternatives(r, verified, auth, path)
	try := func(h target, p string) bool {
		return replay.VerifyRequest(withTarget(r, h.https, h.host, p), sig, pub) == nil
	}
	n := 0
	found := func(h target, p string) bool {
		if n >= maxDiagnoses {
			return false
		}
		n++
		return try(h, p)
	}
	self := target{https: verified.TLS != nil, host: verified.Host}
	for _, h := range hosts {
		if found(h, path) {
			return s.badTarget(h.value, auth, "", "")
		}
	}
	for _, p := range paths {
		if found(self, p) {
			return s.badTarget("", "", p, path)
		}
	}
	for _, h := range hosts {
		for _, p := range paths {
			if found(h, p) {
				return s.badTarget(h.value, auth, p, path)
			}
		}
	}
	return fmt.Errorf("%w (this server verified it over @authority %q and @path %q)", err, auth, path)
}

// A target is a Host to try and the scheme that says which default port
// @authority drops; value is the @authority it gives.
type target struct {
	https       bool
	host, value string
}

// alternatives lists the other @authority (as targets) and @path values a
// diagnosis tries, without duplicates or the values verified (auth and
// path).
func (s *Server) alternatives(r, verified *http.Request, auth, path string) (hosts []target, paths []string) {
	addHost := func(https bool, host string) {
		if host == "" || len(host) > maxHint {
			return
		}
		v, err := replay.ComponentValue(withTarget(r, https, host, "/"), replay.ComponentAuthority)
		if err != nil || v == auth {
			return
		}
		for _, h := range hosts {
			if h.value == v {
				return
			}
		}
		hosts = append(hosts, target{https: https, host: host, value: v})
	}
	addPath := func(p string) {
		if p == "" || p == path || len(p) > maxHint || p[0] != '/' {
			return
		}
		for _, q := range paths {
			if q == p {
				return
			}
		}
		paths = append(paths, p)
	}
	https := verified.TLS != nil
	// With a public origin verified, the values as received (a worker
	// that reaches the Server directly, or a public origin set wrong).
	received, _ := replay.ComponentValue(r, replay.ComponentPath)
	if s.origin != nil {
		addHost(r.TLS != nil, r.Host)
		addPath(received)
	}
	// What a proxy says it was asked for. Its scheme, when it says one,
	// decides the default port.
	hintHTTPS := https
	if p := firstElement(r.Header.Get("X-Forwarded-Proto")); p == "https" || p == "http" {
		hintHTTPS = p == "https"
	}
	addHost(hintHTTPS, firstElement(r.Header.Get("X-Forwarded-Host")))
	if host, proto := forwardedHost(r.Header.Get("Forwarded")); host != "" {
		fh := https
		if proto == "https" || proto == "http" {
			fh = proto == "https"
		}
		addHost(fh, host)
	}
	if prefix := strings.TrimRight(firstElement(r.Header.Get("X-Forwarded-Prefix")), "/"); strings.HasPrefix(prefix, "/") {
		// The proxy stripped prefix from the path it forwarded: the path
		// as received, and, if the host stripped more, the routed one.
		addPath(prefix + received)
		addPath(prefix + r.URL.EscapedPath())
	}
	return hosts, paths
}

// badTarget is the refusal of a signature that verifies over another
// @authority (signedHost, where the server verified host) or @path
// (signedPath, where it verified path), or both.
func (s *Server) badTarget(signedHost, host, signedPath, path string) error {
	var signed, verifies, what string
	switch {
	case signedHost != "" && signedPath != "":
		signed = fmt.Sprintf("@authority %q and @path %q", signedHost, signedPath)
		verifies = fmt.Sprintf("%q and %q", host, path)
		what = "rewrites Host and changes the path (a prefix stripped or added)"
	case signedHost != "":
		signed, verifies, what = fmt.Sprintf("@authority %q", signedHost), fmt.Sprintf("%q", host), "rewrites Host"
	default:
		signed, verifies, what = fmt.Sprintf("@path %q", signedPath), fmt.Sprintf("%q", path),
			"changes the path (a prefix stripped or added)"
	}
	fix := "a proxy in front " + what + "; set the public origin (workerapi.Config.PublicOrigin, server -public-url) to the URL the workers use"
	if s.origin != nil {
		fix = "the public origin (workerapi.Config.PublicOrigin, server -public-url) is not the URL this worker uses: make them the same"
	}
	return fmt.Errorf("%w: signature does not verify: it was signed for %s, and this server verifies %s: %s",
		replay.ErrBadSignature, signed, verifies, fix)
}

// firstElement is the first element of a comma-separated field value,
// trimmed of spaces and tabs: the one the client-facing proxy wrote.
func firstElement(v string) string {
	v, _, _ = strings.Cut(v, ",")
	return strings.Trim(v, " \t")
}

// forwardedHost returns the host= and proto= parameters of the first
// element of a Forwarded field value (RFC 7239 §4), unquoted. It reads
// only what a diagnosis needs and gives up ("", "") on anything odd.
func forwardedHost(v string) (host, proto string) {
	for v != "" {
		v = strings.TrimLeft(v, " \t")
		name, rest, ok := strings.Cut(v, "=")
		if !ok {
			return host, proto
		}
		name = strings.ToLower(strings.Trim(name, " \t"))
		var val string
		if strings.HasPrefix(rest, `"`) {
			end := strings.IndexByte(rest[1:], '"')
			if end < 0 || strings.Contains(rest[1:end+1], `\`) {
				return "", ""
			}
			val, rest = rest[1:end+1], rest[end+2:]
		} else {
			i := strings.IndexAny(rest, ";,")
			if i < 0 {
				i = len(rest)
			}
			val, rest = strings.Trim(rest[:i], " \t"), rest[i:]
			if strings.ContainsAny(val, " \t") {
				return "", ""
			}
		}
		switch name {
		case "host":
			host = val
		case "proto":
			proto = strings.ToLower(val)
		}
		rest = strings.TrimLeft(rest, " \t")
		if rest == "" || rest[0] == ',' {
			return host, proto
		}
		if rest[0] != ';' {
			return "", ""
		}
		v = rest[1:]
	}
	return host, proto
}
