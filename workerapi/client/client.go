package client

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"crypto/x509"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	mrand "math/rand/v2"
	"net"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/nodelane/nodelane/replay"
	"github.com/nodelane/nodelane/workerapi/wire"
)

// The defaults of Config.
const (
	DefaultRequestTimeout = 30 * time.Second
	DefaultMaxAttempts    = 5
	DefaultRetryBase      = 250 * time.Millisecond
	DefaultRetryMax       = 15 * time.Second
	DefaultUserAgent      = "nodelane-worker/1"
)

// ErrConfig is wrapped by every error of New and NewRunner about a missing
// or invalid setting; the message names it.
var ErrConfig = errors.New("client: invalid configuration")

// setting is a duration setting with its default, for defaults.
type setting struct {
	name string
	v    *time.Duration
	def  time.Duration
}

// defaults sets each zero setting to its default and refuses a negative
// one, naming it as a field of typ.
func defaults(typ string, ss []setting) error {
	for _, s := range ss {
		switch {
		case *s.v < 0:
			return fmt.Errorf("%w: %s.%s is negative (%v)", ErrConfig, typ, s.name, *s.v)
		case *s.v == 0:
			*s.v = s.def
		}
	}
	return nil
}

// Config holds a Client's settings. A nil *Config is not enough: Identity
// is required. A zero duration or count means its default; a negative one
// is an error from New.
type Config struct {
	// Identity is the node's Ed25519 key and, once registered, its worker
	// id and token (see LoadOrCreateIdentity). Required.
	Identity *Identity
	// HTTPClient sends the requests. It should have no overall Timeout:
	// lease long-polls last up to a minute, and every attempt is bounded by
	// RequestTimeout instead. Defaults to a client on a clone of
	// http.DefaultTransport (the proxy environment variables apply) that
	// speaks TLS 1.2 at least, trusts RootCAs, checks PinnedPublicKeys,
	// dials with DialContext and follows no redirect. New refuses RootCAs,
	// PinnedPublicKeys or DialContext beside an HTTPClient of the caller's.
	HTTPClient *http.Client
	// StoreHTTPClient sends the requests to presigned URLs of the
	// artifact store (uploads and downloads the control plane hands to
	// the store directly), which carry no credential of the node; the
	// HTTPClient's roots, pins and dialer are the control plane's, not the
	// store's. Defaults to a client on a clone of http.DefaultTransport
	// (the system's roots; the proxy environment variables apply) that
	// speaks TLS 1.2 at least and follows no redirect.
	StoreHTTPClient *http.Client
	// RootCAs are the certificate authorities trusted for an https base
	// URL, as for a private PKI. Defaults to nil: the system's roots.
	RootCAs *x509.CertPool
	// PinnedPublicKeys, when set, are the public keys one of which a
	// certificate of the server's verified chain must hold (its own, or a
	// CA's), each as PublicKeyPin prints it: a handshake with a server that
	// matches none fails with ErrPinMismatch before anything is sent. They are checked on top of
	// the usual certificate verification, never instead of it; list the
	// next key beside the current one before a key rotation.
	PinnedPublicKeys []string
	// AllowInsecureHTTP lets the base URL be plain http to a host that is
	// not this machine (loopback). Without it New refuses one: each
	// request carries a bearer token.
	AllowInsecureHTTP bool
	// DialContext, when set, opens the connections to the control plane,
	// say through a VPN's or an overlay network's dialer, or to another
	// address than the base URL's host (the TLS name and the signatures
	// still use the base URL's host). Defaults to net.Dialer's.
	DialContext func(ctx context.Context, network, addr string) (net.Conn, error)
	// RequestTimeout bounds one attempt of one request (a lease long-poll
	// gets its wait_seconds on top). Defaults to DefaultRequestTimeout.
	RequestTimeout time.Duration
	// MaxAttempts is how many times one call is sent before its error is
	// returned: network errors, 5xx and 429 are retried; other 4xx never.
	// Defaults to DefaultMaxAttempts.
	MaxAttempts int
	// RetryBase and RetryMax shape the backoff between attempts: a random
	// delay from 0 to RetryBase·2^(attempt-1), capped at RetryMax ("full
	// jitter"). A Retry-After the server sends is honoured. Default to
	// DefaultRetryBase and DefaultRetryMax.
	RetryBase time.Duration
	RetryMax  time.Duration
	// UserAgent is sent with every request. Defaults to DefaultUserAgent.
	UserAgent string
	// Logger receives retries and clock corrections (never a token).
	// Defaults to a logger that discards everything.
	Logger *slog.Logger
	// Now is the node's local clock. Defaults to time.Now.
	Now func() time.Time
	// Rand is the source of nonces. Defaults to crypto/rand.Reader.
	Rand io.Reader
}

