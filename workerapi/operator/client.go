package operator

import (
	"bytes"
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"mime"
	"net"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/nodelane/nodelane/workerapi/wire"
)

// DefaultUserAgent is the User-Agent a Client sends unless
// Config.UserAgent says otherwise.
const DefaultUserAgent = "nodelane-operator/1"

// MaxAnswerBytes bounds the body of an answer a Client reads. The API
// ends a page at about 1 MiB (PROTOCOL.md §5.14), and a job's view holds
// one page of events and one of artifacts, so a larger answer is not the
// API's.
const MaxAnswerBytes = 8 << 20

// ErrConfig is wrapped by every error of New about an invalid base URL or
// setting; the message names it.
var ErrConfig = errors.New("operator: invalid configuration")

// ErrMalformedAnswer is wrapped by the error of a call whose success
// answer is not what the route answers: not JSON, not of the route's
// shape, larger than MaxAnswerBytes, or a cursor that does not move on.
// The server may have acted on the request all the same.
var ErrMalformedAnswer = errors.New("malformed answer")

// ErrBadToken is wrapped by the error of New, and of each call of a
// Client made WithToken, given a token that cannot be a bearer token: one
// that holds a space, a control character or a non-ASCII byte. The error
// does not show the token, and nothing is sent.
var ErrBadToken = errors.New("the token holds a character a bearer token cannot (a space, a control character or a non-ASCII byte)")

// Config holds a Client's optional settings; a nil *Config means every
// default.
type Config struct {
	// HTTPClient sends the requests. Defaults to a client on a clone of
	// http.DefaultTransport (the proxy environment variables apply) that
	// speaks TLS 1.2 at least and follows no redirect, so that a bearer
	// token is sent only where the base URL says. A caller's client that
	// needs a private CA, pinned keys or a dialer of its own configures
	// its Transport; a HandlerTransport serves the requests in process.
	HTTPClient *http.Client
	// AllowInsecureHTTP lets the base URL be plain http to a host that is
	// not this machine (loopback). Without it New refuses one: each
	// request carries a bearer token. A Client whose HTTPClient's
	// Transport is a *HandlerTransport sends nothing over a network and
	// needs no https.
	AllowInsecureHTTP bool
	// UserAgent is sent with every request. Defaults to DefaultUserAgent.
	UserAgent string
}

// Client calls the operator routes of one control plane with one bearer
// token. Every method is one request (an iterator, one per page) and none
// is retried: a *wire.Error whose Temporary reports true (429, 503) may
// be tried again, after its RetryAfter. A Client is safe for concurrent
// use.
type Client struct {
	// base is the scheme, host and path prefix of the base URL, without
	// a trailing "/".
	base  string
	token string
	hc    *http.Client
	ua    string
}

// New returns a Client of the control plane at baseURL, where the host
// mounts the operator handler (the routes are /operator/... below it:
// "https://cp.example.com/nodelane" calls
// https://cp.example.com/nodelane/operator/jobs), that authenticates
// with the operator token. An empty token sends no Authorization header
// (every route then answers 401): a Client that only hands out copies
// WithToken needs none. cfg may be nil.
func New(baseURL, token string, cfg *Config) (*Client, error) {
	if cfg == nil {
		cfg = &Config{}
	}
	u, err := url.Parse(baseURL)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" || u.Opaque != "" {
		// Not repeated in full: a URL may hold a password.
		return nil, fmt.Errorf("%w: base URL is not an absolute http(s) URL", ErrConfig)
	}
	if u.User != nil || u.RawQuery != "" || u.ForceQuery || u.Fragment != "" {
		return nil, fmt.Errorf("%w: base URL %s has user information, a query or a fragment", ErrConfig, u.Redacted())
	}
	hc := cfg.HTTPClient
	if hc == nil {
		t := http.DefaultTransport.(*http.Transport).Clone()
		t.TLSClientConfig = &tls.Config{MinVersion: tls.VersionTLS12}
		hc = &http.Client{Transport: t, CheckRedirect: func(*http.Request, []*http.Request) error {
			return http.ErrUseLastResponse
		}}
	}
	_, inProcess := hc.Transport.(*HandlerTransport)
	if u.Scheme == "http" && !cfg.AllowInsecureHTTP && !inProcess && !isLoopback(u.Hostname()) {
		return nil, fmt.Errorf("%w: base URL %s is plain http to %q, which is not this machine: the operator token would cross the network in clear; use https, or set AllowInsecureHTTP on a network you trust",
			ErrConfig, u.Redacted(), u.Hostname())
	}
	if err := checkToken(token); err != nil {
		return nil, fmt.Errorf("%w: %w", ErrConfig, err)
	}
	ua := cfg.UserAgent
	if ua == "" {
		ua = DefaultUserAgent
	}
	return &Client{
		base:  u.Scheme + "://" + u.Host + strings.TrimRight(u.EscapedPath(), "/"),
		token: token,
		hc:    hc,
		ua:    ua,
	}, nil
}

