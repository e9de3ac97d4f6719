package bunstore

import (
	"context"
	"database/sql"
	"embed"
	"fmt"

	"github.com/jackc/pgx/v5"
	"github.com/uptrace/bun"
	"github.com/uptrace/bun/dialect"
)

// The hot statements (the claim, the guarded accept and completion, the
// heartbeat) are SQL files, one set a dialect (sql/pg, sql/sqlite), read
// once at Open and run with bind parameters, not through bun's
// interpolation: their text is the same from one call to the next, so
// PostgreSQL (through pgx's statement cache) parses and plans each once
// per connection, and SQLite prepares each once (prepared). Lists come in
// as parameters (arrays on PostgreSQL, JSON on SQLite), never spliced into
// the text. PostgreSQL's files number their parameters $1, $2, …;
// SQLite's ?1, ?2, ….

//go:embed sql
var sqlFiles embed.FS

// statements are the hot statements of one dialect, each the text of
// the file of its name; claimLock is empty on SQLite, which has one
// writer and nothing to lock, and receipt on PostgreSQL, where one
// multi-row INSERT adds a batch of receipts in one round trip.
type statements struct {
	claimLock, claimWorkers, claim, accept, complete, heartbeat, receipt string
}

// loadStatements reads the hot statements of dialect name.
func loadStatements(name dialect.Name) statements {
	dir := "sql/sqlite/"
	if name == dialect.PG {
		dir = "sql/pg/"
	}
	read := func(file string) string {
		b, _ := sqlFiles.ReadFile(dir + file + ".sql") // a file missing (claim_lock on SQLite, receipt on PostgreSQL) reads as ""
		return string(b)
	}
	return statements{claimLock: read("claim_lock"), claimWorkers: read("claim_workers"), claim: read("claim"),
		accept: read("accept"), complete: read("complete"), heartbeat: read("heartbeat"), receipt: read("receipt")}
}

// sqlConn is what runs a bound statement: the context's transaction or
// the pool.
func sqlConn(idb bun.IDB) (interface {
	QueryContext(ctx context.Context, query string, args ...any) (*sql.Rows, error)
	ExecContext(ctx context.Context, query string, args ...any) (sql.Result, error)
}, error) {
	switch x := idb.(type) {
	case bun.Tx:
		return x.Tx, nil
	case *bun.DB:
		return x.DB, nil
	}
	return nil, fmt.Errorf("bunstore: cannot run a bound statement on %T", idb)
}

// scanBound runs the bound statement q and scans its rows into dest.
func (db *DB) scanBound(ctx context.Context, idb bun.IDB, q string, args []any, dest any) error {
	db.observe(ctx, q)
	var (
		rows *sql.Rows
		err  error
	)
	if st, ok := db.prepared(ctx, idb, q); ok {
		rows, err = st.QueryContext(ctx, args...)
	} else {
		c, cerr := sqlConn(idb)
		if cerr != nil {
			return cerr
		}
		rows, err = c.QueryContext(ctx, q, db.boundArgs(args)...)
	}
	if err != nil {
		return err
	}
	return db.bun.ScanRows(ctx, rows, dest)
}

// execBound runs the bound statement q.
func (db *DB) execBound(ctx context.Context, idb bun.IDB, q string, args ...any) (sql.Result, error) {
	db.observe(ctx, q)
	if st, ok := db.prepared(ctx, idb, q); ok {
		return st.ExecContext(ctx, args...)
	}
	c, err := sqlConn(idb)
	if err != nil {
		return nil, err
	}
	return c.ExecContext(ctx, q, db.boundArgs(args)...)
}

// prepared returns, on SQLite, q prepared for idb: database/sql keeps a
// *sql.Stmt per text, which prepares it once on each connection and, in
// a transaction (Tx.StmtContext), reuses the connection's. Preparing is
// a good quarter of a SQLite request's CPU (measured over HTTP), and the
// driver would otherwise prepare every statement it runs. On PostgreSQL
// (pgx caches the statements itself, boundArgs), or if preparing fails,
// it reports false and the caller runs q directly.
func (db *DB) prepared(ctx context.Context, idb bun.IDB, q string) (*sql.Stmt, bool) {
	if db.postgres() {
		return nil, false
	}
	db.stmtMu.Lock()
	st, ok := db.stmts[q]
	db.stmtMu.Unlock()
	if !ok {
		var err error
		if st, err = db.bun.DB.PrepareContext(ctx, q); err != nil {
			return nil, false
		}
		db.stmtMu.Lock()
		if old, ok := db.stmts[q]; ok {
			st.Close()
			st = old
		} else {
			db.stmts[q] = st
		}
		db.stmtMu.Unlock()
	}
	switch x := idb.(type) {
	case bun.Tx:
		return x.Tx.StmtContext(ctx, st), true
	case *bun.DB:
		return st, true
	}
	return nil, false
}

// boundArgs returns the arguments of a bound statement: on PostgreSQL
// preceded by pgx's QueryExecModeCacheStatement, so that pgx prepares
// the statement once per connection and reuses it, whatever the pool's
// default mode (Open's is the simple protocol, for bun's statements,
// whose arguments are in their text).
func (db *DB) boundArgs(args []any) []any {
	if !db.postgres() {
		return args
	}
	return append([]any{pgx.QueryExecModeCacheStatement}, args...)
}

// observe reports a statement run past bun to the observer tests set
// (bun's query hooks do not see it).
func (db *DB) observe(ctx context.Context, q string) {
	if f := db.observer; f != nil {
		f(ctx, q)
	}
}