// Client calls the worker routes of PROTOCOL.md for one node. Every
// attempt of every request is signed afresh (a new nonce, a new created
// time), so a retry is never refused as a replay. It corrects the node's
// clock: the server_time (or Date header) of each 2xx answer and of each
// stale_timestamp refusal updates an offset, clamped to ±MaxClockOffset,
// and signatures are created at local time plus that offset, so a node
// whose clock drifts still lands in the server's 5-minute window. Other
// error answers leave the offset alone. A Client is safe for concurrent
// use.
type Client struct {
	base   *url.URL
	cfg    Config
	id     *Identity
	hc     *http.Client
	store  *http.Client
	log    *slog.Logger
	signer *replay.Signer

	mu          sync.Mutex
	offset      time.Duration
	offsetKnown bool
}

// New returns a Client for the control plane at baseURL: the URL
// where the host mounted the worker routes, so that baseURL +
// "/workers/heartbeat" is the heartbeat route.
func New(baseURL string, cfg *Config) (*Client, error) {
	var c Config
	if cfg != nil {
		c = *cfg
	}
	if c.Identity == nil {
		return nil, fmt.Errorf("%w: Config.Identity is required", ErrConfig)
	}
	u, err := url.Parse(strings.TrimRight(baseURL, "/"))
	if err != nil {
		return nil, fmt.Errorf("%w: base URL: %w", ErrConfig, err)
	}
	if u.Scheme != "http" && u.Scheme != "https" || u.Host == "" {
		return nil, fmt.Errorf("%w: base URL %q is not an absolute http(s) URL", ErrConfig, baseURL)
	}
	if u.RawQuery != "" || u.Fragment != "" {
		return nil, fmt.Errorf("%w: base URL %q has a query or fragment", ErrConfig, baseURL)
	}
	if u.User != nil {
		return nil, fmt.Errorf("%w: base URL %q has user information", ErrConfig, u.Redacted())
	}
	if err := checkScheme(u, &c); err != nil {
		return nil, err
	}
	if c.HTTPClient, err = transport(&c); err != nil {
		return nil, err
	}
	if err := defaults("Config", []setting{
		{"RequestTimeout", &c.RequestTimeout, DefaultRequestTimeout},
		{"RetryBase", &c.RetryBase, DefaultRetryBase},
		{"RetryMax", &c.RetryMax, DefaultRetryMax},
	}); err != nil {
		return nil, err
	}
	switch {
	case c.MaxAttempts < 0:
		return nil, fmt.Errorf("%w: Config.MaxAttempts is negative (%d)", ErrConfig, c.MaxAttempts)
	case c.MaxAttempts == 0:
		c.MaxAttempts = DefaultMaxAttempts
	}
	if c.UserAgent == "" {
		c.UserAgent = DefaultUserAgent
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	if c.Now == nil {
		c.Now = time.Now
	}
	if c.Rand == nil {
		c.Rand = rand.Reader
	}
	if c.StoreHTTPClient == nil {
		c.StoreHTTPClient = storeTransport()
	}
	cl := &Client{base: u, cfg: c, id: c.Identity, hc: c.HTTPClient, store: c.StoreHTTPClient, log: c.Logger}
	cl.signer = replay.NewSigner(c.Identity.Key(), &replay.SignerConfig{Now: cl.ServerNow, Rand: c.Rand})
	return cl, nil
}

// key sets *k, when it is empty, to a random request_id or
// idempotency_key: 128 bits in 22 base64url characters, which every
// attempt of the call sends.
func (c *Client) key(k *string) error {
	if *k != "" {
		return nil
	}
	var b [16]byte
	if _, err := io.ReadFull(c.cfg.Rand, b[:]); err != nil {
		return fmt.Errorf("client: reading randomness: %w", err)
	}
	*k = base64.RawURLEncoding.EncodeToString(b[:])
	return nil
}

// Identity returns the Client's identity.
func (c *Client) Identity() *Identity { return c.id }

// ClockOffset is the server's clock minus the node's, as last measured,
// and whether any answer has measured it yet.
func (c *Client) ClockOffset() (time.Duration, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.offset, c.offsetKnown
}

// ServerNow is the node's estimate of the server's clock: local time plus
// ClockOffset. Signatures are created at this time, and lease deadlines
// (expires_at, in server time) are compared with it.
func (c *Client) ServerNow() time.Time {
	c.mu.Lock()
	off := c.offset
	c.mu.Unlock()
	return c.cfg.Now().Add(off)
}

// until is how long, on the node's clock, until the server time t.
func (c *Client) until(t time.Time) time.Duration { return t.Sub(c.ServerNow()) }

// APIError is an error answer of the control plane (PROTOCOL.md
// "Errors"), or an answer that was not the one expected. Use errors.As to
// read it, or the helpers IsCode, IsLeaseLost, IsRetryable.
type APIError struct {
	// Status is the HTTP status; Code the PROTOCOL.md code ("" when the
	// body was not a PROTOCOL.md error, say from a proxy); Message the
	// server's explanation.
	Status  int
	Code    string
	Message string
	// Route is the path called, such as "/workers/heartbeat".
	Route string
	// RequestID is the X-Request-Id the server answered with.
	RequestID string
	// ServerTime is the server's clock when it answered, if it said.
	ServerTime time.Time
	// RetryAfter is the server's Retry-After, or 0.
	RetryAfter time.Duration
}

func (e *APIError) Error() string {
	code := e.Code
	if code == "" {
		code = http.StatusText(e.Status)
	}
	msg := fmt.Sprintf("client: %s: %d %s", e.Route, e.Status, code)
	if e.Message != "" {
		msg += ": " + e.Message
	}
	return msg
}

// Temporary reports whether the same request may succeed later: 5xx and
// 429 answers.
func (e *APIError) Temporary() bool {
	return e.Status >= 500 || e.Status == http.StatusTooManyRequests
}

// transportError is a request that got no answer: the connection failed,
// the attempt timed out, or the answer could not be read. The server may
// or may not have acted on it.
type transportError struct {
	route string
	err   error
}

func (e *transportError) Error() string { return fmt.Sprintf("client: %s: %v", e.route, e.err) }
func (e *transportError) Unwrap() error { return e.err }

// unansweredError is a final answer to a call an earlier attempt of
// which got no answer: the server may have acted on that attempt, so a
// 409 may mean it succeeded.
type unansweredError struct{ err error }

func (e *unansweredError) Error() string {
	return e.err.Error() + " (an earlier attempt went unanswered and may have succeeded)"
}
func (e *unansweredError) Unwrap() error { return e.err }

// IsCode reports whether err is an *APIError with the PROTOCOL.md code.
func IsCode(err error, code string) bool {
	var ae *APIError
	return errors.As(err, &ae) && ae.Code == code
}

// ErrorCode returns the PROTOCOL.md code of err, or "" if err is not an
// *APIError.
func ErrorCode(err error) string {
	var ae *APIError
	if errors.As(err, &ae) {
		return ae.Code
	}
	return ""
}

// IsLeaseLost reports whether the server said the lease token is not the
// job's live lease (409 lease_lost): the job is no longer this worker's,
// and it must stop working on it.
func IsLeaseLost(err error) bool { return IsCode(err, wire.CodeLeaseLost) }

// IsRetryable reports whether err is worth sending again: no answer
// (network error or timeout), a 5xx or a 429. Other 4xx answers are final.
func IsRetryable(err error) bool {
	var ae *APIError
	if errors.As(err, &ae) {
		return ae.Temporary()
	}
	var te *transportError
	return errors.As(err, &te)
}

// isAuthFatal reports whether err means this node cannot go on with its
// credential: 401 for the token or key, 403 banned or out of scope.
func isAuthFatal(err error) bool {
	var ae *APIError
	if !errors.As(err, &ae) {
		return false
	}
	switch ae.Code {
	case wire.CodeMissingCredential, wire.CodeInvalidToken, wire.CodeTokenExpired, wire.CodeTokenRevoked,
		wire.CodeBadSignature, wire.CodeWorkerBanned, wire.CodeInsufficientScope:
		return true
	}
	return false
}

// callOpts are the per-call settings of do.
type callOpts struct {
	// token is the bearer token to send; "" means the identity's.
	token string
	// wait is how long the server may hold the request (a long-poll).
	wait time.Duration
}

// call is one signed request: what each attempt of send sends.
type call struct {
	method, route string
	// body is a JSON body; or stream, when set, a body streamed from a
	// file (each attempt from its start) whose SHA-256 is sum; or neither,
	// an empty body.
	body   []byte
	stream *io.SectionReader
	sum    [sha256.Size]byte
	// contentType is the request's Content-Type.
	contentType string
	// leaseToken, when set, goes in the Nodelane-Lease-Token header.
	leaseToken string
	// token is the bearer token to send; "" means the identity's.
	token string
	// wait is how long the server may hold the request (a long-poll).
	wait time.Duration
	// out receives a 2xx JSON answer; recv, when set, reads a 2xx answer
	// instead (a streamed body).
	out  any
	recv func(*http.Response) error
	// header holds more request headers.
	header http.Header
	// attempts bounds the attempts; 0 means Config.MaxAttempts.
	attempts int
}

// do POSTs in as JSON to route and decodes a 2xx answer into out,
// retrying as Config says. It returns the answer's status.
func (c *Client) do(ctx context.Context, route string, in, out any, o callOpts) (int, error) {
	body, err := json.Marshal(in)
	if err != nil {
		return 0, fmt.Errorf("client: %s: encoding the request: %w", route, err)
	}
	return c.send(ctx, &call{method: http.MethodPost, route: route, body: body, contentType: "application/json",
		token: o.token, wait: o.wait, out: out})
}

// send sends cl, retrying as Config says. It returns the answer's status.
func (c *Client) send(ctx context.Context, cl *call) (int, error) {
	route := cl.route
	maxAttempts := c.cfg.MaxAttempts
	if cl.attempts > 0 {
		maxAttempts = cl.attempts
	}
	var (
		staleRetried, tokenRetried bool
		unanswered                 bool
		lastErr                    error
	)
	for attempt := 1; ; attempt++ {
		if err := ctx.Err(); err != nil {
			if lastErr != nil {
				return 0, fmt.Errorf("%w (after: %w)", context.Cause(ctx), lastErr)
			}
			return 0, context.Cause(ctx)
		}
		tok := cl.token
		if tok == "" {
			tok = c.id.Token()
		}
		status, err := c.once(ctx, cl, tok)
		if err == nil {
			return status, nil
		}
		lastErr = err
		var ae *APIError
		if errors.As(err, &ae) {
			switch {
			case ae.Code == wire.CodeStaleTimestamp && !staleRetried:
				// once has corrected the offset from this very answer
				// (its server_time or Date): sign again at once.
				staleRetried = true
				attempt--
				continue
			case (ae.Code == wire.CodeTokenRevoked || ae.Code == wire.CodeInvalidToken || ae.Code == wire.CodeTokenExpired) &&
				cl.token == "" && !tokenRetried && c.id.Token() != tok:
				// The token was rotated (a re-registration, or a renewal
				// whose grace has passed) while this request was in
				// flight: send it again with the new one.
				tokenRetried = true
				attempt--
				continue
			}
		}
		if !IsRetryable(err) {
			if unanswered {
				err = &unansweredError{err}
			}
			return status, err
		}
		var te *transportError
		if errors.As(err, &te) {
			unanswered = true
		}
		if ctx.Err() != nil {
			return status, err
		}
		if attempt >= maxAttempts {
			return status, fmt.Errorf("%w (gave up after %d attempts)", err, attempt)
		}
		d := c.backoff(attempt)
		if errors.As(err, &ae) && ae.RetryAfter > 0 {
			d = ae.RetryAfter + jitter(c.cfg.RetryBase)
		}
		if dl, ok := ctx.Deadline(); ok && time.Until(dl) < d {
			return status, err
		}
		c.log.Debug("retrying", "route", route, "attempt", attempt, "delay", d, "err", err)
		if !sleep(ctx, d) {
			return status, err
		}
	}
}

// backoff is the delay after the attempt-th attempt failed: full jitter
// over an exponentially growing, capped window.
func (c *Client) backoff(attempt int) time.Duration {
	return backoffDelay(c.cfg.RetryBase, c.cfg.RetryMax, attempt)
}

func backoffDelay(base, maxDelay time.Duration, attempt int) time.Duration {
	w := base
	for i := 1; i < attempt && w < maxDelay; i++ {
		w *= 2
	}
	return jitter(min(w, maxDelay))
}

// jitter returns a random duration in [0, d].
func jitter(d time.Duration) time.Duration {
	if d <= 0 {
		return 0
	}
	return time.Duration(mrand.Int64N(int64(d) + 1))
}

// sleep waits d or until ctx ends; it reports whether d passed.
func sleep(ctx context.Context, d time.Duration) bool {
	if d <= 0 {
		return ctx.Err() == nil
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-ctx.Done():
		return false
	}
}

// maxAnswer bounds how much of an answer is read.
const maxAnswer = 16 << 20

// once sends one signed attempt of cl with the bearer token token.
func (c *Client) once(ctx context.Context, cl *call, token string) (int, error) {
	route := cl.route
	var (
		actx   context.Context
		cancel context.CancelFunc
		idle   *idleWatch
	)
	if cl.stream != nil || cl.recv != nil {
		// A streamed body or answer may take far longer than
		// RequestTimeout: the attempt ends when no byte moves for that
		// long instead.
		actx, idle = newIdleWatch(ctx, c.cfg.RequestTimeout)
		cancel = idle.stop
	} else {
		actx, cancel = context.WithTimeout(ctx, c.cfg.RequestTimeout+cl.wait)
	}
	defer cancel()
	var body io.Reader
	switch {
	case cl.stream != nil:
		body = idle.reader(io.NewSectionReader(cl.stream, 0, cl.stream.Size()))
	case cl.body != nil:
		body = bytes.NewReader(cl.body)
	}
	// route is escaped already (JobPath), as is the base's String.
	req, err := http.NewRequestWithContext(actx, cl.method, c.base.String()+route, body)
	if err != nil {
		return 0, fmt.Errorf("client: %s: %w", route, err)
	}
	if cl.stream != nil {
		req.ContentLength = cl.stream.Size()
		if req.ContentLength == 0 {
			req.Body = http.NoBody
		} else {
			// The body follows once the server, having checked the
			// headers, reads it: a refusal (lease_lost, too_many_uploads)
			// costs no part's bytes.
			req.Header.Set("Expect", "100-continue")
		}
	}
	for k, v := range cl.header {
		req.Header[k] = v
	}
	req.Header.Set("Content-Type", cl.contentType)
	if cl.recv == nil {
		req.Header.Set("Accept", "application/json")
	}
	req.Header.Set("User-Agent", c.cfg.UserAgent)
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	if cl.leaseToken != "" {
		req.Header.Set(wire.HeaderLeaseToken, cl.leaseToken)
	}
	if cl.stream != nil {
		err = c.signer.SignStream(req, cl.sum)
	} else {
		err = c.signer.Sign(req, cl.body)
	}
	if err != nil {
		return 0, fmt.Errorf("client: %s: signing: %w", route, err)
	}
	sent := c.cfg.Now()
	resp, err := c.hc.Do(req)
	if err != nil {
		if ctx.Err() != nil {
			return 0, context.Cause(ctx)
		}
		if cause := context.Cause(actx); errors.Is(cause, errIdle) {
			err = cause
		}
		return 0, &transportError{route: route, err: err}
	}
	defer resp.Body.Close()
	if idle != nil {
		idle.touch()
	}
	if cl.recv != nil && resp.StatusCode >= 200 && resp.StatusCode < 300 {
		c.observe(nil, resp.Header.Get("Date"), sent, c.cfg.Now())
		resp.Body = idle.readCloser(resp.Body)
		if err := cl.recv(resp); err != nil {
			if ctx.Err() != nil {
				return 0, context.Cause(ctx)
			}
			return resp.StatusCode, err
		}
		return resp.StatusCode, nil
	}
	b, err := io.ReadAll(io.LimitReader(resp.Body, maxAnswer))
	recv := c.cfg.Now()
	if err != nil {
		if ctx.Err() != nil {
			return 0, context.Cause(ctx)
		}
		return resp.StatusCode, &transportError{route: route, err: fmt.Errorf("reading the answer: %w", err)}
	}
	var st struct {
		ServerTime *time.Time `json:"server_time"`
		Error      *struct {
			Code       string     `json:"code"`
			Message    string     `json:"message"`
			ServerTime *time.Time `json:"server_time"`
		} `json:"error"`
	}
	_ = json.Unmarshal(b, &st) // best effort: a body that is not JSON has no time
	// Only an answer the server gave in full (2xx), or its refusal of a
	// stale signature, moves the offset: any other error may come from a
	// replica or a proxy with a clock of its own, and one replica whose
	// clock runs fast must not drag the node's clock after it.
	switch {
	case resp.StatusCode >= 200 && resp.StatusCode < 300:
		c.observe(st.ServerTime, resp.Header.Get("Date"), sent, recv)
	case st.Error != nil && st.Error.Code == wire.CodeStaleTimestamp:
		c.observe(st.Error.ServerTime, resp.Header.Get("Date"), sent, recv)
	}

	if resp.StatusCode >= 200 && resp.StatusCode < 300 {
		if cl.out != nil {
			if err := json.Unmarshal(b, cl.out); err != nil {
				return resp.StatusCode, &APIError{Status: resp.StatusCode, Route: route,
					RequestID: resp.Header.Get("X-Request-Id"), Message: "undecodable answer: " + err.Error()}
			}
		}
		return resp.StatusCode, nil
	}
	ae := &APIError{Status: resp.StatusCode, Route: route, RequestID: resp.Header.Get("X-Request-Id"),
		RetryAfter: retryAfter(resp.Header.Get("Retry-After"), recv)}
	if st.Error != nil {
		ae.Code, ae.Message = st.Error.Code, st.Error.Message
		if st.Error.ServerTime != nil {
			ae.ServerTime = *st.Error.ServerTime
		}
	} else {
		ae.Message = snippet(b)
	}
	if loc := resp.Header.Get("Location"); resp.StatusCode >= 300 && resp.StatusCode < 400 && loc != "" {
		ae.Message = fmt.Sprintf("redirected to %s: the client follows no redirect (a signed request covers its authority and path); make the base URL the one the server redirects to", loc)
	}
	return resp.StatusCode, ae
}

// snippet is the start of a body that is not a PROTOCOL.md error.
func snippet(b []byte) string {
	s := strings.TrimSpace(string(b))
	if len(s) > 200 {
		s = s[:200] + "..."
	}
	return s
}

// retryAfter parses Retry-After (seconds or an HTTP date), capped at 5
// minutes.
func retryAfter(v string, now time.Time) time.Duration {
	if v == "" {
		return 0
	}
	var d time.Duration
	if n, err := strconv.Atoi(strings.TrimSpace(v)); err == nil {
		d = time.Duration(n) * time.Second
	} else if t, err := http.ParseTime(v); err == nil {
		d = t.Sub(now)
	}
	return min(max(d, 0), 5*time.Minute)
}

// observe updates the clock offset from an answer. server_time (in the
// body) has microseconds and is preferred; the Date header has whole
// seconds, so it only corrects an offset that is more than a second off.
// The server reads its clock late in handling a request, so the local
// reference is the receive time less at most a quarter second (half the
// round trip for a quick request; a long-poll's clock is read at its end).
// The offset is clamped to ±MaxClockOffset, and a move of more than
// clockLogStep is logged.
func (c *Client) observe(serverTime *time.Time, date string, sent, recv time.Time) {
	ref := recv.Add(-min(recv.Sub(sent)/2, 250*time.Millisecond))
	var (
		sample  time.Duration
		precise bool
	)
	switch {
	case serverTime != nil && !serverTime.IsZero():
		sample, precise = serverTime.Sub(ref), true
	case date != "":
		t, err := http.ParseTime(date)
		if err != nil {
			return
		}
		sample = t.Add(500 * time.Millisecond).Sub(ref)
	default:
		return
	}
	clamped := sample > MaxClockOffset || sample < -MaxClockOffset
	sample = min(max(sample, -MaxClockOffset), MaxClockOffset)
	c.mu.Lock()
	defer c.mu.Unlock()
	diff := sample - c.offset
	if !precise && c.offsetKnown && diff < 1500*time.Millisecond && diff > -1500*time.Millisecond {
		return
	}
	switch {
	case clamped:
		c.log.Warn("server clock offset beyond the bound; clamped", "offset", sample, "previous", c.offset.Round(time.Millisecond))
	case !c.offsetKnown || diff > clockLogStep || diff < -clockLogStep:
		c.log.Info("server clock offset", "offset", sample.Round(time.Millisecond), "previous", c.offset.Round(time.Millisecond))
	}
	c.offset, c.offsetKnown = sample, true
}

// MaxClockOffset bounds the clock offset a Client adopts (see
// Client.ClockOffset): a server_time further from the node's clock moves
// the offset only this far, so that no one answer can throw the node's
// clock arbitrarily far.
const MaxClockOffset = time.Hour

// clockLogStep is how far the offset must move for observe to log it.
const clockLogStep = time.Second

// Register registers the node (POST /workers/register) with a
// provisioning token that carries node:register, signed by the identity's
// key. It fills req.PublicKey, and req.NodeID from the identity when
// empty. Both answers succeed: 201 for a new node, 200 when the node was
// registered already with this key (its token is rotated; the old one is
// revoked). The worker id and token are kept in the identity and, if it
// has a file, saved to it; if saving fails, Register returns the answer
// together with the error, and the Client goes on with the new token.
func (c *Client) Register(ctx context.Context, provisioningToken string, req wire.RegisterRequest) (*wire.RegisterResponse, error) {
	if provisioningToken == "" {
		return nil, errors.New("client: register needs a provisioning token")
	}
	if req.NodeID == "" {
		req.NodeID = c.id.NodeID()
	}
	if req.NodeID == "" {
		return nil, errors.New("client: register needs a node_id")
	}
	req.PublicKey = c.id.PublicKey()
	var out wire.RegisterResponse
	if _, err := c.do(ctx, wire.PathRegister, req, &out, callOpts{token: provisioningToken}); err != nil {
		return nil, err
	}
	if out.WorkerToken == "" || out.WorkerID == "" {
		return nil, &APIError{Status: http.StatusOK, Route: wire.PathRegister, Message: "the answer has no worker_id or worker_token"}
	}
	if err := c.id.setRegistration(req.NodeID, out.WorkerID, out.WorkerToken, out.TokenExpiresAt); err != nil {
		return &out, fmt.Errorf("client: registered as %s, but %w", out.WorkerID, err)
	}
	return &out, nil
}

// Start tells the server that the worker started (POST /workers/start):
// what it runs now, which replaces what the server recorded (a
// worker_updated receipt when it changed), and the jobs it holds
// (req.CurrentJobs; nil sends [], what a process that just started
// holds): the server ends at once every lease it thinks the worker holds
// on another job. The answer names the jobs ended and what awaits an
// operator's approval.
func (c *Client) Start(ctx context.Context, req wire.StartRequest) (*wire.StartResponse, error) {
	if req.CurrentJobs == nil {
		req.CurrentJobs = &[]string{}
	}
	var out wire.StartResponse
	if _, err := c.do(ctx, wire.PathStart, req, &out, callOpts{}); err != nil {
		return nil, err
	}
	return &out, nil
}

// Heartbeat reports liveness (POST /workers/heartbeat). Listed jobs whose
// lease the worker holds are extended; the answer names the jobs lost and
// the jobs whose cancel was requested.
func (c *Client) Heartbeat(ctx context.Context, req wire.HeartbeatRequest) (*wire.HeartbeatResponse, error) {
	if req.CurrentJobs == nil {
		req.CurrentJobs = []string{}
	}
	var out wire.HeartbeatResponse
	_, err := c.do(ctx, wire.PathHeartbeat, req, &out, callOpts{})
	if err != nil {
		return nil, err
	}
	return &out, nil
}

// Signals opens the control long-poll (POST /workers/signals): the server
// answers at once when a job of req.CurrentJobs has its cancel requested
// and is not in req.KnownCancels, when one is no longer held, or when the
// operator's drain request differs from req.Draining, and otherwise at
// the end of req.WaitSeconds. A ban or a retirement ends it with 403
// worker_banned. A server older than the route answers 404 not_found.
func (c *Client) Signals(ctx context.Context, req wire.SignalsRequest) (*wire.SignalsResponse, error) {
	if req.CurrentJobs == nil {
		req.CurrentJobs = []string{}
	}
	if req.KnownCancels == nil {
		req.KnownCancels = []string{}
	}
	var wait time.Duration
	if req.WaitSeconds != nil {
		wait = time.Duration(max(*req.WaitSeconds, 0)) * time.Second
	}
	var out wire.SignalsResponse
	if _, err := c.do(ctx, wire.PathSignals, req, &out, callOpts{wait: wait}); err != nil {
		return nil, err
	}
	return &out, nil
}

// Lease asks for jobs (POST /workers/jobs/lease), waiting up to
// req.WaitSeconds for one. With none, the answer's Leases is empty. A
// call that gives up (its retries spent, or ctx done) may still have
// leased a job the answer never brought; such a lease lapses at its
// accept_by without using an attempt.
//
// With req.Accept the server accepts each job it grants in the same
// request: a grant whose job.State is wire.JobStateRunning needs no
// Accept call. Check each grant's state all the same: a job the envelope
// refuses at accept, and every job from a server older than the field,
// comes back wire.JobStateLeased, to be accepted as usual. An accepting
// lease whose call gives up leaves its jobs running until their lease TTL
// runs out, which uses an attempt of each.
//
// Lease sets req.RequestID, when it is empty, to a random key, so that a
// retry after an answer lost in transit gets the first answer, the same
// grants, rather than leasing more (PROTOCOL.md "Retries").
func (c *Client) Lease(ctx context.Context, req wire.LeaseRequest) (*wire.LeaseResponse, error) {
	var out wire.LeaseResponse
	if err := c.key(&req.RequestID); err != nil {
		return nil, err
	}
	_, err := c.do(ctx, wire.PathLease, req, &out, callOpts{wait: time.Duration(max(req.WaitSeconds, 0)) * time.Second})
	if err != nil {
		return nil, err
	}
	if out.Leases == nil && out.LeaseToken != nil && out.Job != nil {
		// A v0.2-style answer with the grant at the top level only.
		g := wire.Grant{LeaseToken: *out.LeaseToken, Job: *out.Job}
		if out.LeaseID != nil {
			g.LeaseID = *out.LeaseID
		}
		if out.ExpiresAt != nil {
			g.ExpiresAt = *out.ExpiresAt
		}
		if out.AcceptBy != nil {
			g.AcceptBy = *out.AcceptBy
		}
		out.Leases = []wire.Grant{g}
	}
	return &out, nil
}

// Accept accepts a leased job (POST /workers/jobs/{id}/accept): it moves
// to running. Accepting again under the same lease is harmless.
func (c *Client) Accept(ctx context.Context, jobID string, req wire.TokenRequest) (*wire.AcceptResponse, error) {
	var out wire.AcceptResponse
	if _, err := c.do(ctx, wire.JobPath(jobID, "accept"), req, &out, callOpts{}); err != nil {
		return nil, err
	}
	return &out, nil
}

// Status reports a status event (POST /workers/jobs/{id}/status), which
// extends the lease; the answer says whether a cancel was requested.
//
// Status sets req.IdempotencyKey, when it is empty, to a random key, so
// that a retry after an answer lost in transit records the event once.
func (c *Client) Status(ctx context.Context, jobID string, req wire.StatusRequest) (*wire.StatusResponse, error) {
	var out wire.StatusResponse
	if err := c.key(&req.IdempotencyKey); err != nil {
		return nil, err
	}
	if _, err := c.do(ctx, wire.JobPath(jobID, "status"), req, &out, callOpts{}); err != nil {
		return nil, err
	}
	return &out, nil
}

// Logs sends log lines (POST /workers/jobs/{id}/logs). A seq the server
// has already stored counts as a duplicate, so sending a batch again is
// harmless. Logs sets req.IdempotencyKey, when it is empty, to a random
// key, so that a retry after an answer lost in transit gets the first
// answer's counts.
func (c *Client) Logs(ctx context.Context, jobID string, req wire.LogsRequest) (*wire.LogsResponse, error) {
	var out wire.LogsResponse
	if err := c.key(&req.IdempotencyKey); err != nil {
		return nil, err
	}
	if _, err := c.do(ctx, wire.JobPath(jobID, "logs"), req, &out, callOpts{}); err != nil {
		return nil, err
	}
	return &out, nil
}

// Artifact reports an artifact (POST /workers/jobs/{id}/artifacts). It
// sets req.IdempotencyKey, when it is empty, to a random key, so that a
// retry after an answer lost in transit gets the first artifact_id and
// receipt_id and records nothing twice. Set it yourself to make a report
// repeatable across calls (or restarts of the node).
func (c *Client) Artifact(ctx context.Context, jobID string, req wire.ArtifactRequest) (*wire.ArtifactResponse, error) {
	var out wire.ArtifactResponse
	if err := c.key(&req.IdempotencyKey); err != nil {
		return nil, err
	}
	if _, err := c.do(ctx, wire.JobPath(jobID, "artifacts"), req, &out, callOpts{}); err != nil {
		return nil, err
	}
	return &out, nil
}

// Complete reports success (POST /workers/jobs/{id}/complete). The server
// answers a repeated completion under the same lease token with its first
// answer, so retrying is safe.
func (c *Client) Complete(ctx context.Context, jobID string, req wire.CompleteRequest) (*wire.CompleteResponse, error) {
	var out wire.CompleteResponse
	if _, err := c.do(ctx, wire.JobPath(jobID, "complete"), req, &out, callOpts{}); err != nil {
		return nil, err
	}
	return &out, nil
}

// CompleteBatch completes several jobs in one request (POST
// /workers/jobs/complete): 1 to wire.MaxBatchComplete completions, each
// done as Complete would do it. The answer has one result per completion,
// in order; a refused completion is a result that is not OK
// (CompletionError turns it into the error Complete would return), not an
// error of the call. Retrying is safe: a completion repeated under its
// lease token answers as the first did. A body that is malformed as a
// whole (an empty batch, a completion without a lease token, a field over
// its limit) is a 400 for every completion; a server older than the route
// answers 404: send those completions with Complete.
func (c *Client) CompleteBatch(ctx context.Context, req wire.CompleteBatchRequest) (*wire.CompleteBatchResponse, error) {
	var out wire.CompleteBatchResponse
	if _, err := c.do(ctx, wire.PathCompleteBatch, req, &out, callOpts{}); err != nil {
		return nil, err
	}
	if len(out.Results) != len(req.Completions) {
		return nil, &APIError{Status: http.StatusOK, Route: wire.PathCompleteBatch,
			Message: fmt.Sprintf("the answer has %d results for %d completions", len(out.Results), len(req.Completions))}
	}
	for i, r := range out.Results {
		if r.JobID != req.Completions[i].JobID || r.OK && r.Completed == nil || !r.OK && r.Error == nil {
			return nil, &APIError{Status: http.StatusOK, Route: wire.PathCompleteBatch,
				Message: fmt.Sprintf("result %d does not answer the completion of job %s", i, req.Completions[i].JobID)}
		}
	}
	return &out, nil
}

// CompletionError is the error of a result of CompleteBatch: nil for one
// that is OK, else an *APIError with the status, code and message that
// Complete of that job alone would have returned (IsLeaseLost,
// IsRetryable and IsCode apply as they do to Complete's).
func CompletionError(r *wire.CompletionResult) error {
	if r.OK {
		return nil
	}
	ae := &APIError{Status: r.Status, Route: wire.PathCompleteBatch}
	if r.Error != nil {
		ae.Code, ae.Message, ae.ServerTime = r.Error.Code, r.Error.Message, r.Error.ServerTime
	}
	return ae
}

// Fail reports a failed attempt (POST /workers/jobs/{id}/fail). The
// server answers a repeat under the same lease token, with the same body,
// with its first answer, so retrying is safe (a server older than that
// answers the retry 409 lease_lost: the failure was recorded).
func (c *Client) Fail(ctx context.Context, jobID string, req wire.FailRequest) (*wire.FailResponse, error) {
	var out wire.FailResponse
	if _, err := c.do(ctx, wire.JobPath(jobID, "fail"), req, &out, callOpts{}); err != nil {
		return nil, err
	}
	return &out, nil
}

// Release hands a job back to the queue without using an attempt (POST
// /workers/jobs/{id}/release). As with Fail, a repeat under the same lease
// token gets the first answer, so retrying is safe.
func (c *Client) Release(ctx context.Context, jobID string, req wire.ReleaseRequest) (*wire.JobResponse, error) {
	var out wire.JobResponse
	if _, err := c.do(ctx, wire.JobPath(jobID, "release"), req, &out, callOpts{}); err != nil {
		return nil, err
	}
	return &out, nil
}

// Audit reports node audit events (POST /workers/audit); each becomes a
// receipt. It sets req.IdempotencyKey, when it is empty, to a random key,
// so that a retry after an answer lost in transit gets the first
// receipt_ids and mints nothing twice.
func (c *Client) Audit(ctx context.Context, req wire.AuditRequest) (*wire.AuditResponse, error) {
	var out wire.AuditResponse
	if err := c.key(&req.IdempotencyKey); err != nil {
		return nil, err
	}
	if _, err := c.do(ctx, wire.PathAudit, req, &out, callOpts{}); err != nil {
		return nil, err
	}
	return &out, nil
}
