package bunstore

import (
	"context"
	"errors"
	"fmt"

	"modernc.org/sqlite"
	sqlite3 "modernc.org/sqlite/lib"
)

// The translation of aborted transactions, shared by every store: each
// core's ErrAborted means the database aborted the transaction and kept
// nothing of it, so only running the whole transaction again can succeed.

// abortTries bounds how often a store method runs its work, in a
// transaction of its own, while the database keeps aborting it.
const abortTries = 3

// isAborted reports whether err is the database aborting the transaction:
// on PostgreSQL a serialization failure (SQLSTATE 40001) or a deadlock
// (40P01), from pgx or any driver that reports its SQLSTATE; on SQLite
// SQLITE_BUSY_SNAPSHOT, a deferred transaction that read a WAL snapshot
// another writer has since moved past, so it can never write (Open's
// IMMEDIATE transactions never meet it; a host's handle may). Plain
// SQLITE_BUSY is left alone: it is a timeout as often as a deadlock, and
// Open's busy timeout keeps it from surfacing.
func isAborted(err error) bool {
	var pe interface{ SQLState() string }
	if errors.As(err, &pe) {
		code := pe.SQLState()
		return code == "40001" || code == "40P01"
	}
	var se *sqlite.Error
	return errors.As(err, &se) && se.Code() == sqlite3.SQLITE_BUSY_SNAPSHOT
}

// markAborted returns err so that it also matches sentinel, a core
// package's ErrAborted, when the database aborted the transaction, and err
// as it is otherwise.
func markAborted(err, sentinel error) error {
	if err != nil && isAborted(err) && !errors.Is(err, sentinel) {
		return fmt.Errorf("%w: %w", sentinel, err)
	}
	return err
}

// failed returns nil if err is nil, and otherwise err as the error of a
// store method: "bunstore: ", what (format and args) and err, marked as
// markAborted does with sentinel.
func failed(err, sentinel error, format string, args ...any) error {
	if err == nil {
		return nil
	}
	return fmt.Errorf("bunstore: %s: %w", fmt.Sprintf(format, args...), markAborted(err, sentinel))
}

// retryOwnTx runs fn, a store method's whole work, and runs it again, up
// to abortTries times in all, while the database aborts it; but only when
// ctx carries no transaction. A transaction the context carries is lost
// once aborted (PostgreSQL refuses every later statement of it), so only
// its owner can run it again, from its beginning.
func (db *DB) retryOwnTx(ctx context.Context, fn func() error) error {
	if _, ok := txFrom(ctx); ok {
		return fn()
	}
	var err error
	for range abortTries {
		if err = fn(); err == nil || !isAborted(err) || ctx.Err() != nil {
			return err
		}
	}
	return err
}
