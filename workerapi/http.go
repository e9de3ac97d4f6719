package workerapi

import (
	"context"
	"crypto/ed25519"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"mime"
	"net/http"
	"path"
	"strconv"
	"strings"
	"time"

	"github.com/nodelane/nodelane/credential"
	"github.com/nodelane/nodelane/replay"
	"github.com/nodelane/nodelane/workerapi/wire"
)

// A route is one method on one path pattern (net/http ServeMux syntax,
// relative to where the handler is mounted).
type route struct {
	method string
	path   string
	scope  credential.Scope
	// signed routes are worker routes: bearer + request signature + nonce.
	// Others are operator routes: bearer only.
	signed bool
	// public routes need no credential (the OpenAPI document).
	public bool
	handle func(ctx context.Context, c *call) (int, any, error)
}

// call is one request as it moves through the pipeline.
type call struct {
	r    *http.Request
	body []byte
	// principal is the authenticated caller; for worker routes its ID is
	// the worker id.
	principal *credential.Principal
	// credentialID names the credential used, for logs and receipts.
	credentialID string
	reqID        string
	// hooks are the events to deliver once the request has committed.
	hooks []hookEvent
	// then, when a handler sets it, runs after the request's transaction
	// committed and gives the answer: for work that must hold no
	// transaction, such as a long-poll wait or waiting for a proof.
	then func(ctx context.Context) (int, any, error)
	// cleanups run when the request ends, whatever its outcome.
	cleanups []func()
	// committed is set once a signed request's transaction committed: its
	// hooks are delivered even if then fails afterwards.
	committed bool
}

// after queues a hook event for delivery once the request commits.
func (c *call) after(f hookEvent) { c.hooks = append(c.hooks, f) }

// cleanup runs f when the request ends, whatever its outcome: for
// resources a handler takes for its then (a Notifier subscription), which
// must be released even if the transaction fails to commit and then never
// runs.
func (c *call) cleanup(f func()) { c.cleanups = append(c.cleanups, f) }

// pathID returns the {id} of the route's path.
func (c *call) pathID() string { return c.r.PathValue("id") }

// decode unmarshals the body into v. Unknown fields are ignored
// (PROTOCOL.md); malformed JSON, a wrong type, or trailing data is
// ErrInvalidRequest.
func (c *call) decode(v any) error {
	dec := json.NewDecoder(strings.NewReader(string(c.body)))
	if err := dec.Decode(v); err != nil {
		return fmt.Errorf("%w: %s", ErrInvalidRequest, jsonProblem(err))
	}
	if dec.More() {
		return fmt.Errorf("%w: trailing data after the JSON body", ErrInvalidRequest)
	}
	return nil
}

// jsonProblem describes a decoding error without echoing the body.
func jsonProblem(err error) string {
	var te *json.UnmarshalTypeError
	if errors.As(err, &te) {
		return fmt.Sprintf("field %q must be %s", te.Field, te.Type)
	}
	var se *json.SyntaxError
	if errors.As(err, &se) {
		return fmt.Sprintf("malformed JSON at byte %d", se.Offset)
	}
	if errors.Is(err, io.EOF) {
		return "empty body"
	}
	return "malformed JSON"
}

// mux builds a handler for routes: JSON 404 for unknown paths and JSON
// 405 (with Allow) for known paths and other methods.
func (s *Server) mux(routes []route) http.Handler {
	byPath := map[string][]route{}
	var order []string
	for _, rt := range routes {
		if _, ok := byPath[rt.path]; !ok {
			order = append(order, rt.path)
		}
		byPath[rt.path] = append(byPath[rt.path], rt)
	}
	m := http.NewServeMux()
	for _, p := range order {
		rts := byPath[p]
		m.HandleFunc(p, func(w http.ResponseWriter, r *http.Request) {
			for _, rt := range rts {
				if rt.method == r.Method {
					s.serve(w, r, rt)
					return
				}
			}
			var allow []string
			for _, rt := range rts {
				allow = append(allow, rt.method)
			}
			w.Header().Set("Allow", strings.Join(allow, ", "))
			s.fail(w, r, "", fmt.Errorf("%w: %s %s", ErrMethodNotAllowed, r.Method, p))
		})
	}
	m.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		s.fail(w, r, "", fmt.Errorf("%w: no route %s", ErrNotFound, r.URL.Path))
	})
	// ServeMux answers a path that is not clean (//, /./, /../, "*")
	// with a redirect or an empty 400, which are not JSON, and a signed
	// request cannot follow a redirect (the signature covers the path):
	// such a path is unknown.
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if !isCleanPath(r.URL.Path) {
			s.fail(w, r, "", fmt.Errorf("%w: no route %s", ErrNotFound, r.URL.Path))
			return
		}
		m.ServeHTTP(w, r)
	})
}

