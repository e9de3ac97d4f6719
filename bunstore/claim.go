package bunstore

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"

	"github.com/uptrace/bun"

	"github.com/nodelane/nodelane/lease"
)

// Claims (lease.ClaimingStore). The ClaimLeases calls that run outside a
// transaction are gathered (batcher) like Accept and Complete, into one
// transaction and one commit. On PostgreSQL that transaction locks the
// workers of the batch, reads them, and claims for all of them in one
// statement per kind of claim (the same job types and shapes: usually
// one), so that the head of the queue is walked once for the batch rather
// than once a worker; on SQLite it claims for each call in turn. A call
// inside the context's transaction claims there, alone.

// maxClaimBatch bounds the ClaimLeases calls of one gathered claim.
const maxClaimBatch = 64

var _ lease.ClaimingStore = (*LeaseStore)(nil)

// claimSettings are the planner settings of a claim's transaction on
// PostgreSQL (SET LOCAL: they end with it). A queue's statistics lag it:
// with a burst just enqueued, or a table never analyzed, the planner
// estimates a handful of queued jobs and would take every one of them
// through another index on state, sort them and keep the first few
// (measured: 97 ms a claim with 48,000 queued, throughput falling with the
// backlog). So:
//   - enable_sort = off: the candidates are walked in claim order on the
//     queued index, whatever the estimates;
//   - jit = off: that setting makes the plans that sort look costly
//     enough to compile (2 s a claim);
//   - enable_bitmapscan = off: the count of the worker's live leases
//     walks its index rather than building a bitmap of it; the index
//     keeps an entry for every lease the worker held since the last
//     vacuum, and only an index scan marks the dead ones so that the next
//     count skips them (measured: 3.4 ms for a worker with 20,000
//     finished jobs unvacuumed by bitmap, every time; 0.3 ms by index
//     once marked);
//   - enable_hashjoin = off, enable_mergejoin = off: the claimed rows are
//     found again by primary key. A gathered claim takes hundreds of
//     jobs, and for hundreds of lookups the planner prefers to hash a
//     scan of the whole table, finished jobs and all (measured: 56 ms of
//     a 66 ms claim of 300 jobs from a table of 20,000; 23% less claim
//     time over a burn-down).
//
// They are set with set_config(…, true), SET LOCAL's function form, in
// the statement that takes the claim's locks (claimLock).
const claimSettings = "set_config('enable_sort', 'off', true), set_config('jit', 'off', true), set_config('enable_bitmapscan', 'off', true), " +
	"set_config('enable_hashjoin', 'off', true), set_config('enable_mergejoin', 'off', true)"

// claimLock is the statement that takes the advisory locks of the
// workers of a claim (an array, in id order) and sets claimSettings.
const claimLock = "SELECT " + claimSettings + ", (SELECT count(pg_advisory_xact_lock(hashtextextended('nodelane_claim:' || current_schema() || ':' || w, 0))) " +
	"FROM unnest(?::text[]) AS w)"

// claimWorkers is the statement that reads the workers of a claim (an
// array of ids) with the count of their live leases.
const claimWorkers = "SELECT w.*, (SELECT count(*) FROM nodelane_jobs AS j WHERE j.lease_worker_id = w.id AND j.state IN ('leased', 'running')) AS live " +
	"FROM nodelane_workers AS w WHERE w.id = ANY(?::text[])"

// claimPlan is the plan function of a ClaimLeases call.
type claimPlan = func(*lease.Worker) (lease.ClaimQuery, lease.LeaseClaim, bool, error)

// claimCall is one ClaimLeases call.
type claimCall struct {
	workerID string
	plan     claimPlan
}

// planFor calls the call's plan with its worker w, and refuses a plan
// whose limit is below 1 (lease.ErrInvalidArgument).
func (call claimCall) planFor(w *lease.Worker) (lease.ClaimQuery, lease.LeaseClaim, bool, error) {
	q, c, ok, err := call.plan(w)
	if err == nil && ok && q.Limit <= 0 {
		err = errLimit("claim jobs for "+q.WorkerID, q.Limit)
	}
	return q, c, ok, err
}

