package bunstore

import (
	"context"
	"database/sql"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/uptrace/bun"

	"github.com/nodelane/nodelane/lease"
)

// The lease hot path (lease.GuardedStore): Accept and Complete as one
// guarded UPDATE each, over a batch of writes passed as arrays (one a
// column, on PostgreSQL) or one write at a time (SQLite), RETURNING the
// rows written. Outside a transaction the
// writes of concurrent callers are gathered (batcher) into one statement
// and one commit; inside the context's transaction a call writes its own
// writes there.

// maxBatch bounds the writes of one gathered statement, and gatherWait
// how long a batch waits for more writes to join it when the last one
// gathered several.
const (
	maxBatch   = 256
	gatherWait = 2 * time.Millisecond
)

var _ lease.GuardedStore = (*LeaseStore)(nil)

// AcceptLeased implements lease.GuardedStore.
func (s *LeaseStore) AcceptLeased(ctx context.Context, ws []lease.AcceptWrite) ([]*lease.Job, error) {
	if _, ok := txFrom(ctx); ok || len(ws) != 1 {
		return s.db.guardedTx(ctx, func(ctx context.Context, tx bun.IDB) ([]*lease.Job, error) { return s.db.acceptLeased(ctx, tx, ws) })
	}
	j, err := s.db.accepts.do(ctx, ws[0])
	if err != nil {
		return nil, err
	}
	return []*lease.Job{j}, nil
}