// isCleanPath reports whether ServeMux would route p as it is, without
// redirecting to its clean form.
func isCleanPath(p string) bool {
	if p == "" || p[0] != '/' {
		return false
	}
	c := path.Clean(p)
	if strings.HasSuffix(p, "/") && c != "/" {
		c += "/"
	}
	return c == p
}

// serve runs the pipeline of PROTOCOL.md for one request.
func (s *Server) serve(w http.ResponseWriter, r *http.Request, rt route) {
	start := time.Now()
	c := &call{r: r, reqID: requestID(r, s.cfg.Rand)}
	defer func() {
		for _, f := range c.cleanups {
			f()
		}
	}()
	w.Header().Set("X-Request-Id", c.reqID)
	code, out, err := s.run(r.Context(), c, rt)
	if err != nil {
		st := s.fail(w, r, c.reqID, err)
		if c.committed {
			s.hooks.emit(c.hooks)
		}
		s.observe(rt, c, st.http, st.code, start, err)
		return
	}
	if t, ok := out.(rawText); ok {
		s.writeText(w, code, t)
	} else {
		s.writeJSON(w, code, out)
	}
	s.hooks.emit(c.hooks)
	s.observe(rt, c, code, "", start, nil)
}

func (s *Server) run(ctx context.Context, c *call, rt route) (int, any, error) {
	if rt.public {
		return rt.handle(ctx, c)
	}
	// Framing: 415, 413. A request without a body (such as POST
	// /operator/jobs/{id}/cancel sent by curl -X POST) needs no media type.
	ct := c.r.Header.Get("Content-Type")
	if rt.method != http.MethodGet && (ct != "" || c.r.ContentLength != 0) {
		mt, _, err := mime.ParseMediaType(ct)
		if err != nil || mt != "application/json" {
			return 0, nil, ErrUnsupportedMediaType
		}
	}
	body, err := io.ReadAll(http.MaxBytesReader(nil, c.r.Body, s.cfg.BodyLimit))
	if err != nil {
		var mbe *http.MaxBytesError
		if errors.As(err, &mbe) {
			return 0, nil, fmt.Errorf("%w: the limit is %d bytes", ErrPayloadTooLarge, s.cfg.BodyLimit)
		}
		return 0, nil, fmt.Errorf("%w: reading the body: %v", ErrInvalidRequest, err)
	}
	c.body = body
	// Credential (401), then ban and scope (403).
	token, err := credential.BearerToken(c.r.Header)
	if err != nil {
		return 0, nil, err
	}
	if rt.path == wire.PathRegister {
		return s.register(ctx, c, token)
	}
	p, cred, err := s.issuer.Verify(ctx, token, rt.scope)
	if err != nil {
		return 0, nil, err
	}
	c.principal, c.credentialID = p, cred.ID
	if !rt.signed {
		return rt.handle(ctx, c)
	}
	if p.Kind != credential.KindNode || len(p.PublicKey) != ed25519.PublicKeySize {
		return 0, nil, fmt.Errorf("%w: the credential is not a registered node's", credential.ErrInsufficientScope)
	}
	return s.signed(ctx, c, p.PublicKey, rt.handle)
}

