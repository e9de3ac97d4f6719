// Package operator is a small client of nodelane's operator routes
// (docs/PROTOCOL.md §13): plain HTTP with a bearer token, no signature.
// cmd/loadgen, cmd/soak and cmd/nodelanectl share it.
package operator

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strconv"
	"time"

	"golang.org/x/mod/sumdb/tlog"

	"github.com/nodelane/nodelane/workerapi/wire"
)

// Client calls the operator routes of the control plane at a base URL.
type Client struct {
	base  string
	token string
	hc    *http.Client
}

// New returns a Client of the control plane at base (no trailing slash)
// that authenticates with the operator token and sends through hc.
func New(base, token string, hc *http.Client) *Client {
	return &Client{base: base, token: token, hc: hc}
}

// Error is an operator route's answer other than the one expected.
type Error struct {
	Route   string // method and path
	Status  int
	Code    string // the error body's code, "" when it had none
	Message string
}

func (e *Error) Error() string {
	return fmt.Sprintf("%s: %d %s: %s", e.Route, e.Status, e.Code, e.Message)
}

// maxOpAnswer bounds an operator answer: a page is about 1 MiB.
const maxOpAnswer = 8 << 20

// do sends one request and decodes a 2xx JSON answer into out, or hands
// its body to raw.
func (o *Client) do(ctx context.Context, method, route string, in, out any, raw *[]byte) error {
	var body io.Reader
	if in != nil {
		b, err := json.Marshal(in)
		if err != nil {
			return err
		}
		body = bytes.NewReader(b)
	}
	req, err := http.NewRequestWithContext(ctx, method, o.base+route, body)
	if err != nil {
		return err
	}
	req.Header.Set("Authorization", "Bearer "+o.token)
	if in != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	resp, err := o.hc.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(io.LimitReader(resp.Body, maxOpAnswer))
	if err != nil {
		return fmt.Errorf("%s %s: reading the answer: %w", method, route, err)
	}
	if resp.StatusCode < 200 || resp.StatusCode > 299 {
		e := &Error{Route: method + " " + route, Status: resp.StatusCode}
		var eb wire.ErrorBody
		if json.Unmarshal(b, &eb) == nil {
			e.Code, e.Message = eb.Error.Code, eb.Error.Message
		}
		return e
	}
	if raw != nil {
		*raw = b
		return nil
	}
	if err := json.Unmarshal(b, out); err != nil {
		return fmt.Errorf("%s %s: undecodable answer: %w", method, route, err)
	}
	return nil
}

// Call sends one request to route (a path with its query, e.g.
// "/operator/jobs?state=queued") with in as its JSON body (none when in
// is nil) and returns the body of a 2xx answer as it came. Any other
// answer is an *Error. The operator token appears in no error.
func (o *Client) Call(ctx context.Context, method, route string, in any) ([]byte, error) {
	var b []byte
	if err := o.do(ctx, method, route, in, nil, &b); err != nil {
		return nil, err
	}
	return b, nil
}

// Dispatch queues a job (POST /operator/jobs). A 429 or 503 answer, which
// queues nothing, is tried again, up to four times.
func (o *Client) Dispatch(ctx context.Context, req wire.DispatchRequest) (*wire.DispatchResponse, error) {
	for attempt := 1; ; attempt++ {
		out, err := o.DispatchOnce(ctx, req)
		var oe *Error
		if !errors.As(err, &oe) || (oe.Status != http.StatusTooManyRequests && oe.Status != http.StatusServiceUnavailable) || attempt == 4 {
			return out, err
		}
		select {
		case <-time.After(time.Duration(attempt) * 100 * time.Millisecond):
		case <-ctx.Done():
			return nil, context.Cause(ctx)
		}
	}
}

// DispatchOnce sends one POST /operator/jobs, and tries nothing again.
func (o *Client) DispatchOnce(ctx context.Context, req wire.DispatchRequest) (*wire.DispatchResponse, error) {
	var out wire.DispatchResponse
	if err := o.do(ctx, http.MethodPost, "/operator/jobs", req, &out, nil); err != nil {
		return nil, err
	}
	return &out, nil
}

// ListJobs reads a page of jobs with ids above after (GET
// /operator/jobs), of jobType unless it is "".
func (o *Client) ListJobs(ctx context.Context, jobType, after string) (*wire.JobListResponse, error) {
	q := url.Values{"limit": {"1000"}}
	if jobType != "" {
		q.Set("job_type", jobType)
	}
	if after != "" {
		q.Set("after", after)
	}
	var out wire.JobListResponse
	if err := o.do(ctx, http.MethodGet, "/operator/jobs?"+q.Encode(), nil, &out, nil); err != nil {
		return nil, err
	}
	return &out, nil
}

// Receipt reads a receipt with its proof and checkpoint (GET
// /operator/receipts/{id}).
func (o *Client) Receipt(ctx context.Context, id string) (*wire.ReceiptResponse, error) {
	var out wire.ReceiptResponse
	if err := o.do(ctx, http.MethodGet, "/operator/receipts/"+url.PathEscape(id), nil, &out, nil); err != nil {
		return nil, err
	}
	return &out, nil
}

// Checkpoint reads the latest signed checkpoint note (GET
// /operator/receipts/checkpoint).
func (o *Client) Checkpoint(ctx context.Context) ([]byte, error) {
	var b []byte
	if err := o.do(ctx, http.MethodGet, "/operator/receipts/checkpoint", nil, nil, &b); err != nil {
		return nil, err
	}
	return b, nil
}

// Consistency reads the consistency proof from the tree of oldSize to the
// tree of newSize (GET /operator/receipts/consistency).
func (o *Client) Consistency(ctx context.Context, oldSize, newSize int64) ([]tlog.Hash, error) {
	q := url.Values{"old": {strconv.FormatInt(oldSize, 10)}, "new": {strconv.FormatInt(newSize, 10)}}
	var out wire.ConsistencyResponse
	if err := o.do(ctx, http.MethodGet, "/operator/receipts/consistency?"+q.Encode(), nil, &out, nil); err != nil {
		return nil, err
	}
	return out.Hashes, nil
}

// Receipts reads a page of sequenced receipts with indexes above after
// (GET /operator/receipts), in index order; after -1 reads from the
// first.
func (o *Client) Receipts(ctx context.Context, after int64) (*wire.ReceiptListResponse, error) {
	q := url.Values{"limit": {"1000"}}
	if after >= 0 {
		q.Set("after", strconv.FormatInt(after, 10))
	}
	var out wire.ReceiptListResponse
	if err := o.do(ctx, http.MethodGet, "/operator/receipts?"+q.Encode(), nil, &out, nil); err != nil {
		return nil, err
	}
	return &out, nil
}

// ActivateEnvelope activates the runtime so that blocked job types run
// (POST /operator/envelope/activate).
func (o *Client) ActivateEnvelope(ctx context.Context, reason string) error {
	var out json.RawMessage
	return o.do(ctx, http.MethodPost, "/operator/envelope/activate", map[string]string{"reason": reason}, &out, nil)
}
