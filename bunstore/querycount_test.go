package bunstore_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strings"
	"sync/atomic"

	"github.com/uptrace/bun"
)

// queryCounter is a bun.QueryHook that counts what a *bun.DB sends to the
// database, for benchmarks that report statements and commits per job.
// Add it with db.Bun().AddQueryHook; it is never installed by production
// code.
//
// What bun reports, and so what is counted (bun v1.3.0, db.go, hook.go):
//
//   - DB.BeginTx and Conn.BeginTx report the query "BEGIN" (on SQLite the
//     driver really sends BEGIN IMMEDIATE); Tx.Commit reports "COMMIT" and
//     Tx.Rollback "ROLLBACK", each with IQuery nil. A nested Tx (a
//     savepoint) sends "SAVEPOINT SP_…", "RELEASE SAVEPOINT SP_…" and
//     "ROLLBACK TO SAVEPOINT SP_…" through Tx.ExecContext.
//   - Every other query, built (NewSelect, NewUpdate, …) or raw (Exec,
//     Query, QueryRow on the DB or a Tx), is reported once, after it ran.
//     These are the statements: stmts counts them all, whether they
//     succeeded or not, in a transaction or not. Transaction control
//     (BEGIN, COMMIT, ROLLBACK, savepoints) is counted apart and is not a
//     statement. Statements sent past bun (pgx or database/sql directly,
//     e.g. LISTEN) are not seen at all.
//
// The event does not say whether a query ran on the pool or on a Tx.
// DB.BeginTx, though, keeps the context BeforeQuery returns for "BEGIN"
// as the Tx's own, and RunInTx hands that context to its function, from
// which bunstore derives the contexts of the statements it runs in the
// transaction. So BeforeQuery marks the context of every BEGIN, and a
// statement whose context carries the mark ran in a transaction; one
// whose context does not ran on the pool by itself, which the database
// commits on its own (autocommit).
//
// commits counts the COMMITs that succeeded plus the autocommitted
// statements that succeeded (sql.ErrNoRows counts as success), read-only
// ones included: that is what PostgreSQL counts in
// pg_stat_database.xact_commit. A read-only autocommit writes nothing to
// the WAL, so commits overstates WAL flushes by autoReads.
type queryCounter struct {
	stmts      atomic.Int64 // statements, in a transaction or not
	inTx       atomic.Int64 // of stmts, run in a transaction
	auto       atomic.Int64 // of stmts, autocommitted (run outside a transaction)
	autoReads  atomic.Int64 // of auto, SELECTs
	begins     atomic.Int64 // BEGIN
	txCommits  atomic.Int64 // COMMIT that succeeded
	rollbacks  atomic.Int64 // ROLLBACK (whole transaction)
	savepoints atomic.Int64 // SAVEPOINT, RELEASE SAVEPOINT, ROLLBACK TO SAVEPOINT
	commits    atomic.Int64 // txCommits + autocommitted statements that succeeded
	failed     atomic.Int64 // events of any kind that returned an error
}

var _ bun.QueryHook = (*queryCounter)(nil)

// inTxKey marks the context of a transaction begun through bun.
type inTxKey struct{}

// queryKind is what a query event is, for counting.
type queryKind int

const (
	kindStatement queryKind = iota
	kindBegin
	kindCommit
	kindRollback
	kindSavepoint
)

// classify tells transaction control from statements by the query text.
func classify(query string) queryKind {
	q := strings.ToUpper(strings.TrimSpace(query))
	switch {
	case q == "BEGIN" || strings.HasPrefix(q, "BEGIN ") || strings.HasPrefix(q, "START TRANSACTION"):
		return kindBegin
	case q == "COMMIT" || q == "END":
		return kindCommit
	case strings.HasPrefix(q, "ROLLBACK TO"), strings.HasPrefix(q, "SAVEPOINT "), strings.HasPrefix(q, "RELEASE "):
		return kindSavepoint
	case q == "ROLLBACK":
		return kindRollback
	}
	return kindStatement
}

