package testclock_test

import (
	"sync"
	"testing"
	"time"

	"github.com/nodelane/nodelane/internal/testclock"
)

// start has a nanosecond part and a zone, which the clock must keep.
var start = time.Date(2026, 11, 30, 9, 0, 0, 123456789, time.FixedZone("CET", 3600))

func TestClock(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name string
		move func(c *testclock.Clock)
		want time.Time
	}{
		{"unmoved", func(*testclock.Clock) {}, start},
		{"advance", func(c *testclock.Clock) { c.Advance(1500 * time.Nanosecond) }, start.Add(1500 * time.Nanosecond)},
		{"advance twice", func(c *testclock.Clock) { c.Advance(time.Hour); c.Advance(time.Minute) }, start.Add(time.Hour + time.Minute)},
		{"advance back", func(c *testclock.Clock) { c.Advance(-time.Minute) }, start.Add(-time.Minute)},
		{"set", func(c *testclock.Clock) { c.Set(start.Add(48 * time.Hour)) }, start.Add(48 * time.Hour)},
		{"set then advance", func(c *testclock.Clock) { c.Set(time.Unix(0, 0).UTC()); c.Advance(time.Second) }, time.Unix(1, 0).UTC()},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			c := testclock.New(start)
			tc.move(c)
			got := c.Now()
			if !got.Equal(tc.want) || got.Location() != tc.want.Location() {
				t.Fatalf("Now() = %v, want %v", got, tc.want)
			}
			if again := c.Now(); again != got {
				t.Fatalf("Now() moved by itself: %v, then %v", got, again)
			}
		})
	}
}

func TestZeroClock(t *testing.T) {
	t.Parallel()
	var c testclock.Clock
	if got := c.Now(); !got.IsZero() {
		t.Fatalf("zero Clock reads %v, want the zero time", got)
	}
}

// TestConcurrent moves and reads one clock from many goroutines: under
// -race it shows the clock is safe for concurrent use, and no step is lost.
func TestConcurrent(t *testing.T) {
	t.Parallel()
	const goroutines, steps = 8, 1000
	c := testclock.New(start)
	var wg sync.WaitGroup
	for range goroutines {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range steps {
				before := c.Now()
				c.Advance(time.Microsecond)
				if c.Now().Before(before) {
					t.Error("a forward-only clock went back")
					return
				}
			}
		}()
	}
	wg.Wait()
	if got, want := c.Now(), start.Add(goroutines*steps*time.Microsecond); !got.Equal(want) {
		t.Fatalf("after %d steps Now() = %v, want %v", goroutines*steps, got, want)
	}
}

// A following clock reads real time plus its advances; Set fixes it and
// Follow lets it follow again.
func TestReal(t *testing.T) {
	t.Parallel()
	c := testclock.Real()
	within := func(name string, got, want time.Time) {
		t.Helper()
		if d := got.Sub(want); d < -time.Minute || d > time.Minute {
			t.Errorf("%s: Now() = %v, want about %v", name, got, want)
		}
	}
	within("real", c.Now(), time.Now())
	c.Advance(10 * time.Hour)
	within("advanced", c.Now(), time.Now().Add(10*time.Hour))
	c.Set(start)
	if got := c.Now(); !got.Equal(start) {
		t.Errorf("set: Now() = %v, want %v", got, start)
	}
	c.Advance(time.Second)
	if got := c.Now(); !got.Equal(start.Add(time.Second)) {
		t.Errorf("set then advanced: Now() = %v, want %v", got, start.Add(time.Second))
	}
	c.Follow()
	within("following again", c.Now(), time.Now())
}
