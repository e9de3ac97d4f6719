package pollnotify

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
)

// Counter is the database part of a Notifier: one number, shared by every
// replica, that each Notify adds to and each replica's Notifier reads.
type Counter interface {
	// Bump adds one to the counter in the transaction ctx carries, if
	// any, so that the change commits with that transaction and vanishes
	// with its rollback; with none, it commits the change on its own
	// before it returns.
	Bump(ctx context.Context) error
	// Read returns the counter's committed value, never from inside a
	// transaction of ctx's. It may be called concurrently with Bump.
	Read(ctx context.Context) (int64, error)
}

// ErrNoRow reports that a SQLCounter's table has no row 1: the table was
// made without its row (see SQLCounter.DDL).
var ErrNoRow = errors.New("pollnotify: the counter's row is missing")

// DefaultTable is the table of a SQLCounter made with no table name.
const DefaultTable = "nodelane_notify"

// Execer is what a SQLCounter needs of a database handle: the methods
// *sql.DB, *sql.Tx and *sql.Conn share, and bun's bun.IDB (a *bun.DB,
// bun.Tx or bun.Conn) too.
type Execer interface {
	ExecContext(ctx context.Context, query string, args ...any) (sql.Result, error)
	QueryRowContext(ctx context.Context, query string, args ...any) *sql.Row
}

// SQLCounter is a Counter in row 1 of a table of its own, for any
// database/sql driver. Its statements are plain SQL without placeholders
// or dialect, so that they run unchanged on PostgreSQL, MySQL, MariaDB and
// SQLite:
//
//	UPDATE <table> SET n = n + 1 WHERE id = 1   -- Bump
//	SELECT n FROM <table> WHERE id = 1          -- Read
//
// The table is made once, before the first Notifier starts (in the
// adapter's migrations, say), by the statements of DDL, which are the same
// on the three databases:
//
//	CREATE TABLE IF NOT EXISTS nodelane_notify (id INTEGER NOT NULL PRIMARY KEY, n BIGINT NOT NULL)
//	INSERT INTO nodelane_notify (id, n) SELECT 1, 0 WHERE NOT EXISTS (SELECT 1 FROM nodelane_notify WHERE id = 1)
//
// Cost: Bump is a write of one row in the caller's transaction, so
// transactions that notify serialize on that row from their Bump to their
// end (a row lock on PostgreSQL and InnoDB; SQLite has one writer at a
// time anyway). A workerapi.Server notifies where jobs may have become
// leasable: a dispatch (one Notify for a batch), an operator's retry of a
// job, a worker's approval, an envelope activation or change of safe
// types, and a lease that ends with its job queued again (a failure or
// release that requeues, a worker's restart or retirement that ends its
// leases, the maintainer's lease expiries, which notify after their own
// commits). Its signals to one worker (cancel, ban, retirement, drain)
// notify too, after the commit, since a Notifier of this package is not a
// workerapi.SignalNotifier. A lease, an accept, a heartbeat, a report or
// a completion that requeues nothing does not notify, and so does not
// touch the row.
//
// The row behaves as any row two transactions write: it can take part in
// a deadlock when they also lock other rows in different orders, and the
// database then aborts one of them. On PostgreSQL, run the transactions
// that notify at READ COMMITTED (the default): at REPEATABLE READ or
// SERIALIZABLE, a Bump after a concurrent one committed fails with a
// serialization error. On MySQL and MariaDB the table must be
// transactional (InnoDB, the default engine), or a Bump would commit at
// once and wake long-polls before the caller's commit. On SQLite, open
// the file in WAL mode with a busy timeout, so that Read does not fail
// while a writer commits (a failed Read costs a retry and a wake-up of
// every subscriber, see Notifier).
//
// A SQLCounter is safe for concurrent use.
type SQLCounter struct {
	db    Execer
	tx    func(ctx context.Context) (Execer, bool)
	table string
	bump  string
	read  string
}

