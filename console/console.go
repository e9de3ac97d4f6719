// Package console is nodelane's web console: an http.Handler a host
// mounts under any prefix (the example server mounts it at /console/)
// that shows the control plane to an operator and lets them act on it.
//
// The console holds no logic of its own. Every page and every action is
// one or more in-process requests to the operator API handler the host
// passes in (Config.API, workerapi's Server.OperatorHandler), made with
// the operator client (workerapi/operator, over its HandlerTransport) and
// carrying the signed-in operator's bearer token, so each is
// authenticated, scope-checked, validated and receipted exactly as the
// API is; a refusal is shown as the API's message. (An artifact's bytes,
// which may be gigabytes, are the one read made without the client,
// whose in-process transport buffers an answer: the download calls
// Config.API itself with the same token and streams its answer.) Each
// call carries the browser's address, so the API logs it, and a 401 of
// the API (a token revoked or expired) ends every session of the token.
// It imports the standard library, golang.org/x, workerapi/operator,
// workerapi/wire and receipts only.
//
// Only a token with an operator scope signs in: the console learns its
// scopes from the API at sign-in, and each page checks the one it
// needs. Sign-ins are rate-limited per client address, and sessions are
// bounded per credential and in all without one credential ever ending
// another's.
//
// Pages are server-rendered with html/template and readable without
// JavaScript: lists newest first, times relative with the exact time on
// hover, the overview's charts as inline SVG drawn on the server. One
// small embedded script (no framework, no build step) opens a job's
// timeline and logs in a viewer that renders only the lines in view and
// follows the job live, and puts the dispatch form's cursor where its
// payload stops being JSON.
// Every response carries a strict Content-Security-Policy, every POST
// goes through net/http's CrossOriginProtection, and the session cookie
// is HttpOnly, SameSite=Strict and, over TLS, Secure.
package console

import (
	"context"
	"embed"
	"errors"
	"fmt"
	"html/template"
	"io"
	"io/fs"
	"net"
	"net/http"
	"net/url"
	"strings"
	"time"

	"github.com/nodelane/nodelane/workerapi/operator"
	"github.com/nodelane/nodelane/workerapi/wire"
)

//go:embed templates/*.html
var templateFS embed.FS

//go:embed static
var staticFS embed.FS

// ErrConfig is wrapped by the error New returns for a missing or invalid
// setting.
var ErrConfig = errors.New("console: invalid configuration")

// Defaults of Config.
const (
	// DefaultSessionTTL is how long a sign-in lasts.
	DefaultSessionTTL = 12 * time.Hour
	// DefaultMaxSessions bounds the sessions held in memory.
	DefaultMaxSessions = 1000
	// DefaultMaxSessionsPerCredential bounds the sessions of one
	// credential.
	DefaultMaxSessionsPerCredential = 8
	// DefaultSignInBurst is how many sign-ins one client address may
	// make at once.
	DefaultSignInBurst = 10
	// DefaultSignInInterval is how often one client address gains
	// another sign-in, past its burst.
	DefaultSignInInterval = 6 * time.Second
	// DefaultMaxExportBytes bounds the body of POST /receipts/verify.
	DefaultMaxExportBytes = 256 << 20
)

// maxSignInAddrs bounds the client addresses whose sign-ins are counted.
const maxSignInAddrs = 10000

// ContentSecurityPolicy is the Content-Security-Policy of every response.
const ContentSecurityPolicy = "default-src 'none'; style-src 'self'; script-src 'self'; img-src 'self'; connect-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'"

// CookieName is the name of the session cookie.
const CookieName = "nodelane_console"

