package bunstore

import (
	"encoding/json"
	"time"
)

// Conversions between Go values and columns, shared by every store.

// micros is how a time is stored: unix microseconds, which compare
// correctly in SQL and round-trip the microsecond times the Managers use.
func micros(t time.Time) int64 { return t.UnixMicro() }

func microsPtr(t *time.Time) *int64 {
	if t == nil {
		return nil
	}
	us := t.UnixMicro()
	return &us
}

func fromMicros(us int64) time.Time { return time.UnixMicro(us).UTC() }

func fromMicrosPtr(us *int64) *time.Time {
	if us == nil {
		return nil
	}
	t := fromMicros(*us)
	return &t
}

// text stores JSON bytes as they are, and nil as NULL.
func text(b json.RawMessage) *string {
	if b == nil {
		return nil
	}
	s := string(b)
	return &s
}

func raw(s *string) json.RawMessage {
	if s == nil {
		return nil
	}
	return json.RawMessage(*s)
}

func deref[T any](p *T) T {
	var zero T
	if p == nil {
		return zero
	}
	return *p
}

// mapRows returns f of each of rows, in order.
func mapRows[R, T any](rows []R, f func(*R) T) []T {
	out := make([]T, len(rows))
	for i := range rows {
		out[i] = f(&rows[i])
	}
	return out
}
