package bunstore_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/uptrace/bun"
	"github.com/uptrace/bun/migrate"

	"github.com/nodelane/nodelane/bunstore"
	"github.com/nodelane/nodelane/internal/testdb"
	"github.com/nodelane/nodelane/lease"
)

// rows returns every row of table in id order, for comparing snapshots.
func rows(t *testing.T, db *bun.DB, table string) []map[string]any {
	t.Helper()
	var out []map[string]any
	if err := db.NewSelect().TableExpr(table).ColumnExpr("*").OrderExpr("id").Scan(context.Background(), &out); err != nil {
		t.Fatalf("select from %s: %v", table, err)
	}
	return out
}

// wantMigrations is how many migrations bunstore ships for dialect.
func wantMigrations(t *testing.T, dialect string) int {
	t.Helper()
	ups, err := filepath.Glob(filepath.Join("migrations", dialect, "*.up.sql"))
	if err != nil || len(ups) == 0 {
		t.Fatalf("no migrations for %s: %v", dialect, err)
	}
	return len(ups)
}

// checkMigrated checks that every migration is recorded once and that no
// migration lock is left behind.
func checkMigrated(t *testing.T, d testdb.DB) {
	t.Helper()
	raw := d.Bun(t)
	applied := rows(t, raw, "nodelane_migrations")
	if want := wantMigrations(t, d.Dialect); len(applied) != want {
		t.Errorf("nodelane_migrations has %d rows, want %d: %v", len(applied), want, applied)
	}
	if locks := rows(t, raw, "nodelane_migration_locks"); len(locks) != 0 {
		t.Errorf("nodelane_migration_locks still holds %v", locks)
	}
}

// A host that uses bun's migrator itself keeps its bun_migrations and
// bun_migration_locks exactly as they were, even with its lock taken.
func TestMigrateLeavesHostTablesAlone(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	for _, d := range testdb.Dialects() {
		t.Run(d.Name, func(t *testing.T) {
			t.Parallel()
			db := d.New(t)
			raw := db.Bun(t)
			host := migrate.NewMigrator(raw, migrate.NewMigrations())
			if err := host.Init(ctx); err != nil {
				t.Fatal(err)
			}
			for i, name := range []string{"20240101000000", "20240202000000"} {
				if err := host.MarkApplied(ctx, &migrate.Migration{Name: name, GroupID: int64(i + 1)}); err != nil {
					t.Fatal(err)
				}
			}
			if err := host.Lock(ctx); err != nil {
				t.Fatal(err)
			}
			before := map[string][]map[string]any{
				"bun_migrations":      rows(t, raw, "bun_migrations"),
				"bun_migration_locks": rows(t, raw, "bun_migration_locks"),
			}
			if len(before["bun_migrations"]) != 2 || len(before["bun_migration_locks"]) != 1 {
				t.Fatalf("host tables not set up: %v", before)
			}

			open(t, db)

			for table, want := range before {
				if d := cmp.Diff(want, rows(t, raw, table)); d != "" {
					t.Errorf("%s changed (-before +after):\n%s", table, d)
				}
			}
			checkMigrated(t, db)
		})
	}
}

// Migrating an up-to-date database changes nothing.
func TestMigrateTwiceIsNoop(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	for _, d := range testdb.Dialects() {
		t.Run(d.Name, func(t *testing.T) {
			t.Parallel()
			tdb := d.New(t)
			db := open(t, tdb)
			raw := tdb.Bun(t)
			before := rows(t, raw, "nodelane_migrations")
			for range 2 {
				if err := db.Migrate(ctx); err != nil {
					t.Fatalf("Migrate: %v", err)
				}
			}
			if d := cmp.Diff(before, rows(t, raw, "nodelane_migrations")); d != "" {
				t.Errorf("nodelane_migrations changed (-before +after):\n%s", d)
			}
			checkMigrated(t, tdb)
		})
	}
}

// A lock row left by a migrator that crashed is cleared on PostgreSQL,
// where the advisory lock proves it stale. On SQLite nothing can prove
// that, so Migrate waits for it, then gives up naming the table.
func TestMigrateStaleLock(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	for _, d := range testdb.Dialects() {
		t.Run(d.Name, func(t *testing.T) {
			t.Parallel()
			tdb := d.New(t)
			db, err := bunstore.Open(ctx, tdb.DSN, &bunstore.Config{SkipMigrations: true, MigrationLockTimeout: 300 * time.Millisecond})
			if err != nil {
				t.Fatal(err)
			}
			defer db.Close()
			crashed := migrate.NewMigrator(db.Bun(), migrate.NewMigrations(),
				migrate.WithTableName("nodelane_migrations"), migrate.WithLocksTableName("nodelane_migration_locks"))
			if err := crashed.Init(ctx); err != nil {
				t.Fatal(err)
			}
			if err := crashed.Lock(ctx); err != nil {
				t.Fatal(err)
			}
			err = db.Migrate(ctx)
			switch d.Name {
			case "postgres":
				if err != nil {
					t.Fatalf("Migrate over a stale lock: %v", err)
				}
				checkMigrated(t, tdb)
			case "sqlite":
				if !errors.Is(err, context.DeadlineExceeded) || !strings.Contains(err.Error(), "nodelane_migration_locks") {
					t.Fatalf("Migrate over a held lock: err = %v, want a timeout naming the lock table", err)
				}
			}
		})
	}
}

