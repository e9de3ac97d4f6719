package console

import (
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"errors"
	"io"
	"net/http"
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
	key     [32]byte
	seq     uint64 // the order of creation, which breaks ties in expiry
	token   string
	expires time.Time
	flashes []flash
}

// flash is a message shown once, on the next page the session renders
// (the outcome of an action, after its redirect).
type flash struct {
	Error bool
	Text  string
	// Secret is shown once and never stored elsewhere (a minted token).
	Secret string
}

// sessions is the bounded table of live sessions.
type sessions struct {
	mu   sync.Mutex
	m    map[[32]byte]*session
	seq  uint64
	max  int
	ttl  time.Duration
	now  func() time.Time
	rand io.Reader
}

func newSessions(max int, ttl time.Duration, now func() time.Time, r io.Reader) *sessions {
	if r == nil {
		r = rand.Reader
	}
	return &sessions{m: map[[32]byte]*session{}, max: max, ttl: ttl, now: now, rand: r}
}

// create starts a session for token and returns the cookie value.
func (ss *sessions) create(token string) (string, *session, error) {
	var id [32]byte
	if _, err := io.ReadFull(ss.rand, id[:]); err != nil {
		return "", nil, err
	}
	v := base64.RawURLEncoding.EncodeToString(id[:])
	s := &session{key: sha256.Sum256([]byte(v)), token: token, expires: ss.now().Add(ss.ttl)}
	ss.mu.Lock()
	defer ss.mu.Unlock()
	now := ss.now()
	for k, o := range ss.m {
		if !now.Before(o.expires) {
			delete(ss.m, k)
		}
	}
	for len(ss.m) >= ss.max {
		var first *session
		for _, o := range ss.m {
			if first == nil || o.expires.Before(first.expires) || (o.expires.Equal(first.expires) && o.seq < first.seq) {
				first = o
			}
		}
		delete(ss.m, first.key)
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
	r.Body = http.MaxBytesReader(w, r.Body, maxForm)
	token := strings.TrimSpace(r.PostFormValue("token"))
	refuse := func(msg string) {
		c.render(w, r, http.StatusUnauthorized, "signin", nil, &pageData{Title: "Sign in", Flashes: []flash{{Error: true, Text: msg}}})
	}
	if token == "" {
		refuse("Enter an operator token.")
		return
	}
	// Any operator route checks the token: 401 refuses it; 403 (a scope
	// it lacks) means the token is good.
	_, err := c.op(token).ListJobs(r.Context(), operator.JobQuery{Limit: 1})
	if errors.Is(err, operator.ErrBadToken) {
		refuse("That token was refused: it holds a space, a control character or a character outside ASCII, which no token does.")
		return
	}
	var ae *wire.Error
	if errors.As(err, &ae) && ae.Status == http.StatusUnauthorized {
		refuse("That token was refused: " + ae.Message)
		return
	}
	if err != nil && !(errors.As(err, &ae) && ae.Status == http.StatusForbidden) {
		c.renderError(w, r, status(err), explain(err))
		return
	}
	v, _, err := c.sessions.create(token)
	if err != nil {
		c.renderError(w, r, http.StatusInternalServerError, "Could not start a session.")
		return
	}
	http.SetCookie(w, c.cookie(r, v, int(c.cfg.SessionTTL/time.Second)))
	http.Redirect(w, r, c.base(r)+"/", http.StatusSeeOther)
}

func (c *Console) signOut(w http.ResponseWriter, r *http.Request) {
	if s := c.session(r); s != nil {
		c.sessions.end(s)
	}
	http.SetCookie(w, c.cookie(r, "", -1))
	http.Redirect(w, r, c.base(r)+"/signin", http.StatusSeeOther)
}
