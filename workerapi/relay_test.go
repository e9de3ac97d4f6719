package workerapi

import (
	"context"
	"testing"
)

// woken reports which of ws hold a wake-up, and takes it.
func woken(ws ...*waiter) []int {
	var out []int
	for i, w := range ws {
		select {
		case <-w.c:
			out = append(out, i)
		default:
		}
	}
	return out
}

// awaitWoken waits until one of three waiters holds a wake-up and
// returns which, failing if another holds one too.
func awaitWoken(t *testing.T, ws ...*waiter) int {
	t.Helper()
	var i int
	select {
	case <-ws[0].c:
	case <-ws[1].c:
		i = 1
	case <-ws[2].c:
		i = 2
	}
	if more := woken(ws...); len(more) > 0 {
		t.Fatalf("waiters %d and %v woken, want one", i, more)
	}
	return i
}

// A notification wakes one waiter of a class; one that leaves unused
// hands its wake-up on, one at its live-lease limit that found nothing
// too, one with a free slot that found nothing ends the turn, and one
// that claimed a job wakes the next, not itself.
func TestRelayTurns(t *testing.T) {
	t.Parallel()
	n := NewLocalNotifier()
	r := newRelay(n)
	ws := []*waiter{r.join(), r.join(), r.join()}
	for i, w := range ws {
		r.done(w, "class", 0, true, i == 1)
	}
	notify := func() {
		if err := n.Notify(context.Background()); err != nil {
			t.Fatal(err)
		}
	}
	notify()
	first := awaitWoken(t, ws...)
	if first != 0 {
		t.Fatalf("waiter %d woken first, want 0 (the longest waiting)", first)
	}
	r.leave(ws[0])
	if got := woken(ws...); len(got) != 1 || got[0] != 1 {
		t.Fatalf("after the woken waiter left: %v woken, want [1]", got)
	}
	// Waiter 1 is at its limit: finding nothing proves nothing.
	r.done(ws[1], "class", 0, false, false)
	if got := woken(ws...); len(got) != 1 || got[0] != 2 {
		t.Fatalf("after the full waiter found nothing: %v woken, want [2]", got)
	}
	r.done(ws[2], "class", 0, false, false)
	if got := woken(ws...); len(got) != 0 {
		t.Fatalf("after a waiter with a slot found nothing: %v woken, want none", got)
	}
	// One that claims a job wakes the next (it went last when woken),
	// and leaving wakes no one more.
	notify()
	i := awaitWoken(t, ws...)
	r.done(ws[i], "class", 1, false, false)
	if got, want := woken(ws...), 3-i; len(got) != 1 || got[0] != want {
		t.Fatalf("after waiter %d claimed a job: %v woken, want [%d]", i, got, want)
	}
	r.leave(ws[i])
	if got := woken(ws...); len(got) != 0 {
		t.Fatalf("after the waiter that claimed left: %v woken, want none", got)
	}
	r.leave(ws[3-i])
	if r.count != 0 || r.cancel != nil || len(r.classes) != 0 {
		t.Errorf("relay after every waiter left: count %d, subscribed %t, %d classes", r.count, r.cancel != nil, len(r.classes))
	}
}