// claimResult is what a claimCall gets: the jobs it claimed, in claim
// order, or its own error, which costs the other calls of its batch
// nothing.
type claimResult struct {
	jobs []*lease.Job
	err  error
}

// ClaimLeases implements lease.ClaimingStore: it reads the worker and
// claims for it in one transaction, in one statement that counts the
// worker's live leases, picks the candidates in claim order (skipping
// rows other claims hold, on PostgreSQL), and writes their leases,
// RETURNING them. Claims by one worker are serialised as in ClaimJobs (on
// PostgreSQL by an advisory lock, taken in the statement before, so that
// the claim's snapshot sees every claim that took it earlier).
func (s *LeaseStore) ClaimLeases(ctx context.Context, workerID string, plan claimPlan) ([]*lease.Job, error) {
	db := s.db
	call := claimCall{workerID: workerID, plan: plan}
	var (
		r   claimResult
		err error
	)
	if _, ok := txFrom(ctx); ok {
		var rs []claimResult
		if rs, err = db.claimTx(ctx, []claimCall{call}); err == nil {
			r = rs[0]
		}
	} else {
		r, err = db.claims.do(ctx, call)
	}
	if err == nil {
		err = r.err
	}
	if err != nil {
		return nil, fmt.Errorf("bunstore: claim jobs for %s: %w", workerID, err)
	}
	return r.jobs, nil
}

// claimTx runs the claims of calls in one transaction (the context's, if
// it carries one), again if the database aborted it.
func (db *DB) claimTx(ctx context.Context, calls []claimCall) ([]claimResult, error) {
	var out []claimResult
	err := aborted(db.retryOwnTx(ctx, func() error {
		return db.inTx(ctx, func(ctx context.Context, tx bun.IDB) error {
			var err error
			if db.postgres() {
				out, err = db.claimIn(ctx, tx, calls)
			} else {
				out, err = db.claimInSQLite(ctx, calls)
			}
			return err
		})
	}))
	return out, err
}

// planned is a claim a call planned: the leases it prepared, and how
// many of them it may write (its limit, within its worker's room).
type planned struct {
	call int
	q    lease.ClaimQuery
	c    lease.LeaseClaim
	n    int
}

// workerLive is a worker with the count of its live leases.
type workerLive struct {
	workerRow `bun:",extend"`
	Live      int `bun:"live,scanonly"`
}

