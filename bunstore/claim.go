package bunstore

import (
	"context"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"slices"
	"strings"

	"github.com/uptrace/bun"

	"github.com/nodelane/nodelane/lease"
)

// Claims (lease.Store's ClaimLeases). The calls that run outside a
// transaction are gathered (batcher) like Accept and Complete, into one
// transaction and one commit. That transaction locks the workers of the
// batch (on PostgreSQL: SQLite has one writer), reads them, and claims
// for all of them in one statement per kind of claim (the same job types
// and shapes: usually one), so that the head of the queue is walked once
// for the batch rather than once a worker. A call inside the context's
// transaction claims there, alone.

// maxClaimBatch bounds the ClaimLeases calls of one gathered claim.
const maxClaimBatch = 64

// A claim's transaction on PostgreSQL sets planner settings (SET LOCAL,
// with set_config(…, true) in sql/pg/claim_lock.sql: they end with it).
// A queue's statistics lag it: with a burst just enqueued, or a table
// never analyzed, the planner estimates a handful of queued jobs and
// would take every one of them through another index on state, sort them
// and keep the first few (measured: 97 ms a claim with 48,000 queued,
// throughput falling with the backlog). So:
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

// claimPlan is the plan function of a ClaimLeases call.
type claimPlan = func(*lease.Worker) (lease.ClaimQuery, lease.LeaseClaim, bool, error)

// claimCall is one ClaimLeases call.
type claimCall struct {
	workerID string
	plan     claimPlan
}

// claimResult is what a claimCall gets: the jobs it claimed, in claim
// order, or its own error, which costs the other calls of its batch
// nothing.
type claimResult struct {
	jobs []*lease.Job
	err  error
}

// ClaimLeases implements lease.Store: it reads the worker and claims for
// it in one transaction, in one statement that picks the candidates in
// claim order (skipping rows other claims hold, on PostgreSQL) and writes
// their leases, RETURNING them. Claims by one worker are serialised: on
// SQLite by its one writer; on PostgreSQL by an advisory lock on the
// worker id, taken in the statement before the worker's live leases are
// counted, so that the claim's snapshot sees every claim that took it
// earlier (the lock, unlike a row lock on the worker, does not hold up
// its heartbeats).
func (s *LeaseStore) ClaimLeases(ctx context.Context, workerID string, plan claimPlan) ([]*lease.Job, error) {
	call := claimCall{workerID: workerID, plan: plan}
	rs := []claimResult{{}}
	var err error
	if _, ok := txFrom(ctx); ok {
		rs, err = s.db.claimTx(ctx, []claimCall{call})
	} else {
		rs[0], err = s.db.claims.do(ctx, call)
	}
	if err == nil {
		err = rs[0].err
	}
	if err != nil {
		return nil, fmt.Errorf("bunstore: claim jobs for %s: %w", workerID, err)
	}
	return rs[0].jobs, nil
}

