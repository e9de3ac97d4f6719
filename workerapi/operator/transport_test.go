package operator_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"

	"github.com/nodelane/nodelane/workerapi/operator"
	"github.com/nodelane/nodelane/workerapi/wire"
)

// TestHandlerTransport checks a Client that calls a control plane's
// operator handler in process, as the console does: the same answers and
// errors as over HTTP, with no listener and no https needed.
func TestHandlerTransport(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	ctx := context.Background()
	hc := &http.Client{Transport: &operator.HandlerTransport{Handler: f.env.Server.OperatorHandler(), RemoteAddr: "console"}}
	api, err := operator.New("http://nodelane.internal", "", &operator.Config{HTTPClient: hc})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := api.Envelope(ctx); !wire.IsCode(err, wire.CodeMissingCredential) {
		t.Errorf("Envelope without a token = %v, want 401 missing_credential", err)
	}
	op := api.WithToken(f.env.OperatorToken)
	d, err := op.Dispatch(ctx, wire.DispatchRequest{JobType: "status_check"})
	if err != nil {
		t.Fatalf("Dispatch: %v", err)
	}
	var ids []string
	for j, err := range op.Jobs(ctx, operator.JobQuery{State: "queued"}) {
		if err != nil {
			t.Fatal(err)
		}
		ids = append(ids, j.ID)
	}
	if len(ids) != 1 || ids[0] != d.Job.ID {
		t.Errorf("Jobs = %v, want [%s]", ids, d.Job.ID)
	}
	if _, err := op.Job(ctx, "job/x", 0); !wire.IsCode(err, wire.CodeNotFound) || strings.Contains(err.Error(), "no route") {
		t.Errorf("Job(job/x) = %v, want 404 not_found from the job route", err)
	}
	cp, err := op.VerifiedCheckpoint(ctx, f.env.Server.ReceiptVerifierKey(), f.env.Config.Origin)
	if err != nil {
		t.Fatalf("VerifiedCheckpoint: %v", err)
	}
	if _, err := op.Consistency(ctx, 0, cp.Size); err != nil {
		t.Errorf("Consistency: %v", err)
	}
}

// TestHandlerTransportRequest checks the request a handler gets: as a
// server would hand it over (a request-target, a Host, a body that is
// never nil, RemoteAddr), and that the answer keeps the headers as they
// were when the status was written.
func TestHandlerTransportRequest(t *testing.T) {
	t.Parallel()
	var got *http.Request
	var body string
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		got = r
		b, _ := io.ReadAll(r.Body)
		body = string(b)
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("X-Request-Id", "req-1")
		w.WriteHeader(http.StatusNotFound)
		w.Header().Set("X-Late", "not sent")
		fmt.Fprint(w, `{"error":{"code":"not_found","message":"no such job"}}`)
	})
	api, err := operator.New("http://nodelane.internal/cp", "nlc_t", &operator.Config{HTTPClient: &http.Client{Transport: &operator.HandlerTransport{Handler: h}}})
	if err != nil {
		t.Fatal(err)
	}
	_, err = api.CancelJob(context.Background(), "job a")
	var we *wire.Error
	if !errors.As(err, &we) || we.Status != 404 || we.Code != wire.CodeNotFound || we.RequestID != "req-1" {
		t.Fatalf("CancelJob = %v, want the handler's 404 not_found, request id req-1", err)
	}
	if got.RequestURI != "/cp/operator/jobs/job%20a/cancel" || got.URL.Host != "" || got.URL.Path != "/cp/operator/jobs/job a/cancel" ||
		got.Host != "nodelane.internal" || got.RemoteAddr != "in-process" || got.Body == nil || body != "" ||
		got.Header.Get("Authorization") != "Bearer nlc_t" || got.Proto != "HTTP/1.1" {
		t.Errorf("the handler got %s %s (URL %+v) Host %s from %s, body %q, headers %v", got.Method, got.RequestURI, got.URL, got.Host, got.RemoteAddr, body, got.Header)
	}
	req, err := http.NewRequest(http.MethodGet, "http://nodelane.internal/operator/jobs", nil)
	if err != nil {
		t.Fatal(err)
	}
	resp, err := (&operator.HandlerTransport{Handler: h, RemoteAddr: "console"}).RoundTrip(req)
	if err != nil {
		t.Fatal(err)
	}
	if resp.StatusCode != 404 || resp.Header.Get("X-Request-Id") != "req-1" || resp.Header.Get("X-Late") != "" || got.RemoteAddr != "console" || got.Body == nil {
		t.Errorf("RoundTrip = %d %v, the handler got RemoteAddr %q, body %v; want 404 with the headers written before it, from console", resp.StatusCode, resp.Header, got.RemoteAddr, got.Body)
	}

	// An answer past MaxAnswerBytes fails the call.
	big := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		chunk := strings.Repeat("x", 1<<20)
		for range operator.MaxAnswerBytes>>20 + 1 {
			if _, err := io.WriteString(w, chunk); err != nil {
				return
			}
		}
	})
	api, err = operator.New("http://nodelane.internal", "nlc_t", &operator.Config{HTTPClient: &http.Client{Transport: &operator.HandlerTransport{Handler: big}}})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := api.Envelope(context.Background()); !errors.Is(err, operator.ErrMalformedAnswer) {
		t.Errorf("an answer past MaxAnswerBytes = %v, want ErrMalformedAnswer", err)
	}
}
