package workerapitest

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nodelane/nodelane/lease"
	"github.com/nodelane/nodelane/workerapi"
)

// The case of aborted transactions: once a store call inside InTx has
// returned its core's ErrAborted, nothing more of that transaction
// commits, and InTx runs its function once.

// serialWait is how long the case waits for its second transaction to
// start and to make its first write while the first transaction holds
// its own, before it concludes that the store's writers serialize.
const serialWait = 2 * time.Second

var (
	// errSerialized is what the second transaction's function returns
	// when it starts after the case concluded that writers serialize.
	errSerialized = errors.New("workerapitest: the store's writers serialize, so this transaction does nothing")
	// errRanAgain is what a function of the case returns when InTx runs
	// it a second time.
	errRanAgain = errors.New("workerapitest: InTx ran its function a second time")
)

// deadlockSide is one of the case's two transactions.
type deadlockSide struct {
	name string
	// first and second are the jobs it updates, in that order.
	first, second string
	// priority marks its updates: the Priority they write.
	priority int
	// after is the job it creates once a store call returned ErrAborted.
	after string

	runs      atomic.Int32 // how often InTx ran its function
	secondErr error        // the update of second's
	err       error        // InTx's
}

// update makes d's update of job id, from its committed revision 1.
func (d *deadlockSide) update(ctx context.Context, s lease.Store, id string) error {
	j := newJob(id, "status_check")
	j.Priority, j.Rev = d.priority, 2
	return s.UpdateJob(ctx, j, 1)
}

// finish updates d.second, and after an abort carries on as a careless
// caller would: it creates d.after, ignoring the error, and returns nil.
func (d *deadlockSide) finish(ctx context.Context, s lease.Store) error {
	d.secondErr = d.update(ctx, s, d.second)
	if !errors.Is(d.secondErr, lease.ErrAborted) {
		return d.secondErr
	}
	_ = s.CreateJobs(ctx, []*lease.Job{newJob(d.after, "status_check")})
	return nil
}

// aborted reports whether the database aborted d's transaction.
func (d *deadlockSide) aborted() bool { return errors.Is(d.secondErr, lease.ErrAborted) }