func (c *queryCounter) BeforeQuery(ctx context.Context, e *bun.QueryEvent) context.Context {
	if e.IQuery == nil && classify(e.Query) == kindBegin {
		return context.WithValue(ctx, inTxKey{}, true)
	}
	return ctx
}

func (c *queryCounter) AfterQuery(ctx context.Context, e *bun.QueryEvent) {
	ok := e.Err == nil || errors.Is(e.Err, sql.ErrNoRows)
	if !ok {
		c.failed.Add(1)
	}
	kind := kindStatement
	if e.IQuery == nil {
		kind = classify(e.Query)
	}
	switch kind {
	case kindBegin:
		c.begins.Add(1)
	case kindCommit:
		if ok {
			c.txCommits.Add(1)
			c.commits.Add(1)
		}
	case kindRollback:
		c.rollbacks.Add(1)
	case kindSavepoint:
		c.savepoints.Add(1)
	default:
		c.stmts.Add(1)
		if in, _ := ctx.Value(inTxKey{}).(bool); in {
			c.inTx.Add(1)
			return
		}
		c.auto.Add(1)
		if strings.EqualFold(e.Operation(), "SELECT") {
			c.autoReads.Add(1)
		}
		if ok {
			c.commits.Add(1)
		}
	}
}

// observe counts a statement bunstore ran past bun (bunstore.SetObserver:
// the bound hot statements, which bun's hooks do not see), before it ran:
// as a statement, and, outside a transaction, as a commit.
func (c *queryCounter) observe(ctx context.Context, query string) {
	c.stmts.Add(1)
	if in, _ := ctx.Value(inTxKey{}).(bool); in {
		c.inTx.Add(1)
		return
	}
	c.auto.Add(1)
	c.commits.Add(1)
}

// queryCounts is a snapshot of a queryCounter.
type queryCounts struct {
	Stmts, InTx, Auto, AutoReads, Begins, TxCommits, Rollbacks, Savepoints, Commits, Failed int64
}

func (c *queryCounter) snapshot() queryCounts {
	return queryCounts{
		Stmts: c.stmts.Load(), InTx: c.inTx.Load(), Auto: c.auto.Load(), AutoReads: c.autoReads.Load(),
		Begins: c.begins.Load(), TxCommits: c.txCommits.Load(), Rollbacks: c.rollbacks.Load(),
		Savepoints: c.savepoints.Load(), Commits: c.commits.Load(), Failed: c.failed.Load(),
	}
}

// sub returns the counts between the snapshot o and s.
func (s queryCounts) sub(o queryCounts) queryCounts {
	return queryCounts{
		Stmts: s.Stmts - o.Stmts, InTx: s.InTx - o.InTx, Auto: s.Auto - o.Auto, AutoReads: s.AutoReads - o.AutoReads,
		Begins: s.Begins - o.Begins, TxCommits: s.TxCommits - o.TxCommits, Rollbacks: s.Rollbacks - o.Rollbacks,
		Savepoints: s.Savepoints - o.Savepoints, Commits: s.Commits - o.Commits, Failed: s.Failed - o.Failed,
	}
}

// perJob formats the counts divided by n jobs.
func (s queryCounts) perJob(n int) string {
	f := func(v int64) float64 { return float64(v) / float64(n) }
	return fmt.Sprintf("per job: stmts %.3f (in tx %.3f, autocommit %.3f of which SELECT %.3f); "+
		"BEGIN %.3f, COMMIT %.3f, ROLLBACK %.3f, savepoint ops %.3f; commits %.3f; failed %.3f",
		f(s.Stmts), f(s.InTx), f(s.Auto), f(s.AutoReads),
		f(s.Begins), f(s.TxCommits), f(s.Rollbacks), f(s.Savepoints), f(s.Commits), f(s.Failed))
}