// WithToken returns a copy of c that sends token instead of c's: a
// cheap copy (it shares c's HTTP client), made for one call or kept. An
// empty token sends none. A token that could not be an Authorization
// header's fails each call of the copy with an error wrapping
// ErrBadToken, which does not show it.
func (c *Client) WithToken(token string) *Client {
	cp := *c
	cp.token = token
	return &cp
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

// checkToken refuses a token that could not be sent as a bearer token
// (RFC 6750's b64token is visible ASCII); the error does not show it.
func checkToken(token string) error {
	for i := 0; i < len(token); i++ {
		if token[i] <= ' ' || token[i] > '~' {
			return ErrBadToken
		}
	}
	return nil
}

// call sends one request: path is the escaped path below the base URL,
// q its query (nil: none), in its JSON body (nil: none). A 2xx answer is
// decoded into out, or its body kept when out is a *[]byte or, for a
// text/plain answer, a *text (nil: not read); any other answer is a *wire.Error.
func (c *Client) call(ctx context.Context, method, path string, q url.Values, in, out any) error {
	route := method + " " + path
	if err := checkToken(c.token); err != nil {
		return fmt.Errorf("operator: %s: %w", route, err)
	}
	target := c.base + path
	if len(q) > 0 {
		target += "?" + q.Encode()
	}
	var body io.Reader
	if in != nil {
		b, err := json.Marshal(in)
		if err != nil {
			return fmt.Errorf("operator: %s: encoding the request: %w", route, err)
		}
		body = bytes.NewReader(b)
	}
	req, err := http.NewRequestWithContext(ctx, method, target, body)
	if err != nil {
		return fmt.Errorf("operator: %s: %w", route, err)
	}
	if c.token != "" {
		req.Header.Set("Authorization", "Bearer "+c.token)
	}
	if in != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	req.Header.Set("User-Agent", c.ua)
	resp, err := c.hc.Do(req)
	if err != nil {
		return fmt.Errorf("operator: %s: %w", route, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(io.LimitReader(resp.Body, MaxAnswerBytes+1))
	if err != nil {
		return fmt.Errorf("operator: %s: reading the answer: %w", route, err)
	}
	ct := resp.Header.Get("Content-Type")
	if resp.StatusCode < 200 || resp.StatusCode > 299 {
		return answerError(route, resp, ct, b)
	}
	if len(b) > MaxAnswerBytes {
		return fmt.Errorf("operator: %s: %w: larger than %d bytes", route, ErrMalformedAnswer, MaxAnswerBytes)
	}
	switch o := out.(type) {
	case nil:
		return nil
	case *[]byte:
		*o = b
		return nil
	case *text:
		if mt, _, _ := mime.ParseMediaType(ct); mt != "text/plain" {
			return fmt.Errorf("operator: %s: %w: %d with Content-Type %q, not text", route, ErrMalformedAnswer, resp.StatusCode, ct)
		}
		*o = b
		return nil
	}
	if mt, _, _ := mime.ParseMediaType(ct); mt != "application/json" {
		return fmt.Errorf("operator: %s: %w: %d with Content-Type %q, not JSON", route, ErrMalformedAnswer, resp.StatusCode, ct)
	}
	if err := json.Unmarshal(b, out); err != nil {
		return fmt.Errorf("operator: %s: %w: %w", route, ErrMalformedAnswer, err)
	}
	return nil
}

// text is a text/plain answer's body, for call.
type text []byte

// answerError is the *wire.Error of an answer that is not a success.
func answerError(route string, resp *http.Response, ct string, b []byte) *wire.Error {
	e := &wire.Error{Status: resp.StatusCode, Route: route, RequestID: resp.Header.Get("X-Request-Id")}
	if s, err := strconv.Atoi(resp.Header.Get("Retry-After")); err == nil && s > 0 {
		e.RetryAfter = time.Duration(s) * time.Second
	}
	var eb wire.ErrorBody
	if len(b) <= MaxAnswerBytes && json.Unmarshal(b, &eb) == nil && eb.Error.Code != "" {
		e.Code, e.Message, e.ServerTime = eb.Error.Code, eb.Error.Message, eb.Error.ServerTime
		return e
	}
	if ct == "" {
		ct = "none"
	}
	e.Message = fmt.Sprintf("the answer is not an error of the operator API (Content-Type %s): is the base URL the control plane's?", ct)
	return e
}

// Call sends one request to route, a path below the base URL with its
// query ("/operator/jobs?state=queued"), with in as its JSON body (none
// when in is nil), and returns the body of a 2xx answer as it came. Any
// other answer is a *wire.Error. It is for a route or a parameter this
// package does not know yet, or for a program that prints answers as they
// come; the typed methods are the usual way.
func (c *Client) Call(ctx context.Context, method, route string, in any) ([]byte, error) {
	path, query, _ := strings.Cut(route, "?")
	q, err := url.ParseQuery(query)
	if err != nil {
		return nil, fmt.Errorf("operator: %s %s: the query does not parse: %w", method, path, err)
	}
	var b []byte
	if err := c.call(ctx, method, path, q, in, &b); err != nil {
		return nil, err
	}
	return b, nil
}