// claimIn claims for calls in tx, on PostgreSQL. It locks every worker of
// calls (in id order, so that two batches cannot deadlock); reads them
// with their live leases, in a statement after the locks so that it sees
// every claim that took them before; plans each call; and claims for the
// planned calls in one statement per group of calls that share job types
// and shapes. A worker that appears twice claims in a later statement
// with the room the earlier one left it.
func (db *DB) claimIn(ctx context.Context, tx bun.IDB, calls []claimCall) ([]claimResult, error) {
	ids := make([]string, 0, len(calls))
	for _, c := range calls {
		ids = append(ids, c.workerID)
	}
	slices.Sort(ids)
	ids = slices.Compact(ids)
	if _, err := db.execBound(ctx, tx, claimLock, ids); err != nil {
		return nil, err
	}
	var rows []workerLive
	if err := db.scanBound(ctx, tx, claimWorkers, []any{ids}, &rows); err != nil {
		return nil, err
	}
	workers := make(map[string]*lease.Worker, len(rows))
	room := make(map[string]int, len(rows)) // by worker: leases it may still take
	for i := range rows {
		w, err := rows[i].worker()
		if err != nil {
			return nil, err
		}
		workers[w.ID] = w
		room[w.ID] = -rows[i].Live // MaxActive is the plan's
	}

	out := make([]claimResult, len(calls))
	// rounds[r] holds, by group key, the claims of round r: a worker's
	// first claim is in round 0, its second in round 1, and so on.
	var rounds []map[string][]planned
	var keys [][]string // the group keys of each round, in first-seen order
	seen := make(map[string]int, len(calls))
	for i, call := range calls {
		w, ok := workers[call.workerID]
		if !ok {
			out[i].err = fmt.Errorf("worker with id %s: %w", call.workerID, lease.ErrNotFound)
			continue
		}
		q, c, ok, err := call.planFor(w)
		if err != nil || !ok {
			out[i].err = err
			continue
		}
		if len(q.Types) == 0 || len(q.Fits) == 0 {
			continue
		}
		// room holds minus the live leases, and what earlier calls of
		// this worker took.
		n := min(q.Limit, len(c.Leases), q.MaxActive+room[w.ID])
		if n <= 0 {
			continue
		}
		room[w.ID] -= n
		r := seen[w.ID]
		seen[w.ID]++
		if r == len(rounds) {
			rounds = append(rounds, map[string][]planned{})
			keys = append(keys, nil)
		}
		k := claimKey(q)
		if _, ok := rounds[r][k]; !ok {
			keys[r] = append(keys[r], k)
		}
		rounds[r][k] = append(rounds[r][k], planned{call: i, q: q, c: c, n: n})
	}

	for r, groups := range rounds {
		for _, k := range keys[r] {
			g := groups[k]
			query, args, err := db.claimStatement(g)
			if err != nil {
				return nil, err
			}
			var written []jobRow
			if err := db.scanBound(ctx, tx, query, args, &written); err != nil {
				return nil, err
			}
			// RETURNING gives no order: each job goes to the call whose
			// lease it got, in the order of that call's leases.
			type slot struct{ call, k int }
			owner := make(map[string]slot)
			for _, p := range g {
				for k, l := range p.c.Leases[:p.n] {
					owner[l.ID] = slot{p.call, k}
				}
			}
			for i := range written {
				j := written[i].job()
				s, ok := owner[j.Lease.ID]
				if !ok {
					return nil, fmt.Errorf("claim wrote lease %s, which no call of the batch prepared", j.Lease.ID)
				}
				out[s.call].jobs = append(out[s.call].jobs, j)
			}
			for _, p := range g {
				slices.SortFunc(out[p.call].jobs, func(a, b *lease.Job) int { return owner[a.Lease.ID].k - owner[b.Lease.ID].k })
			}
		}
	}
	return out, nil
}

// claimKey is the key of the claims that one statement can serve: the
// same job types, shapes and effective tags. Workers of different tags
// claim in statements of their own, as workers of different shapes do.
func claimKey(q lease.ClaimQuery) string {
	var b strings.Builder
	for _, t := range q.Types {
		b.WriteString(t)
		b.WriteByte(0)
	}
	for _, f := range q.Fits {
		fmt.Fprintf(&b, "\x01%s\x00%d\x00%d", f.SKU, f.GPUs, f.VRAMMB)
	}
	for _, t := range q.Tags {
		b.WriteByte(2)
		b.WriteString(t)
	}
	return b.String()
}