// Config configures a Console.
type Config struct {
	// API serves the operator routes (paths starting /operator/), as
	// workerapi's Server.OperatorHandler does. Required.
	API http.Handler
	// VerifierKey is the receipt log's note verifier key (workerapi's
	// Server.ReceiptVerifierKey), against which the console verifies
	// checkpoints and receipts. Required.
	VerifierKey string
	// Origin is the receipt log's checkpoint origin. Defaults to the
	// name of VerifierKey, which workerapi requires to be its origin.
	Origin string
	// SessionTTL is how long a sign-in lasts. Defaults to DefaultSessionTTL.
	SessionTTL time.Duration
	// MaxSessions bounds the sessions held; a sign-in beyond it is
	// refused (503), rather than end another credential's session.
	// Defaults to DefaultMaxSessions.
	MaxSessions int
	// MaxSessionsPerCredential bounds the sessions of one credential (one
	// token); its sign-in beyond it ends its own oldest session. Defaults
	// to DefaultMaxSessionsPerCredential.
	MaxSessionsPerCredential int
	// SignInBurst and SignInInterval are the token bucket of sign-ins per
	// client address: SignInBurst at once, then one each SignInInterval;
	// a sign-in beyond it is refused 429 with Retry-After. Default to
	// DefaultSignInBurst and DefaultSignInInterval.
	SignInBurst    int
	SignInInterval time.Duration
	// ClientAddr is the address of the client of r that sign-ins are
	// counted by: workerapi's Server.ClientAddr, for a console behind the
	// same trusted proxies as the API. Defaults to the peer's IP address.
	ClientAddr func(r *http.Request) string
	// MaxExportBytes bounds the body of an export sent to POST
	// /receipts/verify, which is read as it arrives: it bounds the time
	// a verification takes, not the memory. Defaults to
	// DefaultMaxExportBytes.
	MaxExportBytes int64
	// SecureCookie marks the session cookie Secure even on a request that
	// did not arrive over TLS (a console behind a TLS-terminating proxy).
	// The cookie is Secure on every TLS request in any case.
	SecureCookie bool
	// PublicURL is the URL browsers reach the console at, such as
	// https://cp.example.com/nodelane/console, for a console behind a
	// proxy that rewrites Host or strips a path prefix: links, redirects
	// and the cookie's path then start with its path, the cookie is
	// Secure when it is https, and its origin passes the cross-origin
	// check of browsers that send no Sec-Fetch-Site. An absolute http(s)
	// URL without query, fragment or user information. Defaults to "":
	// the prefix is the one the host's http.StripPrefix removed.
	PublicURL string
	// Now is the clock. Defaults to time.Now.
	Now func() time.Time
	// Rand is the source of session ids. Defaults to crypto/rand.
	Rand io.Reader
}

// Console is the web console. It is an http.Handler.
type Console struct {
	cfg Config
	// basePath is PublicURL's path without its trailing "/", when set.
	basePath *string
	// cop checks that a state-changing request is same-origin; it also
	// trusts PublicURL's origin, when set.
	cop      *http.CrossOriginProtection
	sessions *sessions
	signIns  *limiter
	pages    map[string]*template.Template
	handler  http.Handler
	// api calls cfg.API in process, with no token: each page calls it
	// through a copy with its operator's (op).
	api *operator.Client
}

// New returns a Console over cfg.API.
func New(cfg Config) (*Console, error) {
	if cfg.API == nil {
		return nil, fmt.Errorf("%w: API is required", ErrConfig)
	}
	if cfg.VerifierKey == "" {
		return nil, fmt.Errorf("%w: VerifierKey is required", ErrConfig)
	}
	if cfg.Origin == "" {
		name, _, ok := strings.Cut(cfg.VerifierKey, "+")
		if !ok || name == "" {
			return nil, fmt.Errorf("%w: VerifierKey is not a note verifier key", ErrConfig)
		}
		cfg.Origin = name
	}
	if cfg.SessionTTL == 0 {
		cfg.SessionTTL = DefaultSessionTTL
	}
	if cfg.SessionTTL < 0 {
		return nil, fmt.Errorf("%w: SessionTTL %v is negative", ErrConfig, cfg.SessionTTL)
	}
	if cfg.MaxSessions == 0 {
		cfg.MaxSessions = DefaultMaxSessions
	}
	if cfg.MaxSessions < 0 {
		return nil, fmt.Errorf("%w: MaxSessions %d is negative", ErrConfig, cfg.MaxSessions)
	}
	if cfg.MaxSessionsPerCredential == 0 {
		cfg.MaxSessionsPerCredential = DefaultMaxSessionsPerCredential
	}
	if cfg.MaxSessionsPerCredential < 0 {
		return nil, fmt.Errorf("%w: MaxSessionsPerCredential %d is negative", ErrConfig, cfg.MaxSessionsPerCredential)
	}
	if cfg.SignInBurst == 0 {
		cfg.SignInBurst = DefaultSignInBurst
	}
	if cfg.SignInInterval == 0 {
		cfg.SignInInterval = DefaultSignInInterval
	}
	if cfg.SignInBurst < 0 || cfg.SignInInterval < 0 {
		return nil, fmt.Errorf("%w: SignInBurst %d or SignInInterval %v is negative", ErrConfig, cfg.SignInBurst, cfg.SignInInterval)
	}
	if cfg.ClientAddr == nil {
		cfg.ClientAddr = peerAddr
	}
	if cfg.MaxExportBytes == 0 {
		cfg.MaxExportBytes = DefaultMaxExportBytes
	}
	if cfg.MaxExportBytes < 0 {
		return nil, fmt.Errorf("%w: MaxExportBytes %d is negative", ErrConfig, cfg.MaxExportBytes)
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	c := &Console{
		cfg:      cfg,
		sessions: newSessions(cfg.MaxSessions, cfg.MaxSessionsPerCredential, cfg.SessionTTL, cfg.Now, cfg.Rand),
		signIns:  newLimiter(cfg.SignInInterval, cfg.SignInBurst, maxSignInAddrs, cfg.Now),
		cop:      http.NewCrossOriginProtection(),
	}
	if cfg.PublicURL != "" {
		u, err := url.Parse(cfg.PublicURL)
		if err != nil || u.User != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" || u.Opaque != "" ||
			u.RawQuery != "" || u.ForceQuery || u.Fragment != "" {
			// Not repeated: a URL with user information may hold a password.
			return nil, fmt.Errorf("%w: PublicURL is not an absolute http(s) URL without query, fragment or user information", ErrConfig)
		}
		p := strings.TrimRight(u.EscapedPath(), "/")
		c.basePath = &p
		if err := c.cop.AddTrustedOrigin(u.Scheme + "://" + u.Host); err != nil {
			return nil, fmt.Errorf("%w: PublicURL's origin: %w", ErrConfig, err)
		}
		c.cfg.SecureCookie = c.cfg.SecureCookie || u.Scheme == "https"
	}
	api, err := operator.New("http://console", "", &operator.Config{AllowInsecureHTTP: true, HTTPClient: &http.Client{
		Transport:     &apiTransport{c: c},
		CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse },
	}})
	if err != nil {
		return nil, fmt.Errorf("console: the operator client: %w", err)
	}
	c.api = api
	pages, err := parsePages(cfg.Now)
	if err != nil {
		return nil, err
	}
	c.pages = pages
	c.handler = c.routes()
	return c, nil
}

