package bunstore_test

import (
	"context"
	"os"
	"path/filepath"
	"testing"

	"github.com/nodelane/nodelane/internal/testdb"
	"github.com/nodelane/nodelane/lease"
)

// Migration 0016 adds nodelane_jobs.tags: jobs stored before it have no
// tags and stay leasable by every worker, and tagged jobs enqueued after
// it go only to workers that have their tags. The test stores a job,
// takes the database back to before 0016 (its down migration, and its
// row in the history), and opens it again, which migrates it up.
func TestTagsMigration(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	for _, d := range testdb.Dialects() {
		t.Run(d.Name, func(t *testing.T) {
			t.Parallel()
			db := d.New(t)
			first := open(t, db)
			m := lease.NewManager(first.LeaseStore(), nil)
			old, err := m.Enqueue(ctx, lease.NewJob{Type: "status_check"})
			if err != nil {
				t.Fatal(err)
			}
			if err := first.Close(); err != nil {
				t.Fatal(err)
			}

			raw := db.Bun(t)
			down, err := os.ReadFile(filepath.Join("migrations", db.Dialect, "0016_job_tags.tx.down.sql"))
			if err != nil {
				t.Fatal(err)
			}
			if _, err := raw.ExecContext(ctx, string(down)); err != nil {
				t.Fatalf("0016 down: %v", err)
			}
			res, err := raw.ExecContext(ctx, "DELETE FROM nodelane_migrations WHERE name = '0016'")
			if err != nil {
				t.Fatal(err)
			}
			if n, _ := res.RowsAffected(); n != 1 {
				t.Fatalf("deleted %d rows of 0016 from the history, want 1", n)
			}
			var cols int
			if err := raw.NewSelect().TableExpr("nodelane_jobs").ColumnExpr("count(*)").Where("id = ?", old.ID).Scan(ctx, &cols); err != nil || cols != 1 {
				t.Fatalf("the job before 0016: %d rows, %v", cols, err)
			}

			s := open(t, db)
			checkMigrated(t, db)
			m = lease.NewManager(s.LeaseStore(), nil)
			got, err := m.Get(ctx, old.ID)
			if err != nil || len(got.Requirements.Tags) != 0 {
				t.Fatalf("the job stored before 0016: tags %q, %v", got.Requirements.Tags, err)
			}
			tagged, err := m.Enqueue(ctx, lease.NewJob{Type: "status_check", Priority: 1, Requirements: lease.Requirements{Tags: []string{"lab-a"}}})
			if err != nil {
				t.Fatal(err)
			}
			plain, err := m.RegisterWorker(ctx, &lease.Worker{NodeID: "plain", Capabilities: lease.Capabilities{JobTypes: []string{"status_check"}}, Governor: lease.Governor{MaxJobs: 4}})
			if err != nil {
				t.Fatal(err)
			}
			gs, err := m.Lease(ctx, lease.LeaseRequest{WorkerID: plain.ID, MaxJobs: 4})
			if err != nil || len(gs) != 1 || gs[0].Job.ID != old.ID {
				t.Fatalf("an untagged worker leased %d jobs (%v), want only the job from before 0016", len(gs), err)
			}
			lab, err := m.RegisterWorker(ctx, &lease.Worker{NodeID: "lab", Tags: []string{"lab-a"}, Capabilities: lease.Capabilities{JobTypes: []string{"status_check"}}, Governor: lease.Governor{MaxJobs: 4}})
			if err != nil {
				t.Fatal(err)
			}
			gs, err = m.Lease(ctx, lease.LeaseRequest{WorkerID: lab.ID, MaxJobs: 4})
			if err != nil || len(gs) != 1 || gs[0].Job.ID != tagged.ID {
				t.Fatalf("a worker tagged lab-a leased %d jobs (%v), want %s", len(gs), err, tagged.ID)
			}
		})
	}
}
