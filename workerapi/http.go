package workerapi

import (
	"bytes"
	"context"
	"crypto/ed25519"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"mime"
	"net/http"
	"net/url"
	"path"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/nodelane/nodelane/credential"
	"github.com/nodelane/nodelane/lease"
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
	// query names the query parameters a GET route accepts: any other
	// answers 400 invalid_request (checkQuery). Nil accepts none.
	query []string
	// stream routes take a body that is not JSON and may be far larger
	// than Config.BodyLimit (an artifact's part): the pipeline reads none
	// of it. The signature is verified over the headers, and the
	// handler's then streams the body through the Content-Digest check
	// (call.digest), after the nonce was consumed.
	stream bool
	// prepare, when set, runs on a signed route once the signature
	// verified and before the transaction: for work that must hold no
	// transaction, such as checking an upload's stored bytes. If it fails,
	// the nonce is consumed all the same.
	prepare func(ctx context.Context, c *call) error
	handle  func(ctx context.Context, c *call) (int, any, error)
}

// call is one request as it moves through the pipeline.
type call struct {
	r    *http.Request
	w    http.ResponseWriter
	body []byte
	// principal is the authenticated caller; for worker routes its ID is
	// the worker id.
	principal *credential.Principal
	// credentialID names the credential used, for logs and receipts.
	credentialID string
	// bearer is the bearer token of the request: a secret, never logged
	// or stored; a token renewal's answer is remembered under it.
	bearer string
	reqID  string
	// hooks are the events to deliver once the request has committed.
	hooks []hookEvent
	// notes run once the request has committed, on its goroutine: the
	// lifecycle logs and event counts of its changes (observe.go).
	notes []func()
	// jobIDs are the jobs the request granted, for its log line.
	jobIDs []string
	// then, when a handler sets it, runs after the request's transaction
	// committed and gives the answer: for work that must hold no
	// transaction, such as a long-poll wait or waiting for a proof.
	then func(ctx context.Context) (int, any, error)
	// cleanups run when the request ends, whatever its outcome.
	cleanups []func()
	// committed is set once a signed request's transaction committed: its
	// hooks are delivered even if then fails afterwards.
	committed bool
	// keyed is set when the request names its first answer (answers.go).
	keyed *keyed
	// digest checks the body of a stream route as it streams; slot is set
	// once the request holds one of its worker's upload slots.
	digest *replay.BodyDigest
	slot   bool
	// finished is the upload an artifact report finishes, checked by the
	// route's prepare.
	finished *upload
	// dropBody gives back the body's share of Config.Shares.BodyBytes;
	// polling is set once the request holds one of its node's long-polls
	// (shares.go).
	dropBody func(keep int64)
	polling  bool
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

// decode unmarshals the body into v and checks it against the limits of
// wire/limits.go (checkLimits). Unknown fields are ignored (PROTOCOL.md);
// malformed JSON, a wrong type, trailing data of any kind after the JSON
// value (a stray "}" or "]" included), or a field over its limit is
// ErrInvalidRequest, and so is a character its field may not hold
// (checkChars).
func (c *call) decode(v any) error {
	dec := json.NewDecoder(bytes.NewReader(c.body))
	if err := dec.Decode(v); err != nil {
		return fmt.Errorf("%w: %s", ErrInvalidRequest, jsonProblem(err))
	}
	// dec.More reports false before a "}" or "]", so it cannot tell a
	// body that ends from one with a stray closing bracket: the rest of
	// the body must be JSON whitespace only.
	if rest := c.body[dec.InputOffset():]; !jsonSpace(rest) {
		return fmt.Errorf("%w: trailing data after the JSON value at byte %d", ErrInvalidRequest, dec.InputOffset())
	}
	return firstError(checkLimits(v), checkChars(v))
}

// jsonSpace reports whether b holds only JSON whitespace (RFC 8259 §2).
func jsonSpace(b []byte) bool {
	for _, c := range b {
		if c != ' ' && c != '\t' && c != '\n' && c != '\r' {
			return false
		}
	}
	return true
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
	c := &call{r: r, w: w, reqID: requestID(r, s.cfg.Rand)}
	defer func() {
		for _, f := range c.cleanups {
			f()
		}
	}()
	w.Header().Set("X-Request-Id", c.reqID)
	code, out, err := s.run(context.WithValue(r.Context(), callKey{}, c), c, rt)
	if err != nil {
		st := s.fail(w, r, c.reqID, err)
		if c.committed {
			s.hooks.emit(c.hooks)
			c.runNotes()
		}
		s.observe(rt, c, st.http, st.code, start, err)
		return
	}
	if t, ok := out.(rawText); ok {
		s.writeText(w, code, t)
	} else if _, ok := out.(written); ok {
		// The handler wrote the response.
	} else {
		s.writeJSON(w, code, out)
	}
	s.hooks.emit(c.hooks)
	c.runNotes()
	s.observe(rt, c, code, "", start, nil)
}

// runNotes runs the notes of a committed request.
func (c *call) runNotes() {
	for _, f := range c.notes {
		f()
	}
}

// run is the pipeline of PROTOCOL.md §3. Every check that needs no body
// runs before a byte of the body is read, so that a caller without a
// credential costs one header parse and one credential lookup, whatever
// body it announces or trickles: the framing headers, the credential,
// ban and scope, and on worker routes the signature fields' presence,
// size and syntax. Register is no exception: its provisioning credential
// is verified first; only the signature's key is in its body, so the
// body is read before the signature is verified, as on every worker
// route.
func (s *Server) run(ctx context.Context, c *call, rt route) (int, any, error) {
	if rt.public {
		return rt.handle(ctx, c)
	}
	// Framing, from the headers: 415, and 413 for a declared length over
	// the limit. A request without a body (such as POST
	// /operator/jobs/{id}/cancel sent by curl -X POST) needs no media type.
	ct := c.r.Header.Get("Content-Type")
	switch {
	case rt.stream:
		if mt, _, err := mime.ParseMediaType(ct); err != nil || mt != "application/octet-stream" {
			return 0, nil, fmt.Errorf("%w: a part is application/octet-stream", ErrUnsupportedMediaType)
		}
	case rt.method != http.MethodGet && rt.method != http.MethodHead && (ct != "" || c.r.ContentLength != 0):
		mt, _, err := mime.ParseMediaType(ct)
		if err != nil || mt != "application/json" {
			return 0, nil, ErrUnsupportedMediaType
		}
	}
	if c.r.ContentLength > s.cfg.BodyLimit && !rt.stream {
		return 0, nil, fmt.Errorf("%w: the body is %d bytes; the limit is %d", ErrPayloadTooLarge, c.r.ContentLength, s.cfg.BodyLimit)
	}
	// Credential (401), then ban and scope (403).
	token, err := credential.BearerToken(c.r.Header)
	if err != nil {
		return 0, nil, err
	}
	p, cred, err := s.verify(ctx, token, rt.scope)
	if err != nil {
		return 0, nil, err
	}
	c.principal, c.credentialID, c.bearer = p, cred.ID, token
	if err := checkRequestChars(c.r); err != nil {
		return 0, nil, err
	}
	if rt.signed && rt.path != wire.PathRegister &&
		(p.Kind != credential.KindNode || len(p.PublicKey) != ed25519.PublicKeySize) {
		return 0, nil, fmt.Errorf("%w: the credential is not a registered node's", credential.ErrInsufficientScope)
	}
	// The signature fields: present, within their size, parsing (401).
	if rt.signed {
		if err := checkSignatureFields(c.r.Header); err != nil {
			return 0, nil, err
		}
	}
	if !rt.stream {
		if err := s.readBody(ctx, c); err != nil {
			return 0, nil, err
		}
	}
	switch {
	case rt.path == wire.PathRegister:
		return s.register(ctx, c)
	case !rt.signed:
		if err := checkQuery(c.r.URL.RawQuery, rt); err != nil {
			return 0, nil, err
		}
		return rt.handle(ctx, c)
	}
	code, out, err := s.signed(ctx, c, p.PublicKey, rt)
	if err != nil && leaseBearing(rt) {
		err = sameForEveryProbe(err)
	}
	return code, out, err
}

// checkQuery refuses, on an operator GET route, a query parameter the
// route does not accept (rt.query), and a query that does not parse: an
// operator's typo (?sate=queued) must not silently list everything.
func checkQuery(raw string, rt route) error {
	if rt.method != http.MethodGet && rt.method != http.MethodHead {
		return nil
	}
	q, err := url.ParseQuery(raw)
	if err != nil {
		return fmt.Errorf("%w: the query does not parse: %v", ErrInvalidRequest, err)
	}
	names := make([]string, 0, len(q))
	for name := range q {
		if !slices.Contains(rt.query, name) {
			names = append(names, name)
		}
	}
	if len(names) == 0 {
		return nil
	}
	slices.Sort(names)
	if len(rt.query) == 0 {
		return fmt.Errorf("%w: unknown query parameter %q: %s takes none", ErrInvalidRequest, names[0], rt.path)
	}
	return fmt.Errorf("%w: unknown query parameter %q: %s takes %s", ErrInvalidRequest, names[0], rt.path, strings.Join(rt.query, ", "))
}

// readBody reads the body, up to Config.BodyLimit (413 beyond; the
// connection is closed after the answer), into memory it reserved first
// from Config.Shares.BodyBytes: the declared Content-Length, or the
// limit for a chunked body (503 server_busy, the body unread, when the
// budget cannot hold it). The reservation lasts until the request ends
// or gives its body up (call.dropBody). A host's
// http.Server.ReadTimeout bounds this read; net/http lifts the deadline
// once the body is read, so a long-poll may outlast it.
func (s *Server) readBody(ctx context.Context, c *call) error {
	n := c.r.ContentLength
	if n < 0 {
		n = s.cfg.BodyLimit
	}
	release, err := s.shares.reserveBody(ctx, n)
	if err != nil {
		// The body stays unread: net/http would otherwise read a small
		// one before it answers.
		c.w.Header().Set("Connection", "close")
		return err
	}
	c.dropBody = func(keep int64) {
		if keep == 0 {
			c.body = nil
		}
		release(keep)
	}
	c.cleanup(func() { c.dropBody(0) })
	r := http.MaxBytesReader(c.w, c.r.Body, s.cfg.BodyLimit)
	var body []byte
	if c.r.ContentLength > 0 {
		// Read into what was reserved, not into a buffer that grows.
		body = make([]byte, c.r.ContentLength)
		_, err = io.ReadFull(r, body)
	} else {
		body, err = io.ReadAll(r)
	}
	if err != nil {
		var mbe *http.MaxBytesError
		if errors.As(err, &mbe) {
			return fmt.Errorf("%w: the limit is %d bytes", ErrPayloadTooLarge, s.cfg.BodyLimit)
		}
		return fmt.Errorf("%w: reading the body: %v", ErrInvalidRequest, err)
	}
	c.body = body
	release(int64(len(body)))
	return nil
}

// leaseBearing reports whether rt acts on a job under a lease token: the
// routes /workers/jobs/{id}/….
func leaseBearing(rt route) bool {
	return rt.signed && strings.HasPrefix(rt.path, "/workers/jobs/{id}/")
}

// errNoLease is the one answer of a lease-bearing route to a token that
// holds no live lease on the job, whether the job exists or not.
var errNoLease = fmt.Errorf("%w: the lease_token holds no live lease on this job", lease.ErrLeaseLost)

// sameForEveryProbe makes a lease-bearing route answer a job that does
// not exist exactly as it answers a job the caller holds no lease on (409
// lease_lost, one message), so that probing job ids reveals neither
// which exist nor anything about them.
func sameForEveryProbe(err error) error {
	if errors.Is(err, lease.ErrNotFound) || errors.Is(err, lease.ErrLeaseLost) {
		return errNoLease
	}
	return err
}

// signed checks the request's signature against pub, then runs handle in
// one transaction that ends by consuming the nonce: one it may share with
// concurrent requests (sharedTx), each atomic in it, unless the route
// streams its body. If the transaction fails after the signature
// verified, the nonce is consumed in a commit of its own: a verified
// request never runs twice, whatever its outcome.
//
// The nonce goes last so that the lock the nonce store may take for the
// node's quota (bunstore's, on PostgreSQL) is held only for the commit,
// not for the handler's work: one node's concurrent requests then run
// side by side. A copy of a request that already ran does its handler's
// work in vain and rolls it back; its answer is still the replay's, as
// when the nonce came first: a handler's error gives way to the nonce's
// when the nonce was used or the node is over its quota.
func (s *Server) signed(ctx context.Context, c *call, pub ed25519.PublicKey, rt route) (int, any, error) {
	r := c.r
	if s.origin != nil {
		r = s.origin.request(c.r)
	}
	var v *replay.Verified
	var err error
	if rt.stream {
		v, c.digest, err = s.verifier.CheckStream(r, pub)
	} else {
		v, err = s.verifier.Check(r, c.body, pub)
	}
	if err != nil {
		err = s.diagnose(c.r, r, pub, err)
		s.rejected(err)
		return 0, nil, err
	}
	nonceNode := v.KeyID
	if rt.prepare != nil {
		if err := rt.prepare(ctx, c); err != nil {
			// As when the transaction fails: these bytes never run again,
			// and a replay is answered as one.
			if cerr := s.verifier.Consume(context.WithoutCancel(ctx), nonceNode, v.Nonce, v.Expires); cerr != nil {
				if nonceRefused(cerr) {
					s.rejected(cerr)
					return 0, nil, cerr
				}
				s.log.Warn("consuming the nonce of a failed request", "request_id", c.reqID, "err", cerr)
			}
			return 0, nil, err
		}
	}
	// A stream route's transaction reads the body as it streams: it
	// would hold its turn for as long as the client takes to send it.
	done := func() {}
	if !rt.stream {
		if done, err = s.turn(ctx); err != nil {
			return 0, nil, err
		}
		defer done()
	}
	handle := rt.handle
	var (
		code    int
		out     any
		refused bool // the nonce store refused the nonce: a replay or over quota
		handled bool // the handler and the nonce succeeded: only the commit was left
	)
	inTx := s.st.Tx.InTx
	if !rt.stream {
		inTx = func(ctx context.Context, fn func(ctx context.Context) error) error { return s.sharedTx(ctx, c, fn) }
	}
	err = inTx(ctx, func(ctx context.Context) error {
		refused, handled = false, false
		var err error
		if code, out, err = handle(ctx, c); err != nil {
			return err
		}
		if err := s.verifier.Consume(ctx, nonceNode, v.Nonce, v.Expires); err != nil {
			refused = nonceRefused(err)
			return err
		}
		handled = true
		return nil
	})
	if err != nil && !refused {
		// The transaction rolled the nonce back with the failed operation
		// (or the nonce store failed): consume it in a commit of its own,
		// so these bytes can never run later. If they ran before, or the
		// node is over its quota, that is the answer.
		//
		// When only the commit was left, its outcome is unknown (a
		// connection lost during COMMIT): the nonce, written in the same
		// transaction, tells. Found, the transaction committed and its
		// answer stands; not found, it did not, and now never will.
		cerr := s.verifier.Consume(context.WithoutCancel(ctx), nonceNode, v.Nonce, v.Expires)
		switch {
		case handled && errors.Is(cerr, replay.ErrReplayedNonce):
			s.log.Warn("the outcome of a commit was unknown: it committed", "request_id", c.reqID, "err", err)
			err = nil
		case cerr != nil && nonceRefused(cerr):
			err = cerr
		case cerr != nil && handled:
			s.log.Error("the outcome of a commit is unknown", "request_id", c.reqID, "err", err, "nonce_err", cerr)
			err = fmt.Errorf("%w: %w", ErrOutcomeUnknown, err)
		case cerr != nil:
			s.log.Warn("consuming the nonce of a failed request", "request_id", c.reqID, "err", cerr)
		}
	}
	if err != nil && !refused && c.keyed != nil {
		// A concurrent request under the same key may have answered
		// first (its answer made this one fail): that answer is this
		// one's too.
		rcode, rout, ok, rerr := s.recall(context.WithoutCancel(ctx), c.keyed)
		switch {
		case rerr == nil && ok:
			c.hooks, c.notes, c.then, c.committed = nil, nil, nil, true
			return rcode, rout, nil
		case errors.Is(rerr, ErrIdempotencyMismatch):
			err = rerr
		}
	}
	if err != nil {
		if nonceRefused(err) {
			s.rejected(err)
		}
		return 0, nil, err
	}
	c.committed = true
	done()
	if c.then != nil {
		// A long-poll's wait, or a wait for a proof, needs no body.
		if c.dropBody != nil {
			c.dropBody(0)
		}
		return c.then(ctx)
	}
	return code, out, nil
}

// sharedTx runs fn, c's work, in a transaction of Stores.Tx that it may
// share with concurrent requests (SharedTransactor), or else in one of
// its own.
func (s *Server) sharedTx(ctx context.Context, c *call, fn func(ctx context.Context) error) error {
	if st, ok := s.st.Tx.(SharedTransactor); ok {
		return st.InSharedTx(ctx, c.principal.ID, fn)
	}
	return s.st.Tx.InTx(ctx, fn)
}

// nonceRefused reports whether the nonce store refused a nonce, as
// opposed to failing to answer: a replay, or a node over its quota.
func nonceRefused(err error) bool {
	return errors.Is(err, replay.ErrReplayedNonce) || errors.Is(err, replay.ErrQuota)
}

// fail writes err as PROTOCOL.md's error body and returns its status.
func (s *Server) fail(w http.ResponseWriter, r *http.Request, reqID string, err error) status {
	st := statusOf(err)
	msg := publicMessage(err.Error())
	gone := false
	if st.http == http.StatusServiceUnavailable && !errors.Is(err, ErrServerBusy) {
		// Store errors may name internals; log them, answer plainly.
		msg = "a store cannot answer; nothing was accepted"
		if errors.Is(err, ErrOutcomeUnknown) {
			msg = ErrOutcomeUnknown.Error()
		}
		if gone = clientGone(r); !gone {
			s.log.Error("request failed", "request_id", reqID, "method", r.Method, "path", r.URL.Path, "err", err)
		}
	}
	if st.http == http.StatusServiceUnavailable || st.http == http.StatusTooManyRequests {
		w.Header().Set("Retry-After", s.retryAfter(err))
	}
	// A client that hung up reads nothing; the answer goes out anyway for
	// the case where the host, shutting down, canceled the request.
	s.writeJSON(w, st.http, wire.ErrorBody{Error: wire.ErrorDetail{Code: st.code, Message: msg, ServerTime: s.now()}})
	if gone {
		return status{StatusClientClosedRequest, CodeClientClosedRequest}
	}
	return st
}

// StatusClientClosedRequest is the status a Server logs and reports to
// Metrics (RequestInfo.Status) for a request whose context was canceled
// before it was answered: its client hung up (or the host canceled it,
// say while shutting down). It is nginx's 499, never sent on the wire:
// the store error the cancellation caused is not the server's failure,
// so it is logged at INFO, not as an ERROR, and not counted as a 503.
const StatusClientClosedRequest = 499

// CodeClientClosedRequest is RequestInfo.Code for
// StatusClientClosedRequest. It is no PROTOCOL.md code: nothing sends it.
const CodeClientClosedRequest = "client_closed_request"

// clientGone reports whether r's context was canceled: its client hung
// up, or the host canceled it.
func clientGone(r *http.Request) bool {
	return errors.Is(r.Context().Err(), context.Canceled)
}

// internalPrefixes are the package prefixes the cores and adapters put
// on their errors ("bunstore: job …: lease: not found"): how the control
// plane is layered, which is no business of a caller's.
var internalPrefixes = []string{
	"bunstore: ", "lease: ", "credential: ", "replay: ", "envelope: ", "receipts: ", "workerapi: ",
}

// publicMessage is msg in the caller's terms: without the package
// prefixes of internalPrefixes, wherever one starts the message or one of
// its ": "-separated parts. "bunstore: job j: lease: not found" becomes
// "job j: not found".
func publicMessage(msg string) string {
	out := make([]byte, 0, len(msg))
	for i := 0; i < len(msg); {
		if i == 0 || (i >= 2 && msg[i-2:i] == ": ") {
			if p := internalPrefix(msg[i:]); p != "" {
				i += len(p)
				continue
			}
		}
		out = append(out, msg[i])
		i++
	}
	return string(out)
}

func internalPrefix(s string) string {
	for _, p := range internalPrefixes {
		if strings.HasPrefix(s, p) {
			return p
		}
	}
	return ""
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
	if addr := clientAddr(c.r, s.trusted); addr != "" {
		attrs = append(attrs, "client_addr", addr)
	}
	if c.principal != nil {
		attrs = append(attrs, "principal", c.principal.ID, "credential", c.credentialID)
	}
	workerID, jobIDs := c.ids(rt)
	if workerID != "" {
		attrs = append(attrs, "worker_id", workerID)
	}
	switch {
	case len(c.jobIDs) > 0:
		attrs = append(attrs, "job_ids", jobIDs)
	case len(jobIDs) == 1:
		attrs = append(attrs, "job_id", jobIDs[0])
	}
	switch {
	case err != nil && code == StatusClientClosedRequest:
		s.log.Info("request canceled by its client", append(attrs, "code", errCode, "reason", err.Error())...)
	case err != nil:
		attrs = append(attrs, "code", errCode)
		s.log.Info("request refused", append(attrs, "reason", err.Error())...)
	default:
		s.log.Debug("request", attrs...)
	}
	if em := s.events(); em != nil && errCode == wire.CodeLeaseLost {
		em.ObserveLeases(LeaseLost, 1)
	}
	if s.cfg.Metrics != nil {
		ri := RequestInfo{Method: rt.method, Route: rt.path, Status: code, Code: errCode, Duration: d, WorkerID: workerID, JobIDs: jobIDs}
		if cm, ok := s.cfg.Metrics.(ContextMetrics); ok {
			cm.ObserveRequestContext(c.r.Context(), ri)
		} else {
			s.cfg.Metrics.ObserveRequest(ri)
		}
	}
}

// ids returns the worker and the jobs a request concerns, for its log
// line and RequestInfo: the worker of a signed request, or the {id} of
// an operator route on a worker; the job of the path's {id}, or the jobs
// a lease granted.
func (c *call) ids(rt route) (workerID string, jobIDs []string) {
	if rt.signed && c.principal != nil && c.principal.Kind == credential.KindNode {
		workerID = c.principal.ID
	}
	if id := c.r.PathValue("id"); id != "" {
		switch {
		case strings.HasPrefix(rt.path, "/workers/jobs/{id}"), strings.HasPrefix(rt.path, "/operator/jobs/{id}"):
			jobIDs = []string{id}
		case strings.HasPrefix(rt.path, "/operator/workers/{id}"):
			workerID = id
		}
	}
	if len(c.jobIDs) > 0 {
		jobIDs = c.jobIDs
	}
	return workerID, jobIDs
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