// claimTx runs the claims of calls in one transaction (the context's, if
// it carries one), again if the database aborted it.
func (db *DB) claimTx(ctx context.Context, calls []claimCall) ([]claimResult, error) {
	var out []claimResult
	err := aborted(db.retryOwnTx(ctx, func() error {
		return db.inTx(ctx, func(ctx context.Context, tx bun.IDB) error {
			var err error
			out, err = db.claimIn(ctx, tx, calls)
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

// claimIn claims for calls in tx. On PostgreSQL it locks every worker of
// calls (in id order, so that two batches cannot deadlock). It reads them
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
	if db.postgres() {
		if _, err := db.execBound(ctx, tx, db.sql.claimLock, ids); err != nil {
			return nil, err
		}
	}
	var rows []workerLive
	if err := db.scanBound(ctx, tx, db.sql.claimWorkers, []any{db.list(ids)}, &rows); err != nil {
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
		q, c, ok, err := call.plan(w)
		if err == nil && ok && q.Limit <= 0 {
			err = errLimit("claim jobs for "+q.WorkerID, q.Limit)
		}
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
			var written []jobRow
			if err := db.scanBound(ctx, tx, db.sql.claim, db.claimArgs(g), &written); err != nil {
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

// claimArgs are the arguments of the claim (sql/*/claim.sql) for the
// calls of g, which share job types, shapes and tags: the claim locks as
// many candidates as the calls may take, in claim order, and gives the
// k-th of them the k-th lease of the calls' leases. On PostgreSQL lists
// are arrays (the leases one a field, zipped with the candidates by a
// many-argument unnest, which the planner estimates at a few rows), on
// SQLite JSON.
func (db *DB) claimArgs(g []planned) []any {
	type price struct {
		W     string `json:"w"`
		SKU   string `json:"sku"`
		Price int64  `json:"price"`
	}
	type claimLease struct {
		ID      string `json:"lid"`
		W       string `json:"w"`
		DSKU    string `json:"dsku"`
		TH      string `json:"th"`
		Now     int64  `json:"now"`
		Exp     int64  `json:"exp"`
		Acc     int64  `json:"acc"`
		PV      int64  `json:"pv"`
		Accept  bool   `json:"ak"`
		Runtime int64  `json:"maxrt"`
	}
	var ls []claimLease
	ps := []price{} // JSON [], not null, when no call has prices
	oldest := g[0].q.Now
	for _, p := range g {
		for _, l := range p.c.Leases[:p.n] {
			ls = append(ls, claimLease{l.ID, p.q.WorkerID, p.c.DefaultSKU, hex.EncodeToString(l.TokenHash), micros(p.q.Now),
				micros(l.ExpiresAt), micros(l.AcceptBy), l.PolicyVersion, p.c.Accept, p.c.MaxRuntime.Microseconds()})
		}
		for sku, pr := range p.c.Prices {
			ps = append(ps, price{p.q.WorkerID, sku, pr})
		}
		// A job scheduled after any call's now is claimed for none.
		if p.q.Now.Before(oldest) {
			oldest = p.q.Now
		}
	}
	q := g[0].q
	type fit struct {
		SKU  string `json:"sku"`
		GPUs int    `json:"gpus"`
		VRAM int    `json:"vram"`
	}
	fits := make([]fit, len(q.Fits))
	for i, f := range q.Fits {
		fits[i] = fit{f.SKU, f.GPUs, f.VRAMMB}
	}
	if !db.postgres() {
		return []any{jsonText(ps), db.list(q.Types), micros(oldest), jsonText(fits), tagsArg(q.Tags), len(ls), jsonText(ls)}
	}
	var (
		skus, lid, w, dsku     []string
		gpus, vram             []int64
		th                     [][]byte
		now, exp, acc, pv, mrt []int64
		ak                     []bool
	)
	for _, f := range fits {
		skus, gpus, vram = append(skus, f.SKU), append(gpus, int64(f.GPUs)), append(vram, int64(f.VRAM))
	}
	for _, l := range ls {
		h, _ := hex.DecodeString(l.TH)
		lid, w, dsku, th = append(lid, l.ID), append(w, l.W), append(dsku, l.DSKU), append(th, h)
		now, exp, acc, pv = append(now, l.Now), append(exp, l.Exp), append(acc, l.Acc), append(pv, l.PV)
		ak, mrt = append(ak, l.Accept), append(mrt, l.Runtime)
	}
	return []any{jsonText(ps), q.Types, micros(oldest), skus, gpus, vram, tagsArg(q.Tags), len(ls),
		lid, w, dsku, th, now, exp, acc, pv, ak, mrt}
}

// list is ids as a parameter: an array on PostgreSQL, JSON on SQLite.
func (db *DB) list(ids []string) any {
	if db.postgres() {
		return ids
	}
	return jsonText(ids)
}

// jsonText is v, a value that always marshals, as JSON text.
func jsonText(v any) string {
	b, err := json.Marshal(v)
	if err != nil {
		panic(err)
	}
	return string(b)
}

// Tags (lease.Requirements.Tags, migration 0016). A job's tags are stored
// in one text column, '' for a job without any, else a JSON array of
// strings, sorted and deduplicated. A claim passes the worker's effective
// tags (lease.ClaimQuery.Tags) as one JSON array parameter, so that a
// claim's statement text, and the statement count of a claim, stay what
// they were: its filter on tags (sql/*/claim.sql) is one more filter on
// the candidates the claim walks on the queued index. An untagged job, most of any queue, costs
// one comparison with '' (the first arm of the OR); only a tagged job's
// JSON is parsed. A text[] column with <@ would be as cheap on
// PostgreSQL, but SQLite has no arrays: one JSON text column keeps one
// jobRow and one representation for both, and returns byte for byte.

// tagsText is the stored form of a job's tags.
func tagsText(tags []string) string {
	if len(tags) == 0 {
		return ""
	}
	return jsonText(tags)
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

// tagsArg is the parameter of the claim's filter on tags: the worker's
// effective tags as a JSON array, [] for none.
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