// ServeHTTP serves the console.
func (c *Console) ServeHTTP(w http.ResponseWriter, r *http.Request) { c.handler.ServeHTTP(w, r) }

// securityHeaders sets the headers every response carries.
func securityHeaders(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		hd := w.Header()
		hd.Set("Content-Security-Policy", ContentSecurityPolicy)
		hd.Set("X-Content-Type-Options", "nosniff")
		hd.Set("Referrer-Policy", "no-referrer")
		hd.Set("X-Frame-Options", "DENY")
		h.ServeHTTP(w, r)
	})
}

func (c *Console) routes() http.Handler {
	m := http.NewServeMux()
	static, _ := fs.Sub(staticFS, "static")
	files := http.StripPrefix("/static/", http.FileServerFS(static))
	m.Handle("GET /static/", http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Cache-Control", "public, max-age=3600")
		files.ServeHTTP(w, r)
	}))
	m.HandleFunc("GET /signin", c.signInPage)
	m.HandleFunc("POST /signin", c.signIn)
	m.HandleFunc("POST /signout", c.signOut)

	// Each page needs a scope of the session's token ("": any).
	page := func(pattern, scope string, h func(w http.ResponseWriter, r *http.Request, s *session)) {
		m.Handle(pattern, c.authed(scope, h))
	}
	const (
		jobs        = "operator:jobs"
		workers     = "operator:workers"
		credentials = "operator:credentials"
		envelope    = "operator:envelope"
		receipts    = "operator:receipts"
	)
	page("GET /{$}", "", c.overview)
	page("GET /workers", workers, c.workers)
	page("GET /workers/{id}", workers, c.worker)
	page("POST /workers/{id}/{action}", workers, c.workerAction)
	page("GET /jobs", jobs, c.jobs)
	page("POST /jobs", jobs, c.dispatch)
	page("GET /jobs/{id}", jobs, c.job)
	page("GET /jobs/{id}/events", jobs, c.jobEvents)
	page("POST /jobs/{id}/cancel", jobs, c.cancel)
	page("POST /jobs/{id}/retry", jobs, c.retry)
	page("GET /artifacts/{id}/download", jobs, c.artifactDownload)
	page("GET /envelope", envelope, c.envelope)
	page("POST /envelope/{action}", envelope, c.envelopeAction)
	page("GET /receipts", receipts, c.receiptsPage)
	page("GET /receipts/{id}", receipts, c.receipt)
	page("POST /receipts/verify", receipts, c.verifyExport)
	page("GET /credentials", credentials, c.credentials)
	page("POST /credentials", credentials, c.mint)
	page("POST /credentials/{id}/revoke", credentials, c.revoke)
	m.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		c.renderError(w, r, http.StatusNotFound, "There is no page "+r.URL.Path+".")
	})
	c.cop.SetDenyHandler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		c.renderError(w, r, http.StatusForbidden, "Refused: a cross-origin request may not change anything.")
	}))
	return securityHeaders(c.cop.Handler(m))
}

// base is the path prefix the console is reached under, "" at the root:
// PublicURL's path, or else the part of the request-target the host's
// http.StripPrefix removed.
func (c *Console) base(r *http.Request) string {
	if c.basePath != nil {
		return *c.basePath
	}
	target := r.RequestURI
	if i := strings.IndexByte(target, '?'); i >= 0 {
		target = target[:i]
	}
	if p := r.URL.EscapedPath(); strings.HasSuffix(target, p) && strings.HasPrefix(target, "/") {
		return strings.TrimRight(target[:len(target)-len(p)], "/")
	}
	return ""
}

