package wire

import (
	"errors"
	"fmt"
	"time"
)

// MaxAgeDays bounds an age given to ParseWhen ("7d", "2w", or a
// duration): at most this many days before now.
const MaxAgeDays = 100_000

// ErrWhen is wrapped by the error of a value ParseWhen cannot read.
var ErrWhen = errors.New("not a time")

// ParseWhen reads a time filter as the operator routes and nodelanectl
// take one (the from and to of GET /operator/costs): an RFC 3339 time
// (fractional seconds and any offset allowed), a date (2026-12-01: its
// start, UTC), or an age before now: a Go duration ("90m", "24h") or a
// whole number of days ("7d") or weeks ("2w"), at most MaxAgeDays. The
// result is in UTC. A value it cannot read is an error wrapping ErrWhen.
func ParseWhen(s string, now time.Time) (time.Time, error) {
	if t, err := time.Parse(time.RFC3339Nano, s); err == nil {
		return t.UTC(), nil
	}
	if t, err := time.Parse(time.DateOnly, s); err == nil {
		return t, nil
	}
	var age time.Duration
	if n, unit, ok := cutDays(s); ok {
		days := n
		if unit == 'w' {
			days = n * 7
		}
		if days > MaxAgeDays {
			return time.Time{}, fmt.Errorf("%w: %q is over %d days", ErrWhen, s, MaxAgeDays)
		}
		age = time.Duration(days) * 24 * time.Hour
	} else if d, err := time.ParseDuration(s); err == nil && d >= 0 && d <= MaxAgeDays*24*time.Hour {
		age = d
	} else {
		return time.Time{}, fmt.Errorf("%w: %q: want RFC 3339 (2026-12-01T10:00:00Z), a date (2026-12-01) or an age (90m, 24h, 7d, 2w)", ErrWhen, s)
	}
	return now.Add(-age).UTC(), nil
}

// cutDays reads "7d" or "2w": a whole number of at most 7 digits and its
// unit.
func cutDays(s string) (n int64, unit byte, ok bool) {
	if len(s) < 2 || len(s) > 8 {
		return 0, 0, false
	}
	unit = s[len(s)-1]
	if unit != 'd' && unit != 'w' {
		return 0, 0, false
	}
	for i := 0; i < len(s)-1; i++ {
		if s[i] < '0' || s[i] > '9' {
			return 0, 0, false
		}
		n = n*10 + int64(s[i]-'0')
	}
	return n, unit, true
}
