package wire

import (
	"errors"
	"testing"
	"time"
)

func TestParseWhen(t *testing.T) {
	t.Parallel()
	now := time.Date(2026, 12, 5, 12, 0, 0, 0, time.UTC)
	for in, want := range map[string]time.Time{
		"2026-12-01T10:00:00Z":      time.Date(2026, 12, 1, 10, 0, 0, 0, time.UTC),
		"2026-12-01T11:00:00+01:00": time.Date(2026, 12, 1, 10, 0, 0, 0, time.UTC),
		"2026-12-01T10:00:00.5Z":    time.Date(2026, 12, 1, 10, 0, 0, 5e8, time.UTC),
		"2026-12-01":                time.Date(2026, 12, 1, 0, 0, 0, 0, time.UTC),
		"90m":                       now.Add(-90 * time.Minute),
		"24h":                       now.Add(-24 * time.Hour),
		"0s":                        now,
		"7d":                        now.Add(-7 * 24 * time.Hour),
		"2w":                        now.Add(-14 * 24 * time.Hour),
		"100000d":                   now.Add(-100000 * 24 * time.Hour),
	} {
		if got, err := ParseWhen(in, now); err != nil || !got.Equal(want) || got.Location() != time.UTC {
			t.Errorf("ParseWhen(%q) = %v, %v; want %v", in, got, err, want)
		}
	}
	for _, bad := range []string{"", "yesterday", "-24h", "7x", "d", "1.5d", "100001d", "14286w", "99999999d", "7", "-1d", "2401000h", "2026-13-01", "12/01/2026"} {
		if got, err := ParseWhen(bad, now); !errors.Is(err, ErrWhen) {
			t.Errorf("ParseWhen(%q) = %v, %v; want ErrWhen", bad, got, err)
		}
	}
}