// authed runs h for a signed-in request whose token holds scope (""
// for any operator scope); one not signed in is sent to sign in, one
// without the scope refused 403 before anything is read or asked of the
// API. h's calls to the API carry the browser's address (withBrowser).
func (c *Console) authed(scope string, h func(w http.ResponseWriter, r *http.Request, s *session)) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		s := c.session(r)
		if s == nil {
			if r.Method == http.MethodGet && !strings.HasSuffix(r.URL.Path, "/events") {
				http.Redirect(w, r, c.base(r)+"/signin", http.StatusSeeOther)
				return
			}
			c.renderError(w, r, http.StatusUnauthorized, "You are not signed in (or your session ended). Sign in again.")
			return
		}
		w.Header().Set("Cache-Control", "no-store")
		if !s.holds(scope) {
			c.renderError(w, r, http.StatusForbidden, "Refused (403): this page needs "+scope+
				", which your token does not hold. Your token does not allow this.")
			return
		}
		h(w, withBrowser(r, s), s)
	})
}

// browserKey is the context key of the *browser a request to the API is
// made for.
type browserKey struct{}

// browser is the console request an API call is made for.
type browser struct {
	// remoteAddr and forwarded are the request's RemoteAddr and
	// X-Forwarded-For, which the API's call carries, so that the API
	// finds (and logs) the browser's address with its own trusted-proxy
	// rule.
	remoteAddr string
	forwarded  []string
	// s is the session, when signed in: a 401 of the API ends it.
	s *session
}

// withBrowser returns r with a context that makes the API calls made
// with it carry r's address and, on a 401, end s's credential's sessions.
func withBrowser(r *http.Request, s *session) *http.Request {
	b := &browser{remoteAddr: r.RemoteAddr, forwarded: r.Header.Values("X-Forwarded-For"), s: s}
	return r.WithContext(context.WithValue(r.Context(), browserKey{}, b))
}

// apiTransport serves the operator client's calls with Config.API in
// process (an operator.HandlerTransport), each as its browser's
// (withBrowser): the API then logs the browser's address rather than the
// console, and a 401, the token revoked or expired since sign-in, ends
// every session of the token.
type apiTransport struct{ c *Console }

func (t *apiTransport) RoundTrip(req *http.Request) (*http.Response, error) {
	ht := &operator.HandlerTransport{Handler: t.c.cfg.API, RemoteAddr: "console"}
	b, _ := req.Context().Value(browserKey{}).(*browser)
	if b != nil {
		ht.RemoteAddr = b.remoteAddr
		if len(b.forwarded) > 0 {
			req = req.Clone(req.Context())
			req.Header["X-Forwarded-For"] = b.forwarded
		}
	}
	resp, err := ht.RoundTrip(req)
	if err == nil && resp.StatusCode == http.StatusUnauthorized && b != nil && b.s != nil {
		t.c.sessions.endCredential(b.s)
	}
	return resp, err
}

// peerAddr is the IP address of r's peer (Config.ClientAddr's default).
func peerAddr(r *http.Request) string {
	if host, _, err := net.SplitHostPort(r.RemoteAddr); err == nil {
		return host
	}
	return r.RemoteAddr
}

// op returns the operator client acting with token, the signed-in
// operator's: a refusal of the API is a *wire.Error.
func (c *Console) op(token string) *operator.Client { return c.api.WithToken(token) }

// requestError is a page request the console refuses before it calls
// the API: it answers 400 with the message.
type requestError struct{ msg string }

func (e *requestError) Error() string { return e.msg }

// explain turns an error of the API into what the operator reads.
func explain(err error) string {
	var re *requestError
	if errors.As(err, &re) {
		return "Bad request: " + re.msg + "."
	}
	var ae *wire.Error
	if errors.As(err, &ae) {
		msg := ae.Message
		if !strings.HasSuffix(msg, ".") {
			msg += "."
		}
		switch ae.Status {
		case http.StatusForbidden:
			return "Refused (403 " + ae.Code + "): " + msg + " Your token does not allow this."
		case http.StatusUnauthorized:
			return "Refused (401 " + ae.Code + "): " + msg
		}
		return fmt.Sprintf("The control plane answered %d %s: %s", ae.Status, ae.Code, msg)
	}
	return "Error: " + err.Error()
}

// status is the HTTP status a page answers for err.
func status(err error) int {
	var ae *wire.Error
	if errors.As(err, &ae) && ae.Status >= 400 && ae.Status < 600 {
		return ae.Status
	}
	var re *requestError
	if errors.As(err, &re) {
		return http.StatusBadRequest
	}
	return http.StatusBadGateway
}
