package operator

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strconv"
)

// HandlerTransport is an http.RoundTripper that serves each request with
// Handler in this process, as a server would hand it over: no listener,
// no connection, no TLS. Give it to a Client (Config.HTTPClient's
// Transport) to call an operator handler, such as workerapi's
// Server.OperatorHandler, that the program serves itself; the base URL's
// host is then only the request's Host, and its path, if any, starts
// every path the handler sees (a base URL without one suits a handler that
// serves /operator/... itself).
//
// The handler runs on the caller's goroutine and sees the request's
// context; its answer is buffered, at most MaxAnswerBytes (a larger one
// fails the call). A HandlerTransport is safe for concurrent use if
// Handler is.
type HandlerTransport struct {
	// Handler serves the requests. Required.
	Handler http.Handler
	// RemoteAddr is the requests' RemoteAddr, which the handler may log as
	// the client's address. Defaults to "in-process".
	RemoteAddr string
}

// errAnswerTooLarge is a handler's write past MaxAnswerBytes.
var errAnswerTooLarge = fmt.Errorf("%w: the handler's answer is larger than %d bytes", ErrMalformedAnswer, MaxAnswerBytes)

// RoundTrip serves req with t.Handler and returns its answer.
func (t *HandlerTransport) RoundTrip(req *http.Request) (*http.Response, error) {
	if req.Body != nil {
		defer req.Body.Close()
	}
	if t.Handler == nil {
		return nil, errors.New("operator: HandlerTransport has no Handler")
	}
	// The request as a server hands it over: a request-target rather
	// than a URL, a body that is never nil.
	sr := req.Clone(req.Context())
	sr.URL = &url.URL{Path: req.URL.Path, RawPath: req.URL.RawPath, RawQuery: req.URL.RawQuery}
	sr.RequestURI = req.URL.RequestURI()
	sr.Host = req.URL.Host
	if req.Host != "" {
		sr.Host = req.Host
	}
	sr.Proto, sr.ProtoMajor, sr.ProtoMinor = "HTTP/1.1", 1, 1
	sr.RemoteAddr = t.RemoteAddr
	if sr.RemoteAddr == "" {
		sr.RemoteAddr = "in-process"
	}
	if req.Body == nil {
		sr.Body = http.NoBody
	}
	w := &recorder{header: http.Header{}}
	t.Handler.ServeHTTP(w, sr)
	if w.err != nil {
		return nil, w.err
	}
	if w.status == 0 {
		w.status = http.StatusOK
	}
	if w.sent == nil {
		w.sent = w.header.Clone()
	}
	return &http.Response{
		Status:        strconv.Itoa(w.status) + " " + http.StatusText(w.status),
		StatusCode:    w.status,
		Proto:         "HTTP/1.1",
		ProtoMajor:    1,
		ProtoMinor:    1,
		Header:        w.sent,
		Body:          io.NopCloser(bytes.NewReader(w.body.Bytes())),
		ContentLength: int64(w.body.Len()),
		Request:       req,
	}, nil
}

// recorder is the ResponseWriter of one in-process request.
type recorder struct {
	header http.Header
	// sent is header as it was when the status was written.
	sent   http.Header
	status int
	body   bytes.Buffer
	err    error
}

func (r *recorder) Header() http.Header { return r.header }

func (r *recorder) WriteHeader(code int) {
	if r.status != 0 || code < 200 {
		return // informational answers are not kept
	}
	r.status = code
	r.sent = r.header.Clone()
}

func (r *recorder) Write(b []byte) (int, error) {
	if r.status == 0 {
		r.WriteHeader(http.StatusOK)
	}
	if r.body.Len()+len(b) > MaxAnswerBytes {
		r.err = errAnswerTooLarge
		return 0, r.err
	}
	return r.body.Write(b)
}