// claimStatement is the statement that claims for the calls of g, which
// share job types, shapes and tags, and its arguments: it locks as many
// candidates as the calls may take, in claim order, and gives the k-th
// of them the k-th lease of the calls' leases (each lease's fields one
// array, zipped with the candidates by a many-argument unnest). A call
// with accept (lease.LeaseClaim.Accept) claims into running in the same
// write: ak and maxrt are its arrays.
func (db *DB) claimStatement(g []planned) (string, []any, error) {
	type priceArg struct {
		W     string `json:"w"`
		SKU   string `json:"sku"`
		Price int64  `json:"price"`
	}
	var (
		lid, w, dsku []string
		th           [][]byte
		now, exp     []int64
		acc, pv, mrt []int64
		ak           []bool
		ps           = []priceArg{} // JSON [], not null, when no call has prices
	)
	oldest := g[0].q.Now
	for _, p := range g {
		for _, l := range p.c.Leases[:p.n] {
			lid = append(lid, l.ID)
			w = append(w, p.q.WorkerID)
			dsku = append(dsku, p.c.DefaultSKU)
			th = append(th, l.TokenHash)
			now = append(now, micros(p.q.Now))
			exp = append(exp, micros(l.ExpiresAt))
			acc = append(acc, micros(l.AcceptBy))
			pv = append(pv, l.PolicyVersion)
			ak, mrt = append(ak, p.c.Accept), append(mrt, p.c.MaxRuntime.Microseconds())
		}
		for sku, price := range p.c.Prices {
			ps = append(ps, priceArg{p.q.WorkerID, sku, price})
		}
		// A job scheduled after any call's now is claimed for none.
		if p.q.Now.Before(oldest) {
			oldest = p.q.Now
		}
	}
	pj, err := json.Marshal(ps)
	if err != nil {
		return "", nil, err
	}
	q := g[0].q
	fits := make([]string, len(q.Fits))
	var fitArgs []any
	for i, f := range q.Fits {
		fits[i] = "(gpu_sku = ? AND gpu_count <= ? AND min_vram_mb <= ?)"
		fitArgs = append(fitArgs, f.SKU, f.GPUs, f.VRAMMB)
	}
	sku := "(CASE WHEN j.gpu_sku <> '' THEN j.gpu_sku ELSE b.dsku END)"
	// The candidates are scanned with a constant LIMIT, walking the
	// queued index in claim order (claimSettings); an array keeps their
	// order.
	query := "WITH p AS MATERIALIZED (SELECT * FROM json_to_recordset(?::json) AS p(w text, sku text, price bigint)) " +
		"UPDATE nodelane_jobs AS j SET state = CASE WHEN b.ak THEN 'running' ELSE 'leased' END, leased_at = b.now, " +
		"accepted_at = CASE WHEN b.ak THEN b.now END, lease_id = b.lid, lease_job_id = j.id, " +
		"lease_worker_id = b.w, lease_epoch = COALESCE(j.lease_epoch, 0) + 1, lease_token_hash = b.th, " +
		"lease_expires_at = CASE WHEN b.ak THEN LEAST(b.exp, b.now + " + maxRuntime + ") ELSE b.exp END, lease_accept_by = b.acc, lease_sku = " + sku +
		", lease_price_micro_usd = COALESCE((SELECT p.price FROM p WHERE p.w = b.w AND p.sku = " + sku + "), 0), lease_policy_version = b.pv, rev = j.rev + 1 " +
		"FROM unnest(ARRAY(SELECT id FROM nodelane_jobs WHERE state = 'queued' AND type IN (" + strings.Repeat("?, ", len(q.Types)-1) + "?) AND scheduled_at <= ? AND (" +
		strings.Join(fits, " OR ") + ") AND " + db.tagsMatch() + " ORDER BY priority DESC, created_at, id LIMIT " + strconv.Itoa(len(lid)) + " FOR UPDATE SKIP LOCKED), " +
		"?::text[], ?::text[], ?::text[], ?::bytea[], ?::bigint[], ?::bigint[], ?::bigint[], ?::bigint[], ?::boolean[], ?::bigint[]) " +
		"AS b(id, lid, w, dsku, th, now, exp, acc, pv, ak, maxrt) " +
		"WHERE j.id = b.id RETURNING j.*"
	// The arguments in the order of the placeholders.
	args := []any{string(pj)}
	for _, t := range q.Types {
		args = append(args, t)
	}
	args = append(args, micros(oldest))
	args = append(args, fitArgs...)
	args = append(args, tagsArg(q.Tags))
	args = append(args, lid, w, dsku, th, now, exp, acc, pv, ak, mrt)
	return query, args, nil
}

