package apitest_test

import (
	"context"
	"errors"
	"net/http"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/nodelane/nodelane/bunstore"
	"github.com/nodelane/nodelane/internal/apitest"
	"github.com/nodelane/nodelane/lease"
)

// TestNew checks that an Env serves its Server with working tokens.
func TestNew(t *testing.T) {
	t.Parallel()
	env := apitest.New(t, "sqlite")
	if env.OperatorToken == "" || env.ProvisioningToken == "" || env.URL == "" {
		t.Fatalf("env = %+v", env)
	}
	st, body := env.Bearer(t, "", http.MethodGet, "/operator/workers", nil)
	if st != http.StatusUnauthorized {
		t.Errorf("no token: %d %s", st, body)
	}
	st, body = env.Operator(t, http.MethodGet, "/no/such/path", nil)
	if st != http.StatusNotFound {
		t.Errorf("unknown path: %d %s", st, body)
	}
}

// TestSQLite checks that SQLite gives each call a database of its own,
// private to the user, with every migration applied and no rows.
func TestSQLite(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	open := func(dsn string) *bunstore.DB {
		t.Helper()
		db, err := bunstore.Open(ctx, dsn, nil)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { db.Close() })
		if err := db.CheckMigrations(ctx); err != nil {
			t.Fatalf("CheckMigrations: %v", err)
		}
		return db
	}
	one, two := apitest.SQLite(t), apitest.SQLite(t)
	if one.Dialect != "sqlite" || one.DSN == two.DSN {
		t.Fatalf("two databases: %+v and %+v", one, two)
	}
	fi, err := os.Stat(strings.TrimPrefix(one.DSN, "sqlite:"))
	if err != nil || fi.Mode().Perm() != 0o600 {
		t.Fatalf("the database file: %v, %v; want mode 0600", fi, err)
	}
	a, b := open(one.DSN), open(two.DSN)
	now := time.Now().UTC().Truncate(time.Microsecond)
	if err := a.LeaseStore().CreateJobs(ctx, []*lease.Job{{
		ID: "job-1", Type: "status_check", State: lease.StateQueued, Attempt: 1, MaxAttempts: 1, CreatedAt: now, ScheduledAt: now, Rev: 1,
	}}); err != nil {
		t.Fatal(err)
	}
	if _, err := a.LeaseStore().GetJob(ctx, "job-1"); err != nil {
		t.Fatalf("the job in its own database: %v", err)
	}
	if _, err := b.LeaseStore().GetJob(ctx, "job-1"); !errors.Is(err, lease.ErrNotFound) {
		t.Fatalf("the job in the other database: %v, want lease.ErrNotFound", err)
	}
	if jobs, err := b.LeaseStore().ListJobs(ctx, lease.JobFilter{Limit: 10}); err != nil || len(jobs) != 0 {
		t.Fatalf("jobs in a fresh database: %d, %v", len(jobs), err)
	}
}
