package waitfor

import (
	"sync/atomic"
	"testing"
	"time"
)

// TestPoll checks that poll returns as soon as the condition holds, and
// reports false once the deadline passes without it.
func TestPoll(t *testing.T) {
	t.Parallel()
	var n atomic.Int32
	if !poll(time.Minute, func() bool { return n.Add(1) == 5 }) {
		t.Fatal("poll gave up on a condition that held on the fifth call")
	}
	if got := n.Load(); got != 5 {
		t.Errorf("cond called %d times, want 5", got)
	}
	if poll(20*time.Millisecond, func() bool { return false }) {
		t.Error("poll reported a condition that never held")
	}
}

// TestReceive checks that Receive returns the value sent.
func TestReceive(t *testing.T) {
	t.Parallel()
	c := make(chan int, 1)
	c <- 7
	if got := Receive(t, "the value", c); got != 7 {
		t.Errorf("Receive = %d, want 7", got)
	}
}