// claimInSQLite claims for calls in the context's transaction, on
// SQLite: for each call in turn, it reads the worker and claims through
// ClaimJobs, so that a worker's later call sees its earlier one's
// leases. SQLite plans a one-statement claim's candidate scan as a scan of
// every queued job and a sort, while it walks the queued index for
// ClaimJobs's SELECT; and it has one writer, so the second statement
// costs no round trip and no lock.
func (db *DB) claimInSQLite(ctx context.Context, calls []claimCall) ([]claimResult, error) {
	s := db.LeaseStore()
	out := make([]claimResult, len(calls))
	for i, call := range calls {
		w, err := s.GetWorker(ctx, call.workerID)
		if errors.Is(err, lease.ErrNotFound) {
			out[i].err = err
			continue
		}
		if err != nil {
			return nil, err
		}
		q, c, ok, err := call.planFor(w)
		if err != nil || !ok {
			out[i].err = err
			continue
		}
		if len(c.Leases) == 0 {
			continue
		}
		if out[i].jobs, err = s.ClaimJobs(ctx, q, c.Grant(q.Now)); err != nil {
			return nil, err
		}
	}
	return out, nil
}

// Tags (lease.Requirements.Tags, migration 0016). A job's tags are stored
// in one text column, '' for a job without any, else a JSON array of
// strings, sorted and deduplicated. A claim passes the worker's effective
// tags (lease.ClaimQuery.Tags) as one JSON array parameter, so that a
// claim's statement text, and the statement count of a claim, stay what
// they were: tagsMatch is one more filter on the candidates the claim
// walks on the queued index. An untagged job, most of any queue, costs
// one comparison with '' (the first arm of the OR); only a tagged job's
// JSON is parsed. A text[] column with <@ would be as cheap on
// PostgreSQL, but SQLite has no arrays: one JSON text column keeps one
// jobRow and one representation for both, and returns byte for byte.

// tagsText is the stored form of a job's tags.
func tagsText(tags []string) string {
	if len(tags) == 0 {
		return ""
	}
	b, err := json.Marshal(tags)
	if err != nil {
		panic(err) // a []string always marshals
	}
	return string(b)
}

// tagsFrom reads a job's stored tags back. Only tagsText writes the
// column; a value that is not a JSON array of strings reads as no tags
// (and a claim, whose SQL reads the column itself, still treats the job
// as tagged).
func tagsFrom(s string) []string {
	if s == "" {
		return nil
	}
	var tags []string
	if json.Unmarshal([]byte(s), &tags) != nil {
		return nil
	}
	return tags
}

// tagsArg is the parameter of tagsMatch: the worker's effective tags as
// a JSON array, [] for none.
func tagsArg(tags []string) string {
	if len(tags) == 0 {
		return "[]"
	}
	return tagsText(tags)
}

// tagsContain is a job list's filter on one tag, with one placeholder
// for tagsArg of that tag: a job matches when its tags include it. An
// untagged job (the empty string) is never parsed.
func (db *DB) tagsContain() string {
	if db.postgres() {
		return "(tags <> '' AND NULLIF(tags, '')::jsonb @> ?::jsonb)"
	}
	return "(tags <> '' AND EXISTS (SELECT 1 FROM json_each(NULLIF(tags, '')) AS t, json_each(?) AS w WHERE t.value = w.value))"
}

// tagsMatch is the claim's filter on tags, with one placeholder for
// tagsArg: a job matches when it has no tags or all of its tags are
// among the worker's (lease.Requirements.TagsMatch). The NULLIF keeps
// the second arm from parsing the empty string whatever order the database evaluates
// the arms in.
func (db *DB) tagsMatch() string {
	if db.postgres() {
		return "(tags = '' OR NULLIF(tags, '')::jsonb <@ ?::jsonb)"
	}
	return "(tags = '' OR NOT EXISTS (SELECT 1 FROM json_each(NULLIF(tags, '')) AS t WHERE t.value NOT IN (SELECT value FROM json_each(?))))"
}