// CompleteRunning implements lease.GuardedStore.
func (s *LeaseStore) CompleteRunning(ctx context.Context, ws []lease.CompleteWrite) ([]*lease.Job, error) {
	if _, ok := txFrom(ctx); ok || len(ws) != 1 {
		return s.db.guardedTx(ctx, func(ctx context.Context, tx bun.IDB) ([]*lease.Job, error) { return s.db.completeRunning(ctx, tx, ws) })
	}
	j, err := s.db.completes.do(ctx, ws[0])
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

// from is the FROM item that turns the JSON array parameter into rows of
// the given columns (name and SQL type, "text" or "bigint").
func (db *DB) from(cols ...[2]string) string {
	var b strings.Builder
	if db.postgres() {
		b.WriteString("json_to_recordset(?::json) AS b(")
		for i, c := range cols {
			if i > 0 {
				b.WriteString(", ")
			}
			b.WriteString(c[0] + " " + c[1])
		}
		b.WriteString(")")
		return b.String()
	}
	b.WriteString("(SELECT ")
	for i, c := range cols {
		if i > 0 {
			b.WriteString(", ")
		}
		fmt.Fprintf(&b, "value ->> '$.%s' AS %s", c[0], c[0])
	}
	b.WriteString(" FROM json_each(?)) AS b")
	return b.String()
}

// least is the SQL function of the lesser of two values.
func (db *DB) least() string {
	if db.postgres() {
		return "LEAST"
	}
	return "min"
}

// greatest is the dialect's two-argument maximum.
func (db *DB) greatest() string {
	if db.postgres() {
		return "GREATEST"
	}
	return "max"
}

// maxRuntime is the job's max runtime in microseconds, b.maxrt for a job
// without one; maxRuntimeArg the same with a parameter for b.maxrt.
const (
	maxRuntime    = "(CASE WHEN j.max_runtime_seconds > 0 THEN j.max_runtime_seconds * 1000000 ELSE b.maxrt END)"
	maxRuntimeArg = "(CASE WHEN j.max_runtime_seconds > 0 THEN j.max_runtime_seconds * 1000000 ELSE ? END)"
)

// eachWrite makes the guarded writes ws one statement each, q with the
// arguments args gives, looking the job up by its id: what a single write
// costs, and on SQLite what a batch costs too (the statements share the
// transaction and its commit; an UPDATE … FROM a JSON array would re-read
// the array for every row in the state it scans). Of several writes of
// one job only the first is made.
func eachWrite[W any](ctx context.Context, db *DB, idb bun.IDB, ws []W, g func(W) lease.Guard, args func(W) []any, q string) ([]*lease.Job, error) {
	out := make([]*lease.Job, len(ws))
	seen := make(map[string]bool, len(ws))
	for i, w := range ws {
		id := g(w).JobID
		if seen[id] {
			continue
		}
		seen[id] = true
		var written []jobRow
		if err := db.scanBound(ctx, idb, q, args(w), &written); err != nil {
			return nil, err
		}
		if len(written) == 1 {
			out[i] = written[0].job()
		}
	}
	return out, nil
}

func (db *DB) acceptLeased(ctx context.Context, idb bun.IDB, ws []lease.AcceptWrite) ([]*lease.Job, error) {
	if len(ws) == 1 || !db.postgres() {
		return eachWrite(ctx, db, idb, ws, func(w lease.AcceptWrite) lease.Guard { return w.Guard }, func(w lease.AcceptWrite) []any {
			now := micros(w.Now)
			return []any{now, now, w.TTL.Microseconds(), w.MaxRuntime.Microseconds(), w.JobID, w.WorkerID, w.TokenHash, now, now}
		}, "UPDATE nodelane_jobs AS j SET state = 'running', accepted_at = ?, "+
			"lease_expires_at = ? + "+db.least()+"(?, "+maxRuntimeArg+"), rev = j.rev + 1 "+
			"WHERE j.id = ? AND j.state = 'leased' AND j.lease_worker_id = ? AND j.lease_token_hash = ? "+
			"AND j.lease_expires_at > ? AND j.lease_accept_by > ? AND NOT j.cancel_requested RETURNING *")
	}
	q := "UPDATE nodelane_jobs AS j SET state = 'running', accepted_at = b.now, " +
		"lease_expires_at = b.now + LEAST(b.ttl, " + maxRuntime + "), rev = j.rev + 1 " +
		"FROM unnest(?::text[], ?::text[], ?::bytea[], ?::bigint[], ?::bigint[], ?::bigint[]) AS b(id, w, th, now, ttl, maxrt)" +
		" WHERE j.id = b.id AND j.state = 'leased' AND j.lease_worker_id = b.w AND j.lease_token_hash = b.th" +
		" AND j.lease_expires_at > b.now AND j.lease_accept_by > b.now AND NOT j.cancel_requested RETURNING j.*"
	return guardedUpdate(ctx, db, idb, q, ws, func(w lease.AcceptWrite) lease.Guard { return w.Guard }, func(ws []lease.AcceptWrite) []any {
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
	if len(ws) == 1 || !db.postgres() {
		return eachWrite(ctx, db, idb, ws, func(w lease.CompleteWrite) lease.Guard { return w.Guard }, func(w lease.CompleteWrite) []any {
			now := micros(w.Now)
			return []any{now, w.Result.OutputURI, text(w.Result.Metrics), w.Result.FinalMessage, w.Result.ReceiptID,
				w.JobID, w.WorkerID, w.TokenHash, now, w.MaxRuntime.Microseconds(), now}
		}, "UPDATE nodelane_jobs AS j SET state = 'succeeded', finished_at = "+db.greatest()+"(?, j.accepted_at), "+
			"result_output_uri = ?, result_metrics = ?, result_final_message = ?, "+
			"receipt_id = COALESCE(NULLIF(?, ''), j.receipt_id), rev = j.rev + 1 "+
			"WHERE j.id = ? AND j.state = 'running' AND j.lease_worker_id = ? AND j.lease_token_hash = ? "+
			"AND j.lease_expires_at > ? AND j.accepted_at + "+maxRuntimeArg+" > ? AND NOT j.cancel_requested RETURNING *")
	}
	// A job never ends before it started (lease.Manager's finish): a
	// clock that moved back since the accept finishes it at its accept.
	q := "UPDATE nodelane_jobs AS j SET state = 'succeeded', finished_at = GREATEST(b.now, j.accepted_at), " +
		"result_output_uri = b.uri, result_metrics = b.metrics, result_final_message = b.msg, " +
		"receipt_id = COALESCE(NULLIF(b.rcpt, ''), j.receipt_id), rev = j.rev + 1 " +
		"FROM unnest(?::text[], ?::text[], ?::bytea[], ?::bigint[], ?::bigint[], ?::text[], ?::text[], ?::text[], ?::text[]) " +
		"AS b(id, w, th, now, maxrt, uri, metrics, msg, rcpt)" +
		" WHERE j.id = b.id AND j.state = 'running' AND j.lease_worker_id = b.w AND j.lease_token_hash = b.th" +
		" AND j.lease_expires_at > b.now AND j.accepted_at + " + maxRuntime + " > b.now AND NOT j.cancel_requested RETURNING j.*"
	return guardedUpdate(ctx, db, idb, q, ws, func(w lease.CompleteWrite) lease.Guard { return w.Guard }, func(ws []lease.CompleteWrite) []any {
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

// guardedUpdate runs the guarded UPDATE q, on PostgreSQL, over the
// writes of ws as arrays, one a column (args makes them), and returns,
// for each write of ws, the job written for it, or nil. Of several writes
// of one job only the first is sent, and the row written answers it.
// The arrays come in through unnest, which the planner estimates at a
// few rows whatever they hold: it then looks each job up by its key,
// where a JSON function's 100 would have it read every job in the state
// written when the table's statistics lag its queue.
func guardedUpdate[W any](ctx context.Context, db *DB, idb bun.IDB, q string, ws []W, g func(W) lease.Guard, args func([]W) []any) ([]*lease.Job, error) {
	// Only the first write of a job goes to the database: with two rows
	// for one target row, an UPDATE … FROM may take either.
	first := make(map[string]bool, len(ws))
	kept := make([]W, 0, len(ws))
	for _, w := range ws {
		if id := g(w).JobID; !first[id] {
			first[id] = true
			kept = append(kept, w)
		}
	}
	var written []jobRow
	if err := db.scanBound(ctx, idb, q, args(kept), &written); err != nil {
		return nil, err
	}
	byID := make(map[string]*jobRow, len(written))
	for i := range written {
		byID[written[i].ID] = &written[i]
	}
	out := make([]*lease.Job, len(ws))
	for i, w := range ws {
		gd := g(w)
		r, ok := byID[gd.JobID]
		if !ok {
			continue
		}
		delete(byID, gd.JobID)
		if string(r.LeaseTokenHash) == string(gd.TokenHash) {
			out[i] = r.job()
		}
	}
	return out, nil
}

// writeGrants writes, in one UPDATE, what ClaimJobs's grant changed of
// each claimed job (its state, leased_at, accepted_at, lease and rev), at
// the revision read (revs). The rows are locked by the claim, so a row
// not written is a bug, reported as lease.ErrConflict.
func (db *DB) writeGrants(ctx context.Context, tx bun.IDB, js []*lease.Job, revs []int64) error {
	if len(js) == 0 {
		return nil
	}
	type row struct {
		ID       string  `json:"id"`
		Prev     int64   `json:"prev"`
		Rev      int64   `json:"rev"`
		State    string  `json:"state"`
		Leased   *int64  `json:"leased"`
		Accepted *int64  `json:"accepted"`
		LID      *string `json:"lid"`
		W        *string `json:"w"`
		Epoch    *int64  `json:"epoch"`
		TH       *string `json:"th"`
		Exp      *int64  `json:"exp"`
		Acc      *int64  `json:"acc"`
		SKU      *string `json:"sku"`
		Price    *int64  `json:"price"`
		PV       *int64  `json:"pv"`
	}
	rows := make([]row, len(js))
	for i, j := range js {
		r := newJobRow(j)
		rows[i] = row{ID: j.ID, Prev: revs[i], Rev: j.Rev, State: r.State, Leased: r.LeasedAt, Accepted: r.AcceptedAt,
			LID: r.LeaseID, W: r.LeaseWorkerID, Epoch: r.LeaseEpoch, Exp: r.LeaseExpiresAt, Acc: r.LeaseAcceptBy,
			SKU: r.LeaseSKU, Price: r.LeasePriceMicroUSD, PV: r.LeasePolicyVersion}
		if r.LeaseTokenHash != nil {
			th := hex.EncodeToString(r.LeaseTokenHash)
			rows[i].TH = &th
		}
	}
	param, err := json.Marshal(rows)
	if err != nil {
		return err
	}
	q := "UPDATE nodelane_jobs AS j SET state = b.state, leased_at = b.leased, accepted_at = b.accepted, " +
		"lease_id = b.lid, lease_job_id = CASE WHEN b.lid IS NULL THEN NULL ELSE b.id END, lease_worker_id = b.w, lease_epoch = b.epoch, " +
		"lease_token_hash = " + db.unhex() + ", lease_expires_at = b.exp, lease_accept_by = b.acc, lease_sku = b.sku, " +
		"lease_price_micro_usd = b.price, lease_policy_version = b.pv, rev = b.rev " +
		"FROM " + db.from([2]string{"id", "text"}, [2]string{"prev", "bigint"}, [2]string{"rev", "bigint"}, [2]string{"state", "text"},
		[2]string{"leased", "bigint"}, [2]string{"accepted", "bigint"}, [2]string{"lid", "text"}, [2]string{"w", "text"},
		[2]string{"epoch", "bigint"}, [2]string{"th", "text"}, [2]string{"exp", "bigint"}, [2]string{"acc", "bigint"},
		[2]string{"sku", "text"}, [2]string{"price", "bigint"}, [2]string{"pv", "bigint"}) +
		" WHERE j.id = b.id AND j.rev = b.prev"
	res, err := db.execBound(ctx, tx, q, string(param))
	if err != nil {
		return err
	}
	n, err := res.RowsAffected()
	if err != nil {
		return err
	}
	if n != int64(len(js)) {
		return fmt.Errorf("%d of %d claimed jobs changed under the claim: %w", int64(len(js))-n, len(js), lease.ErrConflict)
	}
	return nil
}

// unhex is the SQL that decodes b.th, hex, into bytes.
func (db *DB) unhex() string {
	if db.postgres() {
		return "decode(b.th, 'hex')"
	}
	return "unhex(b.th)"
}

// The hot statements run with bind parameters, not through bun's
// interpolation: their text is the same from one call to the next, so
// PostgreSQL (through pgx's statement cache) parses and plans each once per
// connection rather than on every call. A claim's LIMIT and its numbers of
// types and fits stay in the text.

// bind rewrites q's ? placeholders as PostgreSQL's $1, $2, …; SQLite takes
// them as they are. The hot statements hold no ? but placeholders.
func (db *DB) bind(q string) string {
	if !db.postgres() {
		return q
	}
	var b strings.Builder
	n := 0
	for _, r := range q {
		if r == '?' {
			n++
			b.WriteString("$" + strconv.Itoa(n))
			continue
		}
		b.WriteRune(r)
	}
	return b.String()
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
		rows, err = c.QueryContext(ctx, db.bind(q), db.boundArgs(args)...)
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
	return c.ExecContext(ctx, db.bind(q), db.boundArgs(args)...)
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
