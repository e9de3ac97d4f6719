package main

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

// operator calls the operator routes (docs/PROTOCOL.md §13): plain HTTP
// with a bearer token, no signature.
type operator struct {
	base  string
	token string
	hc    *http.Client
}

// opError is an operator route's answer other than the one expected.
type opError struct {
	route   string
	status  int
	code    string
	message string
}

func (e *opError) Error() string {
	return fmt.Sprintf("%s: %d %s: %s", e.route, e.status, e.code, e.message)
}

// maxOpAnswer bounds an operator answer: a page is about 1 MiB.
const maxOpAnswer = 8 << 20

// do sends one request and decodes a 2xx JSON answer into out, or hands
// its body to raw.
func (o *operator) do(ctx context.Context, method, route string, in, out any, raw *[]byte) error {
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
		e := &opError{route: method + " " + route, status: resp.StatusCode}
		var eb wire.ErrorBody
		if json.Unmarshal(b, &eb) == nil {
			e.code, e.message = eb.Error.Code, eb.Error.Message
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

// dispatch queues a job (POST /operator/jobs). A 429 or 503 answer, which
// queues nothing, is tried again, up to four times.
func (o *operator) dispatch(ctx context.Context, req wire.DispatchRequest) (*wire.DispatchResponse, error) {
	var out wire.DispatchResponse
	for attempt := 1; ; attempt++ {
		err := o.do(ctx, http.MethodPost, "/operator/jobs", req, &out, nil)
		var oe *opError
		if !errors.As(err, &oe) || (oe.status != http.StatusTooManyRequests && oe.status != http.StatusServiceUnavailable) || attempt == 4 {
			if err != nil {
				return nil, err
			}
			return &out, nil
		}
		select {
		case <-time.After(time.Duration(attempt) * 100 * time.Millisecond):
		case <-ctx.Done():
			return nil, context.Cause(ctx)
		}
	}
}

// listJobs reads a page of jobs of jobType with ids above after (GET
// /operator/jobs).
func (o *operator) listJobs(ctx context.Context, jobType, after string) (*wire.JobListResponse, error) {
	q := url.Values{"job_type": {jobType}, "limit": {"1000"}}
	if after != "" {
		q.Set("after", after)
	}
	var out wire.JobListResponse
	if err := o.do(ctx, http.MethodGet, "/operator/jobs?"+q.Encode(), nil, &out, nil); err != nil {
		return nil, err
	}
	return &out, nil
}

// receipt reads a receipt with its proof and checkpoint (GET
// /operator/receipts/{id}).
func (o *operator) receipt(ctx context.Context, id string) (*wire.ReceiptResponse, error) {
	var out wire.ReceiptResponse
	if err := o.do(ctx, http.MethodGet, "/operator/receipts/"+url.PathEscape(id), nil, &out, nil); err != nil {
		return nil, err
	}
	return &out, nil
}

// checkpoint reads the latest signed checkpoint (GET
// /operator/receipts/checkpoint).
func (o *operator) checkpoint(ctx context.Context) ([]byte, error) {
	var b []byte
	if err := o.do(ctx, http.MethodGet, "/operator/receipts/checkpoint", nil, nil, &b); err != nil {
		return nil, err
	}
	return b, nil
}

// consistency reads the consistency proof from the tree of oldSize to the
// tree of newSize (GET /operator/receipts/consistency).
func (o *operator) consistency(ctx context.Context, oldSize, newSize int64) ([]tlog.Hash, error) {
	q := url.Values{"old": {strconv.FormatInt(oldSize, 10)}, "new": {strconv.FormatInt(newSize, 10)}}
	var out wire.ConsistencyResponse
	if err := o.do(ctx, http.MethodGet, "/operator/receipts/consistency?"+q.Encode(), nil, &out, nil); err != nil {
		return nil, err
	}
	return out.Hashes, nil
}
