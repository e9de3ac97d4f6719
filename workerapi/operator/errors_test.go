package operator_test

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nodelane/nodelane/workerapi/operator"
	"github.com/nodelane/nodelane/workerapi/wire"
)

// TestErrorAnswers checks that the API's error answers come back as
// *wire.Error with their status, code, message and request id, and that
// no error shows the token.
func TestErrorAnswers(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	ctx := context.Background()
	wrong := "nlc_" + strings.Repeat("x", 60)
	tests := []struct {
		name   string
		call   func(c *operator.Client) error
		status int
		code   string
		route  string
	}{
		{"wrong token", func(c *operator.Client) error {
			_, err := c.WithToken(wrong).ListJobs(ctx, operator.JobQuery{})
			return err
		}, http.StatusUnauthorized, wire.CodeInvalidToken, "GET /operator/jobs"},
		{"no token", func(c *operator.Client) error {
			_, err := c.WithToken("").Envelope(ctx)
			return err
		}, http.StatusUnauthorized, wire.CodeMissingCredential, "GET /operator/envelope"},
		{"unknown job", func(c *operator.Client) error {
			_, err := c.Job(ctx, "job_nope", 0)
			return err
		}, http.StatusNotFound, wire.CodeNotFound, "GET /operator/jobs/job_nope"},
		{"an id with a slash stays one segment", func(c *operator.Client) error {
			_, err := c.Worker(ctx, "wrk/ban")
			return err
		}, http.StatusNotFound, wire.CodeNotFound, "GET /operator/workers/wrk%2Fban"},
		{"unknown receipt", func(c *operator.Client) error {
			_, err := c.Receipt(ctx, "rcp_nope")
			return err
		}, http.StatusNotFound, wire.CodeNotFound, "GET /operator/receipts/rcp_nope"},
		{"bad filter", func(c *operator.Client) error {
			_, err := c.ListJobs(ctx, operator.JobQuery{State: "sleeping"})
			return err
		}, http.StatusBadRequest, wire.CodeInvalidRequest, "GET /operator/jobs"},
		{"an iterator yields the error", func(c *operator.Client) error {
			for _, err := range c.WithToken(wrong).Workers(ctx, operator.WorkerQuery{}) {
				return err
			}
			return errors.New("Workers yielded nothing")
		}, http.StatusUnauthorized, wire.CodeInvalidToken, "GET /operator/workers"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			err := tc.call(f.api)
			var we *wire.Error
			if !errors.As(err, &we) {
				t.Fatalf("error = %v (%T), want a *wire.Error", err, err)
			}
			if we.Status != tc.status || we.Code != tc.code || we.Route != tc.route || we.Message == "" || we.RequestID == "" || we.ServerTime.IsZero() {
				t.Errorf("error = %+v, want %d %s from %s with a message, a request id and the server's time", we, tc.status, tc.code, tc.route)
			}
			if strings.Contains(we.Message, "no route") {
				t.Errorf("the request reached no route: %v", err)
			}
			if !wire.IsCode(err, tc.code) || we.Temporary() {
				t.Errorf("IsCode(%s) = %t, Temporary = %t", tc.code, wire.IsCode(err, tc.code), we.Temporary())
			}
			for _, secret := range []string{wrong, f.env.OperatorToken} {
				if strings.Contains(err.Error(), secret) || strings.Contains(fmt.Sprintf("%+v", we), secret) {
					t.Errorf("the error shows a token: %v", err)
				}
			}
		})
	}
}