// NewSQLCounter returns a SQLCounter on table (DefaultTable if empty),
// which Read reads through db, the pool: never in a transaction. tx
// returns the transaction ctx carries (a *sql.Tx, a bun.Tx, ...) and
// true, or false when ctx carries none; Bump writes through it then, and
// through db otherwise. A store that runs no transactions of its own
// passes a tx that always returns false. On MySQL and MariaDB, whose
// session goes on in autocommit once a deadlock rolled its transaction
// back, tx returns an Execer that refuses every statement after the
// abort, as the adapter's stores do (see workerapi.Transactor): a Bump
// that committed on its own would only wake long-polls needlessly, but
// nothing of an aborted transaction may commit.
//
// The table name is one identifier of ASCII letters, digits and
// underscores, not starting with a digit, or several joined by dots (a
// schema-qualified name), each at most 63 bytes; NewSQLCounter refuses
// any other with an error wrapping ErrConfig. It does not reach the
// database.
func NewSQLCounter(db Execer, table string, tx func(ctx context.Context) (Execer, bool)) (*SQLCounter, error) {
	if db == nil {
		return nil, fmt.Errorf("%w: NewSQLCounter: db is nil", ErrConfig)
	}
	if tx == nil {
		return nil, fmt.Errorf("%w: NewSQLCounter: tx is nil (a store without transactions passes one that returns false)", ErrConfig)
	}
	if table == "" {
		table = DefaultTable
	}
	if !validTable(table) {
		return nil, fmt.Errorf("%w: NewSQLCounter: table %q is not an identifier (ASCII letters, digits and underscores, dot-separated, at most 63 bytes each)", ErrConfig, table)
	}
	return &SQLCounter{
		db: db, tx: tx, table: table,
		bump: "UPDATE " + table + " SET n = n + 1 WHERE id = 1",
		read: "SELECT n FROM " + table + " WHERE id = 1",
	}, nil
}

// validTable reports whether s is one identifier or several joined by
// dots: a table name that needs no quoting on any of the databases.
func validTable(s string) bool {
	n := 0 // bytes of the current part
	for i := 0; i < len(s); i++ {
		switch c := s[i]; {
		case c == '.':
			if n == 0 {
				return false
			}
			n = 0
			continue
		case c == '_' || 'a' <= c && c <= 'z' || 'A' <= c && c <= 'Z':
		case '0' <= c && c <= '9':
			if n == 0 {
				return false
			}
		default:
			return false
		}
		if n++; n > 63 {
			return false
		}
	}
	return n > 0
}

// Table returns the counter's table.
func (c *SQLCounter) Table() string { return c.table }

// DDL returns the statements that make the counter's table and its row,
// to run once, in order, before the first Notifier starts (see
// SQLCounter). Both are no-ops when the table and row exist; two replicas
// that run them at the same moment may race on the row, so run them where
// the adapter runs its migrations.
func (c *SQLCounter) DDL() []string {
	return []string{
		"CREATE TABLE IF NOT EXISTS " + c.table + " (id INTEGER NOT NULL PRIMARY KEY, n BIGINT NOT NULL)",
		"INSERT INTO " + c.table + " (id, n) SELECT 1, 0 WHERE NOT EXISTS (SELECT 1 FROM " + c.table + " WHERE id = 1)",
	}
}

// Bump implements Counter: it updates the row in the transaction ctx
// carries (see NewSQLCounter), or on its own. A missing row is an error
// wrapping ErrNoRow.
func (c *SQLCounter) Bump(ctx context.Context) error {
	e, ok := c.tx(ctx)
	if !ok {
		e = c.db
	}
	res, err := e.ExecContext(ctx, c.bump)
	if err != nil {
		return fmt.Errorf("pollnotify: bump %s: %w", c.table, err)
	}
	n, err := res.RowsAffected()
	if err != nil {
		return fmt.Errorf("pollnotify: bump %s: %w", c.table, err)
	}
	if n == 0 {
		return fmt.Errorf("%w: bump %s updated no row", ErrNoRow, c.table)
	}
	return nil
}

// Read implements Counter: it reads the row through the pool. A missing
// row is an error wrapping ErrNoRow.
func (c *SQLCounter) Read(ctx context.Context) (int64, error) {
	var n int64
	err := c.db.QueryRowContext(ctx, c.read).Scan(&n)
	if errors.Is(err, sql.ErrNoRows) {
		return 0, fmt.Errorf("%w: %s has no row 1", ErrNoRow, c.table)
	}
	if err != nil {
		return 0, fmt.Errorf("pollnotify: read %s: %w", c.table, err)
	}
	return n, nil
}