// helperDSN names, in the environment of the helper process that
// TestMigrateConcurrentProcesses starts, the database it opens.
const helperDSN = "NODELANE_MIGRATE_HELPER_DSN"

// TestMigrateHelperProcess is not a test: it is the body of the processes
// that TestMigrateConcurrentProcesses starts, and skips otherwise. It
// says it is up by writing a byte to file descriptor 3, then opens the
// database once its standard input ends: the parent ends every helper's
// at once.
func TestMigrateHelperProcess(t *testing.T) {
	dsn := os.Getenv(helperDSN)
	if dsn == "" {
		t.Skip("helper process of TestMigrateConcurrentProcesses")
	}
	up := os.NewFile(3, "up")
	if _, err := up.Write([]byte{1}); err != nil {
		t.Fatal(err)
	}
	up.Close()
	if _, err := io.Copy(io.Discard, os.Stdin); err != nil {
		t.Fatal(err)
	}
	db, err := bunstore.Open(context.Background(), dsn, nil)
	if err != nil {
		t.Fatalf("Open: %v", err)
	}
	if err := db.Close(); err != nil {
		t.Fatal(err)
	}
}

// Several processes that open the same fresh database at once all
// succeed, and the migrations run once.
func TestMigrateConcurrentProcesses(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("starts processes")
	}
	const procs, rounds = 4, 3
	for _, d := range testdb.Dialects() {
		t.Run(d.Name, func(t *testing.T) {
			t.Parallel()
			for round := range rounds {
				tdb := d.New(t)
				cmds := make([]*exec.Cmd, procs)
				outs := make([]strings.Builder, procs)
				gos := make([]io.Closer, procs)
				for i := range cmds {
					cmd := exec.Command(os.Args[0], "-test.run=^TestMigrateHelperProcess$", "-test.count=1", "-test.v")
					cmd.Env = append(os.Environ(), helperDSN+"="+tdb.DSN)
					cmd.Stdout, cmd.Stderr = &outs[i], &outs[i]
					up, upW, err := os.Pipe()
					if err != nil {
						t.Fatal(err)
					}
					cmd.ExtraFiles = []*os.File{upW}
					if gos[i], err = cmd.StdinPipe(); err != nil {
						t.Fatal(err)
					}
					if err := cmd.Start(); err != nil {
						t.Fatal(err)
					}
					upW.Close()
					cmds[i] = cmd
					// Start together, once every process is up.
					_, err = up.Read(make([]byte, 1))
					up.Close()
					if err != nil {
						cmd.Wait()
						t.Fatalf("round %d, process %d did not come up: %v\n%s", round, i, err, outs[i].String())
					}
				}
				for _, g := range gos {
					g.Close()
				}
				for i, cmd := range cmds {
					if err := cmd.Wait(); err != nil {
						t.Errorf("round %d, process %d: %v\n%s", round, i, err, outs[i].String())
					} else if !strings.Contains(outs[i].String(), "--- PASS: TestMigrateHelperProcess") {
						t.Errorf("round %d, process %d did not migrate:\n%s", round, i, outs[i].String())
					}
				}
				checkMigrated(t, tdb)
			}
		})
	}
}

func TestOpenErrors(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	tests := []struct {
		name string
		dsn  string
		is   error
	}{
		{"unknown scheme", "mysql://root:s3cret@127.0.0.1/db", bunstore.ErrUnsupported},
		{"no scheme", "nodelane.db", bunstore.ErrUnsupported},
		{"keyword DSN", "host=127.0.0.1 user=postgres password=s3cret", bunstore.ErrUnsupported},
		{"postgres unreachable", "postgres://postgres:s3cret@127.0.0.1:1/test?connect_timeout=5", nil},
		{"sqlite directory missing", "sqlite:" + filepath.Join(t.TempDir(), "missing", "x.db"), nil},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			db, err := bunstore.Open(ctx, tc.dsn, nil)
			if err == nil {
				db.Close()
				t.Fatal("Open succeeded")
			}
			if tc.is != nil && !errors.Is(err, tc.is) {
				t.Errorf("err = %v, want %v", err, tc.is)
			}
			if strings.Contains(err.Error(), "s3cret") {
				t.Errorf("the error shows the password: %v", err)
			}
		})
	}
}

func ExampleOpen() {
	ctx := context.Background()
	dir, err := os.MkdirTemp("", "nodelane")
	if err != nil {
		panic(err)
	}
	defer os.RemoveAll(dir)
	db, err := bunstore.Open(ctx, "sqlite:"+filepath.Join(dir, "nodelane.db"), nil)
	if err != nil {
		panic(err)
	}
	defer db.Close()
	workers, err := db.LeaseStore().ListWorkers(ctx, lease.WorkerFilter{Limit: 10})
	fmt.Println(len(workers), err)
	// Output: 0 <nil>
}