// stub serves h over loopback and returns a Client of it: for answers
// that no control plane gives.
func stub(t *testing.T, h http.HandlerFunc) *operator.Client {
	t.Helper()
	srv := httptest.NewServer(h)
	t.Cleanup(srv.Close)
	c, err := operator.New(srv.URL, "nlc_token", nil)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// TestMalformedAnswers checks what a call returns for answers that are
// not the API's: a success that is not JSON or not of the route's shape
// or too large wraps ErrMalformedAnswer; a failure whose body is not an
// error answer is a *wire.Error without a code that says so.
func TestMalformedAnswers(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	answer := func(status int, ct, body string) http.HandlerFunc {
		return func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("Content-Type", ct)
			w.WriteHeader(status)
			fmt.Fprint(w, body)
		}
	}
	listJobs := func(c *operator.Client) error { _, err := c.ListJobs(ctx, operator.JobQuery{}); return err }
	tests := []struct {
		name      string
		h         http.HandlerFunc
		call      func(c *operator.Client) error
		malformed bool   // wraps ErrMalformedAnswer
		status    int    // else a *wire.Error of this status, no code
		says      string // in the error's text
	}{
		{"html page", answer(200, "text/html", "<html>welcome</html>"), listJobs, true, 0, `Content-Type "text/html", not JSON`},
		{"wrong shape", answer(200, "application/json", `{"jobs":"many"}`), listJobs, true, 0, "cannot unmarshal"},
		{"truncated", answer(200, "application/json", `{"jobs":[{"id":`), listJobs, true, 0, "unexpected end of JSON"},
		{"too large", answer(200, "application/json", `{"jobs":[],"pad":"`+strings.Repeat("x", operator.MaxAnswerBytes)+`"}`), listJobs, true, 0, "larger than"},
		{"checkpoint not text", answer(200, "application/json", `{"checkpoint":"x"}`), func(c *operator.Client) error {
			_, err := c.Checkpoint(ctx)
			return err
		}, true, 0, "not text"},
		{"proxy error page", answer(502, "text/html", "<h1>Bad Gateway</h1>"), listJobs, false, 502, "not an error of the operator API"},
		{"not found elsewhere", answer(404, "text/plain", "404 page not found"), listJobs, false, 404, "is the base URL the control plane's?"},
		{"redirect not followed", func(w http.ResponseWriter, r *http.Request) {
			http.Redirect(w, r, "http://127.0.0.1:1/steal", http.StatusFound)
		}, listJobs, false, http.StatusFound, "302 found"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			err := tc.call(stub(t, tc.h))
			if err == nil {
				t.Fatal("no error")
			}
			var we *wire.Error
			switch {
			case tc.malformed && (!errors.Is(err, operator.ErrMalformedAnswer) || errors.As(err, &we)):
				t.Errorf("error = %v, want one wrapping ErrMalformedAnswer and no *wire.Error", err)
			case !tc.malformed && (!errors.As(err, &we) || we.Status != tc.status || we.Code != ""):
				t.Errorf("error = %v, want a *wire.Error of status %d without a code", err, tc.status)
			}
			if !strings.Contains(err.Error(), tc.says) {
				t.Errorf("error = %v, want it to say %q", err, tc.says)
			}
		})
	}

	t.Run("temporary with Retry-After", func(t *testing.T) {
		t.Parallel()
		c := stub(t, func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("Retry-After", "7")
			answer(503, "application/json", `{"error":{"code":"unavailable","message":"a store could not answer","server_time":"2026-01-02T03:04:05Z"}}`)(w, r)
		})
		_, err := c.Envelope(ctx)
		var we *wire.Error
		if !errors.As(err, &we) || !we.Temporary() || we.RetryAfter != 7*time.Second || we.Code != wire.CodeUnavailable ||
			!we.ServerTime.Equal(time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)) {
			t.Errorf("error = %+v, want a temporary 503 unavailable, retry after 7s", err)
		}
	})

	t.Run("a cursor that does not move", func(t *testing.T) {
		t.Parallel()
		var n atomic.Int32
		c := stub(t, func(w http.ResponseWriter, r *http.Request) {
			n.Add(1)
			answer(200, "application/json", `{"jobs":[{"id":"job_1"}],"next":"job_1"}`)(w, r)
		})
		var ids []string
		var last error
		for j, err := range c.Jobs(ctx, operator.JobQuery{}) {
			if err != nil {
				last = err
				continue
			}
			ids = append(ids, j.ID)
		}
		if !errors.Is(last, operator.ErrMalformedAnswer) || len(ids) != 2 || n.Load() != 2 {
			t.Errorf("Jobs over a repeating cursor: %v then %v after %d requests; want job_1 twice, then ErrMalformedAnswer after 2", ids, last, n.Load())
		}
	})
}

// TestTransportErrors checks that a request that got no answer returns
// the transport's error, wrapped and naming the route, not a *wire.Error.
func TestTransportErrors(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	srv := httptest.NewServer(http.NotFoundHandler())
	srv.Close() // nothing listens there any more
	c, err := operator.New(srv.URL, "nlc_token", nil)
	if err != nil {
		t.Fatal(err)
	}
	_, err = c.ListWorkers(ctx, operator.WorkerQuery{})
	var oe *net.OpError
	var we *wire.Error
	if !errors.As(err, &oe) || errors.As(err, &we) || !strings.HasPrefix(err.Error(), "operator: GET /operator/workers: ") {
		t.Errorf("error = %v, want a wrapped *net.OpError naming the route", err)
	}

	canceled, cancel := context.WithCancel(ctx)
	cancel()
	live := stub(t, func(w http.ResponseWriter, r *http.Request) { t.Error("a canceled call was sent") })
	if _, err := live.Envelope(canceled); !errors.Is(err, context.Canceled) {
		t.Errorf("a canceled call = %v, want context.Canceled", err)
	}
}