// signed checks the request's signature against pub, then runs handle in
// one transaction that also consumes the nonce. If the transaction fails
// after the signature verified, the nonce is consumed in a commit of its
// own: a verified request never runs twice, whatever its outcome.
func (s *Server) signed(ctx context.Context, c *call, pub ed25519.PublicKey, handle func(context.Context, *call) (int, any, error)) (int, any, error) {
	v, err := s.verifier.Check(c.r, c.body, pub)
	if err != nil {
		return 0, nil, err
	}
	nonceNode := v.KeyID
	var (
		code    int
		out     any
		refused bool // the nonce store refused the nonce: a replay or over quota
	)
	err = s.st.Tx.InTx(ctx, func(ctx context.Context) error {
		if err := s.verifier.Consume(ctx, nonceNode, v.Nonce, v.Expires); err != nil {
			refused = errors.Is(err, replay.ErrReplayedNonce) || errors.Is(err, replay.ErrQuota)
			return err
		}
		var err error
		code, out, err = handle(ctx, c)
		return err
	})
	if err != nil && !refused {
		// The transaction rolled the nonce back with the failed operation
		// (or the nonce store failed): consume it in a commit of its own,
		// so these bytes can never run later.
		if cerr := s.verifier.Consume(context.WithoutCancel(ctx), nonceNode, v.Nonce, v.Expires); cerr != nil && !errors.Is(cerr, replay.ErrReplayedNonce) {
			s.log.Warn("consuming the nonce of a failed request", "request_id", c.reqID, "err", cerr)
		}
	}
	if err != nil {
		return 0, nil, err
	}
	c.committed = true
	if c.then != nil {
		return c.then(ctx)
	}
	return code, out, nil
}

// fail writes err as PROTOCOL.md's error body and returns its status.
func (s *Server) fail(w http.ResponseWriter, r *http.Request, reqID string, err error) status {
	st := statusOf(err)
	msg := err.Error()
	if st.http == http.StatusServiceUnavailable {
		// Store errors may name internals; log them, answer plainly.
		s.log.Error("request failed", "request_id", reqID, "method", r.Method, "path", r.URL.Path, "err", err)
		msg = "a store cannot answer; nothing was accepted"
	}
	if st.http == http.StatusServiceUnavailable || st.http == http.StatusTooManyRequests {
		w.Header().Set("Retry-After", "1")
	}
	s.writeJSON(w, st.http, wire.ErrorBody{Error: wire.ErrorDetail{Code: st.code, Message: msg, ServerTime: s.now()}})
	return st
}

func (s *Server) writeJSON(w http.ResponseWriter, code int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Cache-Control", "no-store")
	w.WriteHeader(code)
	enc := json.NewEncoder(w)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(v); err != nil {
		s.log.Warn("writing a response", "err", err)
	}
}

func (s *Server) observe(rt route, c *call, code int, errCode string, start time.Time, err error) {
	d := time.Since(start)
	attrs := []any{"request_id", c.reqID, "method", rt.method, "route", rt.path, "status", code, "duration", d}
	if c.principal != nil {
		attrs = append(attrs, "principal", c.principal.ID, "credential", c.credentialID)
	}
	if err != nil {
		attrs = append(attrs, "code", errCode)
		s.log.Info("request refused", append(attrs, "reason", err.Error())...)
	} else {
		s.log.Debug("request", attrs...)
	}
	if s.cfg.Metrics != nil {
		s.cfg.Metrics.ObserveRequest(RequestInfo{Method: rt.method, Route: rt.path, Status: code, Code: errCode, Duration: d})
	}
}

// requestID keeps a caller's X-Request-Id when it is short and plain, and
// makes one otherwise.
func requestID(r *http.Request, rand io.Reader) string {
	if id := r.Header.Get("X-Request-Id"); id != "" && len(id) <= 64 && strings.Trim(id, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-_.") == "" {
		return id
	}
	var b [8]byte
	if _, err := io.ReadFull(rand, b[:]); err != nil {
		return strconv.FormatInt(time.Now().UnixNano(), 36)
	}
	return fmt.Sprintf("%x", b)
}
