package console

import (
	"cmp"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"errors"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/nodelane/nodelane/workerapi/operator"
	"github.com/nodelane/nodelane/workerapi/wire"
)

// A session is one sign-in. The operator's token lives only here, in the
// process's memory: the cookie carries a random id, and the table is
// keyed by its SHA-256, so neither the browser nor a look at the table
// yields the other. Signing out (or expiry) forgets the token at once.
type session struct {
	key [32]byte
	// cred is the SHA-256 of token: it names the credential, whose
	// sessions are counted (and ended) together.
	cred    [32]byte
	seq     uint64 // the order of creation: a credential's lowest is its oldest
	token   string
	scopes  []string // the operator scopes token holds, learned at sign-in
	expires time.Time
	flashes []flash
}

// holds reports whether s's token holds scope; "" is any operator scope,
// which every session's does.
func (s *session) holds(scope string) bool {
	return scope == "" || slices.Contains(s.scopes, scope)
}

// flash is a message shown once, on the next page the session renders
// (the outcome of an action, after its redirect).
type flash struct {
	Error bool
	Text  string
	// Secret is shown once and never stored elsewhere (a minted token).
	Secret string
}

// errSessionsFull is a sign-in refused because the table holds
// Config.MaxSessions live sessions, none of them the credential's own.
var errSessionsFull = errors.New("console: every session is taken")

// sessions is the bounded table of live sessions. It holds at most max
// sessions, and at most perCred of one credential: a credential's new
// session ends its own oldest, never another credential's, and a sign-in
// that would need another's place is refused (errSessionsFull).
type sessions struct {
	mu      sync.Mutex
	m       map[[32]byte]*session
	seq     uint64
	max     int
	perCred int
	ttl     time.Duration
	now     func() time.Time
	rand    io.Reader
}

func newSessions(max, perCred int, ttl time.Duration, now func() time.Time, r io.Reader) *sessions {
	if r == nil {
		r = rand.Reader
	}
	return &sessions{m: map[[32]byte]*session{}, max: max, perCred: perCred, ttl: ttl, now: now, rand: r}
}

// create starts a session for token, which holds scopes, and returns the
// cookie value.
func (ss *sessions) create(token string, scopes []string) (string, *session, error) {
	var id [32]byte
	if _, err := io.ReadFull(ss.rand, id[:]); err != nil {
		return "", nil, err
	}
	v := base64.RawURLEncoding.EncodeToString(id[:])
	s := &session{key: sha256.Sum256([]byte(v)), cred: sha256.Sum256([]byte(token)), token: token, scopes: scopes}
	ss.mu.Lock()
	defer ss.mu.Unlock()
	now := ss.now()
	s.expires = now.Add(ss.ttl)
	var own []*session
	for k, o := range ss.m {
		switch {
		case !now.Before(o.expires):
			delete(ss.m, k)
		case o.cred == s.cred:
			own = append(own, o)
		}
	}
	if len(own) >= ss.perCred {
		// The credential's oldest.
		first := slices.MinFunc(own, func(a, b *session) int { return cmp.Compare(a.seq, b.seq) })
		delete(ss.m, first.key)
	} else if len(ss.m) >= ss.max {
		return "", nil, errSessionsFull
	}
	ss.seq++
	s.seq = ss.seq
	ss.m[s.key] = s
	return v, s, nil
}

// get returns the live session of cookie value v, or nil.
func (ss *sessions) get(v string) *session {
	if len(v) != 43 {
		return nil
	}
	k := sha256.Sum256([]byte(v))
	ss.mu.Lock()
	defer ss.mu.Unlock()
	s := ss.m[k]
	if s == nil {
		return nil
	}
	if !ss.now().Before(s.expires) {
		delete(ss.m, k)
		return nil
	}
	return s
}

// end forgets a session.
func (ss *sessions) end(s *session) {
	ss.mu.Lock()
	defer ss.mu.Unlock()
	delete(ss.m, s.key)
}

// endCredential forgets every session of s's credential: the API refused
// its token (revoked or expired), so none of them can do anything.
func (ss *sessions) endCredential(s *session) {
	ss.mu.Lock()
	defer ss.mu.Unlock()
	for k, o := range ss.m {
		if o.cred == s.cred {
			delete(ss.m, k)
		}
	}
}

// push adds a flash to s.
func (ss *sessions) push(s *session, f flash) {
	ss.mu.Lock()
	defer ss.mu.Unlock()
	if len(s.flashes) < 10 {
		s.flashes = append(s.flashes, f)
	}
}

// pop takes s's flashes.
func (ss *sessions) pop(s *session) []flash {
	ss.mu.Lock()
	defer ss.mu.Unlock()
	f := s.flashes
	s.flashes = nil
	return f
}

func (c *Console) session(r *http.Request) *session {
	ck, err := r.Cookie(CookieName)
	if err != nil {
		return nil
	}
	return c.sessions.get(ck.Value)
}

func (c *Console) cookie(r *http.Request, value string, maxAge int) *http.Cookie {
	return &http.Cookie{
		Name:     CookieName,
		Value:    value,
		Path:     c.base(r) + "/",
		MaxAge:   maxAge,
		HttpOnly: true,
		Secure:   r.TLS != nil || c.cfg.SecureCookie,
		SameSite: http.SameSiteStrictMode,
	}
}

