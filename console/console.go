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
// Config.API itself with the same token and streams its answer.) It
// imports the standard library, workerapi/operator, workerapi/wire and
// receipts only.
//
// Pages are server-rendered with html/template and readable without
// JavaScript; one small embedded script makes a job's logs follow live.
// Every response carries a strict Content-Security-Policy, every POST
// goes through net/http's CrossOriginProtection, and the session cookie
// is HttpOnly, SameSite=Strict and, over TLS, Secure.
package console

import (
	"embed"
	"errors"
	"fmt"
	"html/template"
	"io"
	"io/fs"
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
)

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
	// MaxSessions bounds the sessions held; signing in beyond it ends the
	// session that would expire first. Defaults to DefaultMaxSessions.
	MaxSessions int
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
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	c := &Console{cfg: cfg, sessions: newSessions(cfg.MaxSessions, cfg.SessionTTL, cfg.Now, cfg.Rand), cop: http.NewCrossOriginProtection()}
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
	api, err := operator.New("http://console", "", &operator.Config{HTTPClient: &http.Client{
		Transport:     &operator.HandlerTransport{Handler: cfg.API, RemoteAddr: "console"},
		CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse },
	}})
	if err != nil {
		return nil, fmt.Errorf("console: the operator client: %w", err)
	}
	c.api = api
	pages, err := parsePages()
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

	page := func(pattern string, h func(w http.ResponseWriter, r *http.Request, s *session)) {
		m.Handle(pattern, c.authed(h))
	}
	page("GET /{$}", c.overview)
	page("GET /workers", c.workers)
	page("GET /workers/{id}", c.worker)
	page("POST /workers/{id}/{action}", c.workerAction)
	page("GET /jobs", c.jobs)
	page("POST /jobs", c.dispatch)
	page("GET /jobs/{id}", c.job)
	page("GET /jobs/{id}/events", c.jobEvents)
	page("POST /jobs/{id}/cancel", c.cancel)
	page("GET /artifacts/{id}/download", c.artifactDownload)
	page("GET /envelope", c.envelope)
	page("POST /envelope/{action}", c.envelopeAction)
	page("GET /receipts", c.receiptsPage)
	page("GET /receipts/{id}", c.receipt)
	page("POST /receipts/verify", c.verifyExport)
	page("GET /credentials", c.credentials)
	page("POST /credentials", c.mint)
	page("POST /credentials/{id}/revoke", c.revoke)
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

// authed runs h for a signed-in request; any other is sent to sign in.
func (c *Console) authed(h func(w http.ResponseWriter, r *http.Request, s *session)) http.Handler {
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
		h(w, r, s)
	})
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
