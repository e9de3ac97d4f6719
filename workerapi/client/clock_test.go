package client_test

import (
	"bytes"
	"context"
	"encoding/json"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nodelane/nodelane/workerapi/client"
	"github.com/nodelane/nodelane/workerapi/wire"
)

// lockedBuffer is a log destination safe for the client's goroutines.
type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) take() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	s := l.b.String()
	l.b.Reset()
	return s
}

// TestClientClockOffsetSources checks which answers move the clock offset:
// a 2xx answer and a stale_timestamp refusal do, clamped to
// ±MaxClockOffset and logged; other errors, whatever server_time they
// carry (a replica whose clock runs fast), do not.
func TestClientClockOffsetSources(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	base := time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)
	type answer struct {
		status int
		code   string // "" for a 2xx answer
		skew   time.Duration
	}
	var (
		mu   sync.Mutex
		next answer
	)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		a := next
		mu.Unlock()
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(a.status)
		at := base.Add(a.skew)
		if a.code == "" {
			json.NewEncoder(w).Encode(map[string]any{"job": map[string]any{}, "server_time": at})
			return
		}
		json.NewEncoder(w).Encode(wire.ErrorBody{Error: wire.ErrorDetail{Code: a.code, Message: "m", ServerTime: at}})
	}))
	defer srv.Close()
	logs := &lockedBuffer{}
	c := newClClient(t, srv.URL, func(cfg *client.Config) {
		cfg.Now = func() time.Time { return base } // sent = received: the sample is exact
		cfg.MaxAttempts = 1
		cfg.Logger = slog.New(slog.NewTextHandler(logs, nil))
	})
	call := func(a answer) {
		t.Helper()
		mu.Lock()
		next = a
		mu.Unlock()
		c.Release(ctx, "j", wire.ReleaseRequest{LeaseToken: "t"})
	}
	want := func(off time.Duration, known bool, log string) {
		t.Helper()
		got, ok := c.ClockOffset()
		if got != off || ok != known {
			t.Errorf("offset = %v %v, want %v %v", got, ok, off, known)
		}
		l := logs.take()
		if log == "" && l != "" || log != "" && !strings.Contains(l, log) {
			t.Errorf("log = %q, want %q", l, log)
		}
	}

	// Errors other than stale_timestamp leave the offset alone.
	for _, a := range []answer{
		{http.StatusConflict, wire.CodeLeaseLost, 11 * time.Minute},
		{http.StatusServiceUnavailable, wire.CodeUnavailable, 11 * time.Minute},
		{http.StatusUnauthorized, wire.CodeBadSignature, -11 * time.Minute},
	} {
		call(a)
		want(0, false, "")
	}
	call(answer{http.StatusOK, "", 3 * time.Second})
	want(3*time.Second, true, "server clock offset")
	// A small move is taken, quietly.
	call(answer{http.StatusOK, "", 3*time.Second + 200*time.Millisecond})
	want(3*time.Second+200*time.Millisecond, true, "")
	call(answer{http.StatusConflict, wire.CodeLeaseLost, 11 * time.Minute})
	want(3*time.Second+200*time.Millisecond, true, "")
	// The stale_timestamp refusal is what the offset is for.
	call(answer{http.StatusUnauthorized, wire.CodeStaleTimestamp, 30 * time.Minute})
	want(30*time.Minute, true, "server clock offset")
	// Beyond the bound: clamped, and said so.
	call(answer{http.StatusOK, "", 5 * time.Hour})
	want(client.MaxClockOffset, true, "clamped")
	call(answer{http.StatusUnauthorized, wire.CodeStaleTimestamp, -5 * time.Hour})
	want(-client.MaxClockOffset, true, "clamped")
}
