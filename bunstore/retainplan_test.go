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

// TestDeleteEndedPlanWalksEndedIndex explains the statement that picks
// the jobs DeleteEnded deletes, under deleteEndedSettings, on a table of
// 50,000 ended and 50,000 queued jobs, analyzed or not: the candidates must come from
// nodelane_jobs_ended_idx in finished_at order, so that a batch reads
// about its limit of rows, not the table.
func TestDeleteEndedPlanWalksEndedIndex(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db, err := Open(ctx, testdb.Postgres(t).DSN, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	m := lease.NewManager(db.LeaseStore(), nil)
	ended, err := m.Enqueue(ctx, lease.NewJob{Type: "status_check"})
	if err != nil {
		t.Fatal(err)
	}
	if ended, err = m.Cancel(ctx, ended.ID); err != nil {
		t.Fatal(err)
	}
	if _, err := m.Enqueue(ctx, lease.NewJob{Type: "status_check"}); err != nil {
		t.Fatal(err)
	}
	// 50,000 copies of each job, each its own id, creation and end.
	if _, err := db.bun.ExecContext(ctx, "INSERT INTO nodelane_jobs SELECT r.* FROM nodelane_jobs AS j, generate_series(1, 50000) AS g, "+
		"jsonb_populate_record(NULL::nodelane_jobs, to_jsonb(j) || jsonb_build_object('id', j.id || '_' || g, "+
		"'created_at', j.created_at + g, 'finished_at', j.finished_at + g)) AS r"); err != nil {
		t.Fatal(err)
	}
	start := *ended.FinishedAt
	for _, analyzed := range []bool{false, true} {
		if analyzed {
			if _, err := db.bun.ExecContext(ctx, "ANALYZE nodelane_jobs"); err != nil {
				t.Fatal(err)
			}
		}
		// A cutoff that every ended job is before, and one that a few are.
		for _, cutoff := range []time.Duration{time.Hour, 10 * time.Microsecond} {
			t.Run(fmt.Sprintf("analyzed=%t/cutoff=%v", analyzed, cutoff), func(t *testing.T) {
				q := db.endedJobs(db.bun, start.Add(cutoff), lease.PruneBatch).String()
				tx, err := db.bun.BeginTx(ctx, nil)
				if err != nil {
					t.Fatal(err)
				}
				defer tx.Rollback()
				if _, err := tx.ExecContext(ctx, deleteEndedSettings); err != nil {
					t.Fatal(err)
				}
				var plan string
				if err := tx.QueryRowContext(ctx, "EXPLAIN (FORMAT JSON) "+q).Scan(&plan); err != nil {
					t.Fatal(err)
				}
				var nodes []struct{ Plan planNode }
				if err := json.Unmarshal([]byte(plan), &nodes); err != nil {
					t.Fatal(err)
				}
				lock := nodes[0].Plan.find("LockRows")
				if lock == nil || len(lock.Plans) != 1 {
					t.Fatalf("no LockRows node with one input in the plan:\n%s", plan)
				}
				if in := lock.Plans[0]; in.NodeType != "Index Scan" || in.IndexName != "nodelane_jobs_ended_idx" {
					t.Errorf("DeleteEnded locks candidates from %s %s, want an Index Scan of nodelane_jobs_ended_idx; plan:\n%s",
						in.NodeType, in.IndexName, strings.TrimSpace(plan))
				}
				if nodes[0].Plan.find("Sort") != nil || nodes[0].Plan.find("Seq Scan") != nil {
					t.Errorf("DeleteEnded's plan sorts or scans the table:\n%s", strings.TrimSpace(plan))
				}
			})
		}
	}
}

// On SQLite too, the candidates come from the index, in order.
func TestDeleteEndedPlanSQLite(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db, err := Open(ctx, testdb.SQLite(t).DSN, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	q := db.endedJobs(db.bun, time.Now(), lease.PruneBatch).String()
	plan := explainSQLite(t, ctx, db, q)
	if !strings.Contains(plan, "USING INDEX nodelane_jobs_ended_idx") || strings.Contains(plan, "TEMP B-TREE") {
		t.Errorf("DeleteEnded's plan on SQLite, for %s:\n%s\nwant a search of nodelane_jobs_ended_idx without a sort", q, plan)
	}
}
