package bunstore_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"log/slog"
	"net/url"
	"testing"
	"time"

	"github.com/nodelane/nodelane/bunstore"
	"github.com/nodelane/nodelane/internal/logtest"
	"github.com/nodelane/nodelane/internal/testdb"
)

func intAttr(r slog.Record, key string) int64 {
	var v int64
	r.Attrs(func(a slog.Attr) bool {
		if a.Key == key {
			v = a.Value.Int64()
			return false
		}
		return true
	})
	return v
}

// While the database refuses the listener's every reconnection, the
// Notifier logs one ERROR, not one per attempt, and once it is back an
// INFO with the count of failed attempts. The outage is real: the
// listener's role is made NOLOGIN and its connection terminated.
func TestNotifierOutageLoggedOnce(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	tdb := testdb.Postgres(t)
	admin := open(t, tdb)
	var b [6]byte
	rand.Read(b[:])
	role := "nodelane_test_listener_" + hex.EncodeToString(b[:])
	if _, err := admin.Bun().ExecContext(ctx, "CREATE ROLE "+role+" LOGIN"); err != nil {
		t.Fatal(err)
	}
	// Registered before the role's DB opens, so it runs after that closes.
	t.Cleanup(func() {
		if _, err := admin.Bun().ExecContext(ctx, "DROP ROLE "+role); err != nil {
			t.Errorf("DROP ROLE: %v", err)
		}
	})
	u, err := url.Parse(tdb.DSN)
	if err != nil {
		t.Fatal(err)
	}
	u.User = url.User(role)
	db, err := bunstore.Open(ctx, u.String(), &bunstore.Config{SkipMigrations: true})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	logs := logtest.New()
	n := notifier(t, db, &bunstore.NotifierConfig{
		ReconnectMin: time.Millisecond, ReconnectMax: 5 * time.Millisecond, Logger: slog.New(logs),
	})

	if _, err := admin.Bun().ExecContext(ctx, "ALTER ROLE "+role+" NOLOGIN"); err != nil {
		t.Fatal(err)
	}
	pids := listeners(t, admin, n.Channel())
	if len(pids) != 1 {
		t.Fatalf("found %d listener connections, want 1", len(pids))
	}
	var ok bool
	if err := admin.Bun().NewRaw("SELECT pg_terminate_backend(?)", pids[0]).Scan(ctx, &ok); err != nil || !ok {
		t.Fatalf("pg_terminate_backend(%d) = %v, %v", pids[0], ok, err)
	}
	const attempts = 5
	logs.WaitFor(t, "failed reconnections", func(r slog.Record) bool { return intAttr(r, "failed_attempts") >= attempts })
	if _, err := admin.Bun().ExecContext(ctx, "ALTER ROLE "+role+" LOGIN"); err != nil {
		t.Fatal(err)
	}
	r := logs.WaitFor(t, "reconnected", func(r slog.Record) bool { return r.Message == "bunstore: notifier reconnected" })
	if got := intAttr(r, "failed_attempts"); got < attempts {
		t.Errorf("reconnected after %d failed attempts, want at least %d", got, attempts)
	}
	var errs int
	for _, r := range logs.Records() {
		if r.Level >= slog.LevelError {
			errs++
		}
	}
	if errs != 1 {
		t.Errorf("%d ERROR records in one outage, want 1", errs)
	}
}
