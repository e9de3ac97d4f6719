package main

import (
	"encoding/json"
	"errors"
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"testing"

	"github.com/nodelane/nodelane/workerapi/operator"
	"github.com/nodelane/nodelane/workerapi/wire"
)

// TestDispatchRetries checks that a dispatch answered 429 or 503, which
// queued nothing, is sent again, up to four times in all, and that any
// other answer is final. No real server can be made to answer 429 or 503
// on demand: this one answers each attempt with the status its case
// lists (the last one repeated).
func TestDispatchRetries(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name     string
		statuses []int
		attempts int
		// fail is the status of the error returned, 0 for a success.
		fail int
	}{
		{"503 and 429, then queued", []int{503, 429, 201}, 3, 0},
		{"429 every time", []int{429}, 4, 429},
		{"400 at once", []int{400}, 1, 400},
		{"500 at once", []int{500}, 1, 500},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			var sent atomic.Int32
			srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				i := int(sent.Add(1)) - 1
				status := tc.statuses[min(i, len(tc.statuses)-1)]
				w.Header().Set("Content-Type", "application/json")
				w.WriteHeader(status)
				if status == http.StatusCreated {
					json.NewEncoder(w).Encode(wire.DispatchResponse{Job: wire.OperatorJob{Job: wire.Job{ID: "job_1", State: "queued"}}})
					return
				}
				json.NewEncoder(w).Encode(wire.ErrorBody{Error: wire.ErrorDetail{Code: "some_code", Message: "not now"}})
			}))
			defer srv.Close()
			op, err := operator.New(srv.URL, "nlc_test", nil)
			if err != nil {
				t.Fatal(err)
			}
			l := &load{op: op}
			resp, err := l.dispatch(t.Context(), []wire.DispatchRequest{{JobType: "status_check"}})
			var we *wire.Error
			switch {
			case tc.fail == 0 && (err != nil || len(resp) != 1 || resp[0].Job.ID != "job_1"):
				t.Errorf("dispatch: %v, %+v; want job_1", err, resp)
			case tc.fail != 0 && (!errors.As(err, &we) || we.Status != tc.fail):
				t.Errorf("dispatch: %v; want a %d answer", err, tc.fail)
			}
			if n := int(sent.Load()); n != tc.attempts {
				t.Errorf("%d attempts, want %d", n, tc.attempts)
			}
		})
	}
}
