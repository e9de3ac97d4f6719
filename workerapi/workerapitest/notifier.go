package workerapitest

import (
	"context"
	"fmt"
	"testing"

	"github.com/nodelane/nodelane/lease"
	"github.com/nodelane/nodelane/workerapi"
)

// The cases of the Notifier: Notify with a context that carries a
// transaction wakes no subscriber before that transaction commits, and
// wakes every subscriber once it has committed.

func testNotifyWithoutTx(t *testing.T, ctx context.Context, st workerapi.Stores) {
	ch, cancel := st.Notifier.Subscribe()
	defer cancel()
	if err := st.Notifier.Notify(ctx); err != nil {
		t.Fatalf("Notify with a context that carries no transaction: %v", err)
	}
	awaitWakeUp(t, ctx, ch, "after Notify with a context that carries no transaction")
}

func testNotifyAfterCommit(t *testing.T, ctx context.Context, st workerapi.Stores) {
	ch, cancel := st.Notifier.Subscribe()
	defer cancel()
	if err := notifyInTx(ctx, st, name("notified-job", 0), nil); err != nil {
		t.Fatal(err)
	}
	awaitWakeUp(t, ctx, ch, "after the InTx whose function created a job and called Notify committed")
}

func testNotifyNotBeforeCommit(t *testing.T, ctx context.Context, st workerapi.Stores) {
	id := name("notified-job", 0)
	// visible reports whether the job is there outside the transaction
	// (ctx carries none), as a woken long-poll would look for it.
	visible := func() (bool, error) {
		_, err := st.Leases.GetJob(ctx, id)
		return present(err, lease.ErrNotFound)
	}
	// early is looked at inside the transaction, late by a subscriber of
	// its own, which looks for the job once woken.
	early, cancelEarly := st.Notifier.Subscribe()
	defer cancelEarly()
	late, cancelLate := st.Notifier.Subscribe()
	defer cancelLate()
	type look struct {
		seen bool
		err  error
	}
	looked := make(chan look, 1)
	go func() {
		select {
		case <-late:
			seen, err := visible()
			looked <- look{seen, err}
		case <-ctx.Done():
			looked <- look{err: fmt.Errorf("no wake-up after the commit within the case's %v: %w", caseTimeout, context.Cause(ctx))}
		}
	}()
	err := notifyInTx(ctx, st, id, func() {
		select {
		case <-early:
		default:
			return
		}
		switch seen, err := visible(); {
		case err != nil:
			t.Errorf("right after Notify returned, inside the transaction, a subscriber was woken, and its GetJob outside the transaction failed: %v", err)
		case !seen:
			t.Errorf("right after Notify returned, inside the transaction, a subscriber was already woken, and GetJob outside the transaction did not see the job: the Notifier woke before the commit")
		}
	})
	if err != nil {
		t.Fatal(err)
	}
	switch l := <-looked; {
	case l.err != nil:
		t.Errorf("a subscriber's look for the job: %v", l.err)
	case !l.seen:
		t.Errorf("a subscriber woken by Notify did not see the job through GetJob outside the transaction: the Notifier woke before the commit")
	}
}

// notifyInTx runs an InTx whose function creates job id, calls Notify,
// calls then (if not nil) and returns nil. It returns an error unless
// every call succeeded and InTx returned nil.
func notifyInTx(ctx context.Context, st workerapi.Stores, id string, then func()) error {
	var failed error
	err := st.Tx.InTx(ctx, func(ctx context.Context) error {
		if err := st.Leases.CreateJobs(ctx, []*lease.Job{newJob(id, "status_check")}); err != nil {
			failed = fmt.Errorf("calling CreateJobs inside InTx: %w", err)
			return failed
		}
		if err := st.Notifier.Notify(ctx); err != nil {
			failed = fmt.Errorf("calling Notify inside InTx: %w", err)
			return failed
		}
		if then != nil {
			then()
		}
		return nil
	})
	if failed != nil {
		return failed
	}
	if err != nil {
		return fmt.Errorf("InTx returned %v, want nil: its function returned nil", err)
	}
	return nil
}

// awaitWakeUp fails t unless ch receives before ctx ends.
func awaitWakeUp(t *testing.T, ctx context.Context, ch <-chan struct{}, when string) {
	t.Helper()
	select {
	case <-ch:
	case <-ctx.Done():
		t.Fatalf("no wake-up %s, within the case's %v", when, caseTimeout)
	}
}
