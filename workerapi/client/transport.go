package client

import (
	"bytes"
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"encoding/base64"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/url"
	"strings"
)

// ErrPinMismatch is wrapped by the error of a request to a server none of
// whose certificates has a public key Config.PinnedPublicKeys names: the
// TLS handshake fails, and nothing (no token, no body) is sent.
var ErrPinMismatch = errors.New("client: the server's certificate matches no pinned public key")

// PublicKeyPin returns the pin of cert's public key for
// Config.PinnedPublicKeys: the standard base64 of the SHA-256 of its DER
// SubjectPublicKeyInfo, as
//
//	openssl x509 -in cert.pem -pubkey -noout | openssl pkey -pubin -outform der | openssl dgst -sha256 -binary | base64
//
// prints it.
func PublicKeyPin(cert *x509.Certificate) string {
	sum := sha256.Sum256(cert.RawSubjectPublicKeyInfo)
	return base64.StdEncoding.EncodeToString(sum[:])
}

// isLoopback reports whether host (a URL's host name, without its port)
// is this machine: localhost, or a loopback address.
func isLoopback(host string) bool {
	if strings.EqualFold(host, "localhost") {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}

// checkScheme refuses a plain-http base URL to another machine unless
// the Config allows it: every request carries a bearer token, which would
// cross the network in clear.
func checkScheme(u *url.URL, c *Config) error {
	if u.Scheme == "http" && !c.AllowInsecureHTTP && !isLoopback(u.Hostname()) {
		return fmt.Errorf("%w: base URL %s is plain http to %q, which is not this machine: its bearer tokens would cross the network in clear; use https, or set AllowInsecureHTTP (worker -insecure-http) on a network you trust",
			ErrConfig, u.Redacted(), u.Hostname())
	}
	return nil
}

// transport builds the HTTP client of a Config that names none: a clone
// of http.DefaultTransport (so the proxy environment variables apply)
// with the Config's roots, pins and dialer, TLS 1.2 at least, and no
// redirects followed: a signed request covers its authority and path, so a
// redirected one could only be refused, and a POST redirected by 301 or
// 302 would lose its body. It fails if a setting that shapes the
// transport is given with an HTTPClient of the caller's.
func transport(c *Config) (*http.Client, error) {
	if c.HTTPClient != nil {
		if c.RootCAs != nil || len(c.PinnedPublicKeys) > 0 || c.DialContext != nil {
			return nil, fmt.Errorf("%w: RootCAs, PinnedPublicKeys and DialContext shape the Client's own transport: with HTTPClient set, configure its Transport instead", ErrConfig)
		}
		return c.HTTPClient, nil
	}
	pins, err := parsePins(c.PinnedPublicKeys)
	if err != nil {
		return nil, err
	}
	t := http.DefaultTransport.(*http.Transport).Clone()
	t.TLSClientConfig = &tls.Config{MinVersion: tls.VersionTLS12, RootCAs: c.RootCAs}
	if len(pins) > 0 {
		t.TLSClientConfig.VerifyConnection = func(cs tls.ConnectionState) error {
			return matchPins(cs, pins)
		}
	}
	if c.DialContext != nil {
		t.DialContext = c.DialContext
	}
	return &http.Client{
		Transport: t,
		CheckRedirect: func(*http.Request, []*http.Request) error {
			return http.ErrUseLastResponse
		},
	}, nil
}

// matchPins checks the certificates of a verified handshake against
// pins: those the server sent and those of the chains they were verified
// through, so that a pin may name the leaf's key or a CA's.
func matchPins(cs tls.ConnectionState, pins [][]byte) error {
	match := func(certs []*x509.Certificate) bool {
		for _, cert := range certs {
			sum := sha256.Sum256(cert.RawSubjectPublicKeyInfo)
			for _, p := range pins {
				if bytes.Equal(sum[:], p) {
					return true
				}
			}
		}
		return false
	}
	if match(cs.PeerCertificates) {
		return nil
	}
	for _, chain := range cs.VerifiedChains {
		if match(chain) {
			return nil
		}
	}
	return ErrPinMismatch
}

// parsePins decodes Config.PinnedPublicKeys.
func parsePins(ss []string) ([][]byte, error) {
	var pins [][]byte
	for i, s := range ss {
		b, err := base64.StdEncoding.DecodeString(s)
		if err != nil || len(b) != sha256.Size {
			return nil, fmt.Errorf("%w: PinnedPublicKeys[%d] %q is not the standard base64 of a SHA-256 hash (44 characters)", ErrConfig, i, s)
		}
		pins = append(pins, b)
	}
	return pins, nil
}

// storeTransport builds the default Config.StoreHTTPClient: a clone of
// http.DefaultTransport, TLS 1.2 at least, no redirects followed.
func storeTransport() *http.Client {
	t := http.DefaultTransport.(*http.Transport).Clone()
	t.TLSClientConfig = &tls.Config{MinVersion: tls.VersionTLS12}
	return &http.Client{
		Transport: t,
		CheckRedirect: func(*http.Request, []*http.Request) error {
			return http.ErrUseLastResponse
		},
	}
}
