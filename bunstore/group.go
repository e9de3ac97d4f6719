package bunstore

import (
	"context"
	"errors"
	"fmt"

	"github.com/uptrace/bun"
)

// sharedCall is one caller's work in a shared transaction (InSharedTx).
type sharedCall struct {
	ctx context.Context
	key string
	fn  func(ctx context.Context) error
}

// maxShared bounds the callers of one shared transaction. Each runs in a
// savepoint, a subtransaction, and PostgreSQL caches 64 subtransactions
// of a transaction; past that, every backend's snapshots slow down.
const maxShared = 32

// sharedParallel is how many shared transactions run at once on
// PostgreSQL; on SQLite, which has one writer, one does.
const sharedParallel = 8

// InSharedTx runs fn in a transaction it may share with concurrent
// callers of InSharedTx, so that they pay one commit between them (the
// interface workerapi.SharedTransactor). fn's writes are atomic: each
// caller's fn runs in a savepoint of its own, and fn's error undoes only
// fn's writes and is only this caller's. InSharedTx returns once the
// shared transaction has ended; a failed commit is every caller's error.
// A caller that finds no transaction running runs alone, as in InTx.
//
// Calls with the same key never run in two shared transactions at once
// (several run at once on PostgreSQL): key names what fn locks that other
// calls with the key lock too (the workerapi Server passes the node,
// whose nonce row every request of the node writes), so that two shared
// transactions never wait for each other in opposite orders there, a
// deadlock.
//
// fn runs with ctx's values, in the transaction, but ctx's cancellation
// does not reach its statements, which would break the connection under
// the other callers' work; instead fn's statements give up after
// Config.BusyTimeout. A caller whose ctx is done before fn's turn comes is
// left out with ctx's error. If ctx already carries a transaction, fn
// joins it, as in InTx.
func (db *DB) InSharedTx(ctx context.Context, key string, fn func(ctx context.Context) error) error {
	if _, ok := txFrom(ctx); ok {
		return fn(ctx)
	}
	err, gerr := db.shared.do(ctx, sharedCall{ctx, key, fn})
	if gerr != nil {
		err = gerr
	}
	if p := (sharedPanic{}); errors.As(err, &p) {
		panic(p.v)
	}
	return err
}

// runShared is the batcher's run for InSharedTx: one transaction, on
// SQLite a writer holding the write slot (inTx), with a savepoint for
// each call; its result is each call's own error, and its error the
// transaction's, which ends every call.
func (db *DB) runShared(ctx context.Context, calls []sharedCall) ([]error, error) {
	errs := make([]error, len(calls))
	if len(calls) == 1 {
		// Alone, the call runs as in InTx, canceled with its context.
		c := calls[0]
		errs[0] = db.InTx(c.ctx, func(ctx context.Context) error { return guard(ctx, c.fn) })
		return errs, nil
	}
	err := db.inTx(ctx, func(ctx context.Context, _ bun.IDB) error {
		tx, _ := txFrom(ctx)
		sp := savepoint{ctx: ctx, tx: tx}
		for i, c := range calls {
			if c.ctx.Err() != nil {
				errs[i] = context.Cause(c.ctx)
				continue
			}
			cctx, cancel := context.WithTimeout(context.WithoutCancel(c.ctx), db.cfg.BusyTimeout)
			cctx = context.WithValue(WithTx(cctx, tx), txChangesKey{}, ctx.Value(txChangesKey{}))
			var broken error
			errs[i], broken = sp.run(func() error { return guard(cctx, c.fn) })
			cancel()
			if broken != nil {
				return broken
			}
		}
		return nil
	})
	return errs, err
}

// savepoint runs the calls of a shared transaction, each in the savepoint
// nodelane_call of tx, statements run with ctx. The savepoint is set once
// before the first call, and after each call released and set again in
// one round trip, or, if the call failed, rolled back to, which keeps it
// set; the commit drops the last one.
type savepoint struct {
	ctx context.Context
	tx  bun.Tx
	set bool
}

// run runs fn in the savepoint and returns fn's error, fn's writes undone
// if it failed, and broken, the error of a savepoint statement, after
// which the transaction cannot go on.
func (sp *savepoint) run(fn func() error) (err, broken error) {
	if !sp.set {
		if _, broken = sp.tx.ExecContext(sp.ctx, "SAVEPOINT nodelane_call"); broken != nil {
			return broken, broken
		}
		sp.set = true
	}
	if err = fn(); err == nil {
		// RELEASE fails if fn ignored a statement's error, which on
		// PostgreSQL fails the transaction until the savepoint's rollback;
		// the SAVEPOINT after it then does not run. The statements have no
		// arguments: the drivers send them as one.
		if _, err = sp.tx.ExecContext(sp.ctx, "RELEASE SAVEPOINT nodelane_call; SAVEPOINT nodelane_call"); err == nil {
			return nil, nil
		}
	}
	_, broken = sp.tx.ExecContext(sp.ctx, "ROLLBACK TO SAVEPOINT nodelane_call")
	return err, broken
}

// sharedPanic carries a panic out of a call's fn, run by another caller
// (the one that leads the shared transaction), to the call's own
// caller, which panics with it.
type sharedPanic struct{ v any }

func (p sharedPanic) Error() string { return fmt.Sprintf("bunstore: panic: %v", p.v) }

// guard runs fn, and returns its panic as a sharedPanic.
func guard(ctx context.Context, fn func(ctx context.Context) error) (err error) {
	defer func() {
		if v := recover(); v != nil {
			err = sharedPanic{v}
		}
	}()
	return fn(ctx)
}
