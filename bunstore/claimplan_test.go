package bunstore

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/nodelane/nodelane/internal/testdb"
	"github.com/nodelane/nodelane/lease"
)

// TestClaimPlanWalksQueuedIndex explains the claim statement on a table
// whose statistics lag its queue (thousands of jobs enqueued, never
// analyzed), under the claim's settings (sql/pg/claim_lock.sql): the candidates must come from the
// queued index, in claim order, not from a sort of every queued job.
func TestClaimPlanWalksQueuedIndex(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db, err := Open(ctx, testdb.Postgres(t).DSN, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	m := lease.NewManager(db.LeaseStore(), nil)
	if _, err := m.Enqueue(ctx, lease.NewJob{Type: "status_check"}); err != nil {
		t.Fatal(err)
	}
	// 50,000 copies of that job, each its own id and creation time.
	if _, err := db.bun.ExecContext(ctx, "INSERT INTO nodelane_jobs SELECT r.* FROM nodelane_jobs AS j, generate_series(1, 50000) AS g, "+
		"jsonb_populate_record(NULL::nodelane_jobs, to_jsonb(j) || jsonb_build_object('id', j.id || '_' || g, 'created_at', j.created_at + g)) AS r"); err != nil {
		t.Fatal(err)
	}
	// A claim of one call, and one gathered from many calls (a larger
	// limit, more rows to join back to the table); on the table never
	// analyzed, then analyzed (where a scan of the whole table looks
	// cheaper than hundreds of lookups by key).
	for _, analyzed := range []bool{false, true} {
		if analyzed {
			if _, err := db.bun.ExecContext(ctx, "ANALYZE nodelane_jobs"); err != nil {
				t.Fatal(err)
			}
		}
		for _, n := range []int{10, 300} {
			for _, mode := range []string{"force_generic_plan", "force_custom_plan"} {
				t.Run(fmt.Sprintf("analyzed=%t/limit=%d/%s", analyzed, n, mode), func(t *testing.T) {
					explainClaim(t, ctx, db, n, mode)
				})
			}
		}
	}
}

// explainClaim explains the plan of a claim of n jobs under
// the claim's settings, generic or custom (plan_cache_mode; a statement prepared
// once and run many times gets either), and checks the two places where estimates from lagging
// statistics go wrong: the candidates must come from the queued index in
// claim order, and the claimed rows must be found by primary key, not by
// hashing or merging a scan of the whole table.
func explainClaim(t *testing.T, ctx context.Context, db *DB, n int, mode string) {
	q := lease.ClaimQuery{WorkerID: "w", Types: []string{"status_check"}, Fits: []lease.Fit{{}}, MaxActive: n, Limit: n, Now: time.Now()}
	c := lease.LeaseClaim{Leases: make([]lease.Lease, n)}
	for i := range c.Leases {
		c.Leases[i] = lease.Lease{ID: fmt.Sprintf("l%d", i), TokenHash: []byte{1}, ExpiresAt: q.Now.Add(time.Hour), AcceptBy: q.Now.Add(time.Minute)}
	}
	args := db.claimArgs([]planned{{q: q, c: c, n: n}})
	tx, err := db.bun.BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback()
	if _, err := db.execBound(ctx, tx, db.sql.claimLock, []string{"w"}); err != nil {
		t.Fatal(err)
	}
	if _, err := tx.ExecContext(ctx, "SET LOCAL plan_cache_mode = "+mode); err != nil {
		t.Fatal(err)
	}
	// A prepared statement outlives the transaction on its connection.
	name := fmt.Sprintf("claim_%d", n)
	if _, err := tx.Tx.ExecContext(ctx, "PREPARE "+name+" AS "+db.sql.claim); err != nil {
		t.Fatal(err)
	}
	defer tx.Tx.ExecContext(ctx, "DEALLOCATE "+name)
	ps := make([]string, len(args))
	for i := range ps {
		ps[i] = fmt.Sprintf("$%d", i+1)
	}
	var plan string
	if err := tx.Tx.QueryRowContext(ctx, "EXPLAIN (FORMAT JSON) EXECUTE "+name+"("+strings.Join(ps, ", ")+")", args...).Scan(&plan); err != nil {
		t.Fatal(err)
	}
	var nodes []struct {
		Plan planNode
	}
	if err := json.Unmarshal([]byte(plan), &nodes); err != nil {
		t.Fatal(err)
	}
	// The node under LockRows is the candidates' scan.
	lock := nodes[0].Plan.find("LockRows")
	if lock == nil || len(lock.Plans) != 1 {
		t.Fatalf("no LockRows node with one input in the plan:\n%s", plan)
	}
	if in := lock.Plans[0]; in.NodeType != "Index Scan" || in.IndexName != "nodelane_jobs_queued_idx" {
		t.Errorf("the claim locks candidates from %s %s, want an Index Scan of nodelane_jobs_queued_idx; plan:\n%s",
			in.NodeType, in.IndexName, strings.TrimSpace(plan))
	}
	for _, typ := range []string{"Seq Scan", "Hash Join", "Merge Join"} {
		if nodes[0].Plan.find(typ) != nil {
			t.Errorf("the claim's plan has a %s; want the claimed rows found by primary key:\n%s", typ, strings.TrimSpace(plan))
		}
	}
}

// planNode is a node of EXPLAIN (FORMAT JSON)'s plan.
type planNode struct {
	NodeType  string     `json:"Node Type"`
	IndexName string     `json:"Index Name"`
	Plans     []planNode `json:"Plans"`
}

// find returns the first node of type typ in n's tree, depth first.
func (n *planNode) find(typ string) *planNode {
	if n.NodeType == typ {
		return n
	}
	for i := range n.Plans {
		if f := n.Plans[i].find(typ); f != nil {
			return f
		}
	}
	return nil
}

// TestClaimPlanSQLite checks that a claim on SQLite, with and
// without tags and GPU shapes, takes its candidates from
// nodelane_jobs_queued_idx in claim order, not from a sort of every
// queued job.
func TestClaimPlanSQLite(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db, err := Open(ctx, Migrated.New(t).DSN, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	for _, tc := range []struct {
		name string
		q    lease.ClaimQuery
	}{
		{"cpu", lease.ClaimQuery{WorkerID: "w", Types: []string{"status_check"}, Fits: []lease.Fit{{}}, Now: time.Now()}},
		{"gpus and tags", lease.ClaimQuery{WorkerID: "w", Types: []string{"status_check", "lora_train"},
			Fits: []lease.Fit{{}, {SKU: "h100", GPUs: 2, VRAMMB: 80000}}, Tags: []string{"eu", "spot"}, Now: time.Now()}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			c := lease.LeaseClaim{Leases: make([]lease.Lease, 10)}
			plan := explainSQLite(t, ctx, db, db.sql.claim, db.claimArgs([]planned{{q: tc.q, c: c, n: 10}})...)
			if !strings.Contains(plan, "USING INDEX nodelane_jobs_queued_idx") || strings.Contains(plan, "TEMP B-TREE") {
				t.Errorf("the claim's plan on SQLite, for %s:\n%s\nwant a walk of nodelane_jobs_queued_idx without a sort", tc.name, plan)
			}
		})
	}
}

// explainSQLite returns the steps of SQLite's plan for query, a line each.
func explainSQLite(t *testing.T, ctx context.Context, db *DB, query string, args ...any) string {
	t.Helper()
	rows, err := db.bun.DB.QueryContext(ctx, "EXPLAIN QUERY PLAN "+query, args...)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	var steps []string
	for rows.Next() {
		var id, parent, unused int
		var detail string
		if err := rows.Scan(&id, &parent, &unused, &detail); err != nil {
			t.Fatal(err)
		}
		steps = append(steps, detail)
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	return strings.Join(steps, "\n")
}