func (c *Console) signInPage(w http.ResponseWriter, r *http.Request) {
	if c.session(r) != nil {
		http.Redirect(w, r, c.base(r)+"/", http.StatusSeeOther)
		return
	}
	c.render(w, r, http.StatusOK, "signin", nil, &pageData{Title: "Sign in"})
}

// maxForm bounds the body of a form the console reads (an export to
// verify excepted).
const maxForm = 64 << 10

func (c *Console) signIn(w http.ResponseWriter, r *http.Request) {
	refuse := func(code int, msg string) {
		c.render(w, r, code, "signin", nil, &pageData{Title: "Sign in", Flashes: []flash{{Error: true, Text: msg}}})
	}
	if wait, ok := c.signIns.allow(c.cfg.ClientAddr(r)); !ok {
		secs := int((wait + time.Second - 1) / time.Second)
		w.Header().Set("Retry-After", strconv.Itoa(secs))
		refuse(http.StatusTooManyRequests, fmt.Sprintf("Too many sign-ins from your address: try again in %d s.", secs))
		return
	}
	r.Body = http.MaxBytesReader(w, r.Body, maxForm)
	token := strings.TrimSpace(r.PostFormValue("token"))
	if token == "" {
		refuse(http.StatusUnauthorized, "Enter an operator token.")
		return
	}
	scopes, err := c.scopesOf(withBrowser(r, nil).Context(), token)
	if errors.Is(err, operator.ErrBadToken) {
		refuse(http.StatusUnauthorized, "That token was refused: it holds a space, a control character or a character outside ASCII, which no token does.")
		return
	}
	var ae *wire.Error
	if errors.As(err, &ae) && ae.Status == http.StatusUnauthorized {
		refuse(http.StatusUnauthorized, "That token was refused: "+ae.Message)
		return
	}
	if err != nil {
		c.renderError(w, r, status(err), explain(err))
		return
	}
	if len(scopes) == 0 {
		refuse(http.StatusForbidden, "That token holds no operator scope (a worker's or a provisioning token is one): the console needs one of "+
			"operator:jobs, operator:workers, operator:credentials, operator:envelope or operator:receipts.")
		return
	}
	v, _, err := c.sessions.create(token, scopes)
	if errors.Is(err, errSessionsFull) {
		refuse(http.StatusServiceUnavailable, "Every session of the console is taken: try again when one ends.")
		return
	}
	if err != nil {
		c.renderError(w, r, http.StatusInternalServerError, "Could not start a session.")
		return
	}
	http.SetCookie(w, c.cookie(r, v, int(c.cfg.SessionTTL/time.Second)))
	http.Redirect(w, r, c.base(r)+"/", http.StatusSeeOther)
}

// probes are the operator scopes, each with the cheapest read of the API
// that needs it.
var probes = []struct {
	scope string
	read  func(ctx context.Context, api *operator.Client) error
}{
	{"operator:jobs", func(ctx context.Context, api *operator.Client) error {
		_, err := api.ListJobs(ctx, operator.JobQuery{Limit: 1})
		return err
	}},
	{"operator:workers", func(ctx context.Context, api *operator.Client) error {
		_, err := api.ListWorkers(ctx, operator.WorkerQuery{Limit: 1})
		return err
	}},
	{"operator:credentials", func(ctx context.Context, api *operator.Client) error {
		_, err := api.ListCredentials(ctx, operator.CredentialQuery{Limit: 1})
		return err
	}},
	{"operator:envelope", func(ctx context.Context, api *operator.Client) error {
		_, err := api.Envelope(ctx)
		return err
	}},
	{"operator:receipts", func(ctx context.Context, api *operator.Client) error {
		_, err := api.Checkpoint(ctx)
		return err
	}},
}

// scopesOf asks the API which operator scopes token holds: one read per
// scope, which the API answers 403 if the token lacks it. A 401 (a token
// unknown, revoked, expired or spent) is returned as the *wire.Error; a
// worker's or a provisioning token holds none.
func (c *Console) scopesOf(ctx context.Context, token string) ([]string, error) {
	api := c.op(token)
	var held []string
	for _, p := range probes {
		err := p.read(ctx, api)
		var ae *wire.Error
		switch {
		case err == nil:
		case errors.As(err, &ae) && ae.Status == http.StatusUnauthorized:
			return nil, err
		case errors.As(err, &ae) && ae.Status == http.StatusForbidden:
			continue
		case errors.As(err, &ae) && ae.Status < 500:
			// Past authentication and the scope check: the read's own
			// refusal (none is expected).
		default:
			return nil, err
		}
		held = append(held, p.scope)
	}
	return held, nil
}

func (c *Console) signOut(w http.ResponseWriter, r *http.Request) {
	if s := c.session(r); s != nil {
		c.sessions.end(s)
	}
	http.SetCookie(w, c.cookie(r, "", -1))
	http.Redirect(w, r, c.base(r)+"/signin", http.StatusSeeOther)
}