// TestNew checks the base URLs and settings New accepts and refuses, and
// that a refusal shows no password or token.
func TestNew(t *testing.T) {
	t.Parallel()
	inProcess := &http.Client{Transport: &operator.HandlerTransport{Handler: http.NotFoundHandler()}}
	tests := []struct {
		name  string
		base  string
		token string
		cfg   *operator.Config
		ok    bool
	}{
		{"https", "https://cp.example.com", "nlc_t", nil, true},
		{"https with a prefix", "https://cp.example.com/nodelane/", "nlc_t", nil, true},
		{"loopback http", "http://127.0.0.1:8080", "nlc_t", nil, true},
		{"localhost http", "http://localhost:8080", "nlc_t", nil, true},
		{"IPv6 loopback http", "http://[::1]:8080", "nlc_t", nil, true},
		{"no token", "https://cp.example.com", "", nil, true},
		{"plain http allowed", "http://cp.example.com", "nlc_t", &operator.Config{AllowInsecureHTTP: true}, true},
		{"in process", "http://nodelane.internal", "nlc_t", &operator.Config{HTTPClient: inProcess}, true},
		{"plain http elsewhere", "http://cp.example.com", "nlc_t", nil, false},
		{"plain http with a client of the caller's", "http://10.0.0.1", "nlc_t", &operator.Config{HTTPClient: http.DefaultClient}, false},
		{"another scheme", "ftp://cp.example.com", "nlc_t", nil, false},
		{"relative", "/operator", "nlc_t", nil, false},
		{"user information", "https://admin:hunter2@cp.example.com", "nlc_t", nil, false},
		{"a query", "https://cp.example.com/?x=1", "nlc_t", nil, false},
		{"a token with a space", "https://cp.example.com", "nlc_secret part", nil, false},
		{"a token with a newline", "https://cp.example.com", "nlc_secret\r\nX-Evil: 1", nil, false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			c, err := operator.New(tc.base, tc.token, tc.cfg)
			if tc.ok {
				if err != nil || c == nil {
					t.Errorf("New(%q) = %v", tc.base, err)
				}
				return
			}
			if !errors.Is(err, operator.ErrConfig) {
				t.Fatalf("New(%q) = %v, want ErrConfig", tc.base, err)
			}
			if strings.Contains(tc.token, " ") || strings.Contains(tc.token, "\n") {
				if !errors.Is(err, operator.ErrBadToken) {
					t.Errorf("New with a bad token = %v, want ErrBadToken", err)
				}
			}
			if strings.Contains(err.Error(), "hunter2") || strings.Contains(err.Error(), "secret") {
				t.Errorf("New's error shows a secret: %v", err)
			}
		})
	}
}

// TestWithTokenRefusesABadToken checks that a copy WithToken a token that
// cannot be a header fails its calls without sending anything or
// showing the token, and leaves the Client it came from as it was.
func TestWithTokenRefusesABadToken(t *testing.T) {
	t.Parallel()
	var sent atomic.Int32
	c := stub(t, func(w http.ResponseWriter, r *http.Request) {
		sent.Add(1)
		w.Header().Set("Content-Type", "application/json")
		fmt.Fprint(w, `{"active":false}`)
	})
	_, err := c.WithToken("nlc_secret\nX-Evil: 1").Envelope(context.Background())
	if !errors.Is(err, operator.ErrBadToken) || strings.Contains(err.Error(), "secret") || sent.Load() != 0 {
		t.Errorf("a call with a bad token = %v after %d requests; want an error that does not show it, and nothing sent", err, sent.Load())
	}
	if _, err := c.Envelope(context.Background()); err != nil || sent.Load() != 1 {
		t.Errorf("the original Client = %v after %d requests, want it to work", err, sent.Load())
	}
}

// TestBasePath checks that a base URL with a path reaches a control
// plane mounted under that prefix.
func TestBasePath(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	mux := http.NewServeMux()
	mux.Handle("/nodelane/", http.StripPrefix("/nodelane", f.env.Server.OperatorHandler()))
	srv := httptest.NewServer(mux)
	t.Cleanup(srv.Close)
	for _, base := range []string{srv.URL + "/nodelane", srv.URL + "/nodelane/"} {
		c, err := operator.New(base, f.env.OperatorToken, nil)
		if err != nil {
			t.Fatal(err)
		}
		if e, err := c.Envelope(context.Background()); err != nil || len(e.SafeTypes) == 0 {
			t.Errorf("Envelope under %s = %+v, %v", base, e, err)
		}
	}
}
