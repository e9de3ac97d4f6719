// Package waitfor lets a test wait for a condition another goroutine or
// process brings about: a row written, a long-poll parked, a process
// gone. It replaces hand-rolled deadline loops and sleeps that guess how
// long something takes. The deadline is a failure bound, never a pacing:
// a condition that holds returns at once.
package waitfor

import (
	"testing"
	"time"
)

// Deadline is how long Until waits before it fails the test. It is
// generous because the machines that run the suite are shared and slow
// under the race detector; a passing test never waits for it.
const Deadline = 30 * time.Second

// Until calls cond until it reports true and fails the test (t.Fatalf,
// naming what) if it has not after Deadline. It polls with a backoff
// from 1 ms to 50 ms, so that a condition that is met soon is seen soon.
func Until(t testing.TB, what string, cond func() bool) {
	t.Helper()
	if !poll(Deadline, cond) {
		t.Fatalf("waited %v for %s", Deadline, what)
	}
}

// Within is Until with a deadline of d, for a test whose point is that
// something happens within d (a shim's kill grace, a lease expiry).
func Within(t testing.TB, d time.Duration, what string, cond func() bool) {
	t.Helper()
	if !poll(d, cond) {
		t.Fatalf("waited %v for %s", d, what)
	}
}

// Receive returns the next value of c, failing the test (naming what)
// if none arrives within Deadline.
func Receive[T any](t testing.TB, what string, c <-chan T) T {
	t.Helper()
	timer := time.NewTimer(Deadline)
	defer timer.Stop()
	select {
	case v := <-c:
		return v
	case <-timer.C:
		t.Fatalf("waited %v for %s", Deadline, what)
		var zero T
		return zero
	}
}

// poll reports whether cond held within d.
func poll(d time.Duration, cond func() bool) bool {
	deadline := time.Now().Add(d)
	pause := time.Millisecond
	for !cond() {
		if time.Now().After(deadline) {
			return false
		}
		time.Sleep(pause)
		pause = min(2*pause, 50*time.Millisecond)
	}
	return true
}
