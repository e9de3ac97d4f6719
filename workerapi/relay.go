package workerapi

import (
	"fmt"
	"slices"
	"sync"

	"github.com/nodelane/nodelane/lease"
)

// relay hands the Notifier's wake-ups to a Server's waiting long-polls
// without waking them all: thirty long-polls woken for one job cost
// thirty claims, of which one finds it.
//
// The long-polls whose claims consider the same jobs (equal types, fits
// and tags of lease.ClaimQuery: a class) take turns. A notification
// wakes one idle waiter of each class. A woken waiter that claims a job
// wakes the next, for there may be more; one that claims nothing with a
// free slot ends the turn, for no job of its class was left to claim.
// One at its live-lease limit, or one that leaves before it claimed,
// hands the wake-up on. A notification that finds every waiter of a
// class busy is owed to the first that is done. A waiter not yet
// classed (its first attempt has not planned a claim) is woken by every
// notification, as every waiter is when the Notifier is not a
// SignalNotifier: then a ban's Notify must reach the banned worker's
// long-poll.
type relay struct {
	n       Notifier
	signals bool // n is a SignalNotifier

	mu      sync.Mutex
	count   int    // waiters joined
	cancel  func() // ends the subscription; nil while count is 0
	loose   map[*waiter]struct{}
	classes map[string]*class
}

// class is the waiters of one class, the next to wake first.
type class struct {
	key  string
	q    []*waiter
	owed bool // a wake-up found every waiter busy
}

// waiter is one waiting long-poll.
type waiter struct {
	c     chan struct{} // holds one wake-up
	class *class        // nil: loose
	woken bool          // woken and not yet done
	full  bool          // at its live-lease limit at its first attempt
	own   bool          // the Notifier cannot signal its worker
}

func newRelay(n Notifier) *relay {
	_, signals := n.(SignalNotifier)
	return &relay{n: n, signals: signals, loose: map[*waiter]struct{}{}, classes: map[string]*class{}}
}

// classKey is the class of the claims q plans.
func classKey(q lease.ClaimQuery) string {
	types := slices.Clone(q.Types)
	slices.Sort(types)
	return fmt.Sprintf("%q %v %q", types, q.Fits, q.Tags)
}

// join adds a waiter, loose until its first report, and subscribes to
// the Notifier if no one was waiting: a notification from then on
// reaches it.
func (r *relay) join() *waiter {
	w := &waiter{c: make(chan struct{}, 1), own: !r.signals}
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.count == 0 {
		ch, cancel := r.n.Subscribe()
		done := make(chan struct{})
		go r.run(ch, done)
		r.cancel = func() { cancel(); close(done) }
	}
	r.count++
	r.loose[w] = struct{}{}
	return w
}

func (r *relay) run(ch <-chan struct{}, done <-chan struct{}) {
	for {
		select {
		case <-ch:
			r.notified()
		case <-done:
			return
		}
	}
}

// notified wakes every loose waiter and one of each class.
func (r *relay) notified() {
	r.mu.Lock()
	defer r.mu.Unlock()
	for w := range r.loose {
		w.wake()
	}
	for _, c := range r.classes {
		c.next()
	}
}

// next wakes the first idle waiter of c and moves it last, or owes the
// wake-up if every one is busy.
func (c *class) next() {
	i := slices.IndexFunc(c.q, func(w *waiter) bool { return !w.woken })
	if i < 0 {
		c.owed = true
		return
	}
	w := c.q[i]
	c.q = append(slices.Delete(c.q, i, i+1), w)
	w.woken = true
	w.wake()
}

func (w *waiter) wake() {
	select {
	case w.c <- struct{}{}:
	default:
	}
}

// done reports an attempt of w: the class its claim planned ("" if
// none), how many jobs it claimed, and whether it was the first attempt
// and found the worker at its live-lease limit.
func (r *relay) done(w *waiter, key string, claimed int, first, full bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if first {
		w.full = full
	}
	woken := w.woken
	w.woken = false
	if key != "" && !w.own && (w.class == nil || w.class.key != key) {
		r.remove(w)
		c := r.classes[key]
		if c == nil {
			c = &class{key: key}
			r.classes[key] = c
		}
		w.class = c
		c.q = append(c.q, w)
	}
	c := w.class
	if c == nil {
		return
	}
	if claimed > 0 || woken && w.full || c.owed {
		c.owed = false
		c.next()
	}
}

// leave removes w, handing on a wake-up it did not use, and ends the
// subscription when no one waits.
func (r *relay) leave(w *waiter) {
	r.mu.Lock()
	defer r.mu.Unlock()
	c := w.class
	r.remove(w)
	if c != nil && w.woken {
		c.next()
	}
	if r.count--; r.count == 0 {
		r.cancel()
		r.cancel = nil
	}
}

// remove takes w out of its class (dropping a class left empty) or the
// loose waiters.
func (r *relay) remove(w *waiter) {
	c := w.class
	if c == nil {
		delete(r.loose, w)
		return
	}
	c.q = slices.DeleteFunc(c.q, func(x *waiter) bool { return x == w })
	if len(c.q) == 0 {
		delete(r.classes, c.key)
	}
	w.class = nil
}
