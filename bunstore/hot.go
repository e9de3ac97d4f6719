package bunstore

import (
	"context"
	"fmt"
	"reflect"
	"time"

	"github.com/uptrace/bun"

	"github.com/nodelane/nodelane/lease"
)

// The lease hot path (lease.Store's AcceptLeased and CompleteRunning):
// Accept and Complete as one guarded UPDATE each (sql/*/accept.sql,
// complete.sql), over a batch of writes passed as arrays (one a column,
// on PostgreSQL) or one write at a time (SQLite), RETURNING the rows
// written. Outside a transaction the writes of concurrent callers are
// gathered (batcher) into one statement and one commit; inside the
// context's transaction a call writes its own writes there.

// maxBatch bounds the writes of one gathered statement, and gatherWait
// how long a batch waits for more writes to join it when the last one
// gathered several.
const (
	maxBatch   = 256
	gatherWait = 2 * time.Millisecond
)

// AcceptLeased implements lease.Store.
func (s *LeaseStore) AcceptLeased(ctx context.Context, ws []lease.AcceptWrite) ([]*lease.Job, error) {
	return guarded(ctx, s.db, s.db.accepts, ws, s.db.acceptLeased)
}

// CompleteRunning implements lease.Store.
func (s *LeaseStore) CompleteRunning(ctx context.Context, ws []lease.CompleteWrite) ([]*lease.Job, error) {
	return guarded(ctx, s.db, s.db.completes, ws, s.db.completeRunning)
}

// guarded makes the guarded writes ws with write: a lone write outside a
// transaction through b, gathered with other callers', the others at once.
func guarded[W any](ctx context.Context, db *DB, b *batcher[W, *lease.Job], ws []W, write func(context.Context, bun.IDB, []W) ([]*lease.Job, error)) ([]*lease.Job, error) {
	if _, ok := txFrom(ctx); ok || len(ws) != 1 {
		return db.guardedTx(ctx, func(ctx context.Context, tx bun.IDB) ([]*lease.Job, error) { return write(ctx, tx, ws) })
	}
	j, err := b.do(ctx, ws[0])
	if err != nil {
		return nil, err
	}
	return []*lease.Job{j}, nil
}

// guardedTx runs the guarded writes of fn, again if the database aborted
// them: on PostgreSQL as the one statement they are (DB.write), on SQLite,
// where they are one statement each, in one transaction (DB.inTx), so
// that they share its commit.
func (db *DB) guardedTx(ctx context.Context, fn func(ctx context.Context, idb bun.IDB) ([]*lease.Job, error)) ([]*lease.Job, error) {
	run := db.write
	if !db.postgres() {
		run = db.inTx
	}
	var out []*lease.Job
	err := aborted(db.retryOwnTx(ctx, func() error {
		return run(ctx, func(ctx context.Context, idb bun.IDB) error {
			var err error
			out, err = fn(ctx, idb)
			return err
		})
	}))
	if err != nil {
		return nil, fmt.Errorf("bunstore: %w", err)
	}
	return out, nil
}

func (db *DB) acceptLeased(ctx context.Context, idb bun.IDB, ws []lease.AcceptWrite) ([]*lease.Job, error) {
	return guardedUpdate(ctx, db, idb, db.sql.accept, ws, func(w lease.AcceptWrite) lease.Guard { return w.Guard }, func(ws []lease.AcceptWrite) []any {
		var (
			id, wk        []string
			th            [][]byte
			now, ttl, mrt []int64
		)
		for _, w := range ws {
			id, wk, th = append(id, w.JobID), append(wk, w.WorkerID), append(th, w.TokenHash)
			now, ttl, mrt = append(now, micros(w.Now)), append(ttl, w.TTL.Microseconds()), append(mrt, w.MaxRuntime.Microseconds())
		}
		return []any{id, wk, th, now, ttl, mrt}
	})
}

func (db *DB) completeRunning(ctx context.Context, idb bun.IDB, ws []lease.CompleteWrite) ([]*lease.Job, error) {
	return guardedUpdate(ctx, db, idb, db.sql.complete, ws, func(w lease.CompleteWrite) lease.Guard { return w.Guard }, func(ws []lease.CompleteWrite) []any {
		var (
			id, wk, uri, msg, rcpt []string
			metrics                []*string
			th                     [][]byte
			now, mrt               []int64
		)
		for _, w := range ws {
			id, wk, th = append(id, w.JobID), append(wk, w.WorkerID), append(th, w.TokenHash)
			now, mrt = append(now, micros(w.Now)), append(mrt, w.MaxRuntime.Microseconds())
			uri, metrics = append(uri, w.Result.OutputURI), append(metrics, text(w.Result.Metrics))
			msg, rcpt = append(msg, w.Result.FinalMessage), append(rcpt, w.Result.ReceiptID)
		}
		return []any{id, wk, th, now, mrt, uri, metrics, msg, rcpt}
	})
}

// guardedUpdate runs the guarded UPDATE q over the writes of ws and
// returns, for each write of ws, the job written for it, or nil. cols
// gives q's arguments for a batch of writes, one array a column:
// PostgreSQL's statement takes them as they are, through unnest, which
// the planner estimates at a few rows whatever they hold (it then looks
// each job up by its key, where a JSON function's 100 would have it read
// every job in the state written when the table's statistics lag its
// queue). SQLite's statement takes one write, each array's one element,
// and runs once a write: the statements share the transaction and its
// commit, where an UPDATE … FROM a JSON array would re-read the array for
// every row in the state it scans. Of several writes of one job only the
// first is sent (with two rows for one target row, an UPDATE … FROM may
// take either), and the row written answers it.
func guardedUpdate[W any](ctx context.Context, db *DB, idb bun.IDB, q string, ws []W, g func(W) lease.Guard, cols func([]W) []any) ([]*lease.Job, error) {
	first := make(map[string]bool, len(ws))
	kept := make([]W, 0, len(ws))
	for _, w := range ws {
		if id := g(w).JobID; !first[id] {
			first[id] = true
			kept = append(kept, w)
		}
	}
	var written []jobRow
	if db.postgres() {
		if err := db.scanBound(ctx, idb, q, cols(kept), &written); err != nil {
			return nil, err
		}
	} else {
		for i := range kept {
			args := cols(kept[i : i+1])
			for k, a := range args {
				args[k] = reflect.ValueOf(a).Index(0).Interface()
			}
			var row []jobRow
			if err := db.scanBound(ctx, idb, q, args, &row); err != nil {
				return nil, err
			}
			written = append(written, row...)
		}
	}
	byID := make(map[string]*jobRow, len(written))
	for i := range written {
		byID[written[i].ID] = &written[i]
	}
	out := make([]*lease.Job, len(ws))
	for i, w := range ws {
		gd := g(w)
		if r, ok := byID[gd.JobID]; ok && string(r.LeaseTokenHash) == string(gd.TokenHash) {
			out[i] = r.job()
		}
		delete(byID, gd.JobID)
	}
	return out, nil
}
