// Package logtest is a slog.Handler for tests that keeps every record, so
// that a test can wait for one or count them.
package logtest

import (
	"context"
	"log/slog"
	"sync"
	"testing"
	"time"
)

// Recorder is a slog.Handler that keeps every record it is given, at
// every level.
type Recorder struct {
	mu      sync.Mutex
	recs    []slog.Record
	changed chan struct{}
}

// New returns an empty Recorder.
func New() *Recorder { return &Recorder{changed: make(chan struct{}, 1)} }

// Enabled implements slog.Handler: every level is.
func (l *Recorder) Enabled(context.Context, slog.Level) bool { return true }

// WithAttrs implements slog.Handler; the attributes are dropped.
func (l *Recorder) WithAttrs([]slog.Attr) slog.Handler { return l }

// WithGroup implements slog.Handler; the group is dropped.
func (l *Recorder) WithGroup(string) slog.Handler { return l }

// Handle implements slog.Handler: it keeps a copy of r.
func (l *Recorder) Handle(_ context.Context, r slog.Record) error {
	l.mu.Lock()
	l.recs = append(l.recs, r.Clone())
	l.mu.Unlock()
	select {
	case l.changed <- struct{}{}:
	default:
	}
	return nil
}

// WaitFor waits until a record satisfies ok and returns it; after a
// minute (a hang guard, not a timing assertion) it fails the test with
// what.
func (l *Recorder) WaitFor(t testing.TB, what string, ok func(slog.Record) bool) slog.Record {
	t.Helper()
	timeout := time.After(time.Minute)
	for {
		l.mu.Lock()
		for _, r := range l.recs {
			if ok(r) {
				l.mu.Unlock()
				return r
			}
		}
		l.mu.Unlock()
		select {
		case <-l.changed:
		case <-timeout:
			t.Fatalf("no log record: %s", what)
		}
	}
}

// Records returns a copy of the records kept so far, in order.
func (l *Recorder) Records() []slog.Record {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]slog.Record(nil), l.recs...)
}