func testNothingCommitsAfterAbort(t *testing.T, ctx context.Context, st workerapi.Stores) {
	s := st.Leases
	a, b := name("locked-job", 0), name("locked-job", 1)
	if err := s.CreateJobs(ctx, []*lease.Job{newJob(a, "status_check"), newJob(b, "status_check")}); err != nil {
		t.Fatalf("setting up, outside any transaction: CreateJobs: %v", err)
	}
	tx1 := &deadlockSide{name: "transaction 1", first: a, second: b, priority: 1, after: name("after-abort-job", 0)}
	tx2 := &deadlockSide{name: "transaction 2", first: b, second: a, priority: 2, after: name("after-abort-job", 1)}

	wrote1 := make(chan error, 1)   // transaction 1's first update
	started2 := make(chan struct{}) // transaction 2's function started
	wrote2 := make(chan error, 1)   // transaction 2's first update, made in time
	gaveUp := make(chan struct{})   // closed once writers are seen to serialize
	proceed := make(chan struct{})  // closed to make the second updates
	release := sync.OnceFunc(func() { close(proceed) })
	defer release() // should the case fail first
	done1, done2 := make(chan struct{}), make(chan struct{})

	go func() {
		defer close(done1)
		tx1.err = st.Tx.InTx(ctx, func(ctx context.Context) error {
			if tx1.runs.Add(1) > 1 {
				return errRanAgain
			}
			err := tx1.update(ctx, s, tx1.first)
			wrote1 <- err
			if err != nil {
				return err
			}
			<-proceed
			return tx1.finish(ctx, s)
		})
	}()
	select {
	case err := <-wrote1:
		if err != nil {
			t.Fatalf("%s: UpdateJob of %s inside InTx: %v", tx1.name, a, err)
		}
	case <-done1:
		select {
		case err := <-wrote1:
			t.Fatalf("%s: UpdateJob of %s inside InTx: %v", tx1.name, a, err)
		default:
			t.Fatalf("%s: InTx returned %v before its function updated %s", tx1.name, tx1.err, a)
		}
	}

	go func() {
		defer close(done2)
		tx2.err = st.Tx.InTx(ctx, func(ctx context.Context) error {
			if tx2.runs.Add(1) > 1 {
				return errRanAgain
			}
			select {
			case started2 <- struct{}{}:
			case <-gaveUp:
				return errSerialized
			}
			wctx, cancel := context.WithTimeout(ctx, serialWait)
			err := tx2.update(wctx, s, tx2.first)
			if wctx.Err() != nil {
				err = fmt.Errorf("did not complete within %v: %w", serialWait, errors.Join(err, wctx.Err()))
			}
			cancel()
			wrote2 <- err
			if err != nil {
				return err
			}
			<-proceed
			select {
			case <-gaveUp: // closed before proceed, if at all
				return errSerialized
			default:
			}
			return tx2.finish(ctx, s)
		})
	}()

	// serial says why the writers serialize, if they do.
	var serial string
	timer := time.NewTimer(serialWait)
	defer timer.Stop()
	select {
	case <-started2:
		// Its update has serialWait of its own.
		timer.Reset(serialWait)
		select {
		case err := <-wrote2:
			if err != nil {
				serial = fmt.Sprintf("%s's UpdateJob of %s, while %s held its update of %s: %v", tx2.name, b, tx1.name, a, err)
			}
		case <-timer.C:
			serial = fmt.Sprintf("%s's UpdateJob of %s, while %s held its update of %s, did not return within %v", tx2.name, b, tx1.name, a, serialWait)
		}
	case <-done2:
		serial = fmt.Sprintf("%s's InTx returned (%v) before its function started, while %s was open", tx2.name, tx2.err, tx1.name)
	case <-timer.C:
		serial = fmt.Sprintf("%s's function did not start within %v while %s was open", tx2.name, serialWait, tx1.name)
	}
	if serial != "" {
		close(gaveUp)
	}
	release()
	for _, done := range []chan struct{}{done1, done2} {
		select {
		case <-done:
		case <-ctx.Done():
			t.Fatalf("InTx did not return within the case's %v", caseTimeout)
		}
	}
	if serial != "" {
		t.Logf("not exercised: the writers serialize, so no deadlock is possible (%s)", serial)
		return
	}

	sides := []*deadlockSide{tx1, tx2}
	for _, d := range sides {
		if n := d.runs.Load(); n != 1 {
			t.Errorf("%s: InTx ran its function %d times, want once: it never runs it again after an abort", d.name, n)
		}
	}
	if !tx1.aborted() && !tx2.aborted() {
		t.Logf("not exercised: neither transaction's second UpdateJob returned lease.ErrAborted (%s: %v; %s: %v), so the store did not deadlock",
			tx1.name, tx1.secondErr, tx2.name, tx2.secondErr)
		return
	}
	job := func(id string) *lease.Job {
		j, err := s.GetJob(ctx, id)
		if err != nil && !errors.Is(err, lease.ErrNotFound) {
			t.Fatalf("GetJob(%s) after both InTx returned: %v", id, err)
		}
		return j
	}
	for _, d := range sides {
		if !d.aborted() {
			if d.secondErr != nil || d.err != nil {
				t.Errorf("%s, which the database did not abort: its UpdateJob of %s returned %v and its InTx %v, want both nil: the other transaction's abort frees it to commit",
					d.name, d.second, d.secondErr, d.err)
			}
			for _, id := range []string{d.first, d.second} {
				if j := job(id); j == nil || j.Priority != d.priority || j.Rev != 2 {
					t.Errorf("%s, which InTx committed: its update of %s is not there", d.name, id)
				}
			}
			continue
		}
		if d.err == nil {
			t.Errorf("%s: InTx returned nil, although UpdateJob of %s inside it returned lease.ErrAborted (%v) before its function returned nil: InTx must return an error for a transaction the database aborted",
				d.name, d.second, d.secondErr)
		}
		if job(d.after) != nil {
			t.Errorf("%s: job %s, which its function created after UpdateJob of %s returned lease.ErrAborted, was committed: after an abort nothing more of the transaction may commit (every later store call with its context must fail)",
				d.name, d.after, d.second)
		}
		if j := job(d.first); j != nil && j.Priority == d.priority {
			t.Errorf("%s: its update of %s, made before the database aborted it, was committed", d.name, d.first)
		}
	}
}
