package bunstore

import (
	"context"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/nodelane/nodelane/internal/testdb"
)

func TestSQLiteDSN(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name string
		dsn  string
		path string
		want url.Values
		// ownMode: the DSN sets the journal mode, so Open leaves it.
		ownMode bool
	}{
		{
			name: "defaults",
			dsn:  "sqlite:/data/nodelane.db",
			path: "file:/data/nodelane.db",
			want: url.Values{
				"_pragma": {"busy_timeout(10000)", "foreign_keys(1)", "synchronous(NORMAL)"},
				"_txlock": {"immediate"},
			},
		},
		{
			name: "file DSN keeps its settings",
			dsn:  "file:x.db?_pragma=busy_timeout(5)&_pragma=JOURNAL_MODE = DELETE&_txlock=exclusive&_fk=0&cache=shared",
			path: "file:x.db",
			want: url.Values{
				"_pragma": {"busy_timeout(5)", "JOURNAL_MODE = DELETE", "synchronous(NORMAL)"},
				"_txlock": {"exclusive"},
				"_fk":     {"0"},
				"cache":   {"shared"},
			},
			ownMode: true,
		},
		{
			name: "shorthand keys count",
			dsn:  "file:x.db?_busy_timeout=1&_sync=FULL",
			path: "file:x.db",
			want: url.Values{
				"_busy_timeout": {"1"},
				"_sync":         {"FULL"},
				"_pragma":       {"foreign_keys(1)"},
				"_txlock":       {"immediate"},
			},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			got, ownMode := sqliteDSN(tc.dsn, 10*time.Second)
			if ownMode != tc.ownMode {
				t.Errorf("sqliteDSN(%q) reports own journal mode %v, want %v", tc.dsn, ownMode, tc.ownMode)
			}
			path, query, _ := strings.Cut(got, "?")
			q, err := url.ParseQuery(query)
			if err != nil {
				t.Fatal(err)
			}
			if path != tc.path || q.Encode() != tc.want.Encode() {
				t.Errorf("sqliteDSN(%q) = %q, want path %q and %v", tc.dsn, got, tc.path, tc.want)
			}
		})
	}
}

// The down migrations undo the up migrations, and the schema can be
// rebuilt after them.
func TestMigrationsRollBack(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	for _, d := range testdb.Dialects() {
		t.Run(d.Name, func(t *testing.T) {
			t.Parallel()
			db, err := Open(ctx, d.New(t).DSN, nil)
			if err != nil {
				t.Fatal(err)
			}
			defer db.Close()
			tables := func() []string {
				t.Helper()
				var names []string
				q := "SELECT name FROM sqlite_master WHERE type = 'table' AND name LIKE 'nodelane\\_%' ESCAPE '\\' ORDER BY name"
				if db.postgres() {
					q = "SELECT table_name FROM information_schema.tables WHERE table_schema = current_schema() AND table_name LIKE 'nodelane\\_%' ESCAPE '\\' ORDER BY table_name"
				}
				if err := db.Bun().NewRaw(q).Scan(ctx, &names); err != nil {
					t.Fatal(err)
				}
				return names
			}
			migrated := tables()
			m, err := db.migrator()
			if err != nil {
				t.Fatal(err)
			}
			if _, err := m.Rollback(ctx); err != nil {
				t.Fatalf("Rollback: %v", err)
			}
			if got := tables(); len(got) != 2 || got[0] != "nodelane_migration_locks" || got[1] != "nodelane_migrations" {
				t.Errorf("after rolling back, tables = %v", got)
			}
			if err := db.Migrate(ctx); err != nil {
				t.Fatalf("Migrate after Rollback: %v", err)
			}
			if got := tables(); strings.Join(got, ",") != strings.Join(migrated, ",") {
				t.Errorf("after migrating again, tables = %v, want %v", got, migrated)
			}
		})
	}
}

// A read that began before an invalidation is not kept: it may hold the
// value from before the change. One that began after is.
func TestReadCacheGeneration(t *testing.T) {
	t.Parallel()
	now := time.Unix(1000, 0)
	c := newReadCache(time.Second, 0)
	c.now = func() time.Time { return now }

	gen, at := c.begin()
	c.drop("k") // a change committed while the read ran
	c.put("k", gen, at, "old")
	if v, ok := c.get("k"); ok {
		t.Fatalf("a read from before the change was kept: %v", v)
	}
	gen, at = c.begin()
	c.put("k", gen, at, "new")
	if v, ok := c.get("k"); !ok || v != "new" {
		t.Fatalf("get = %v, %v; want new", v, ok)
	}
	// An entry lives CacheTTL from the start of the read that gave it.
	now = now.Add(time.Second - 1)
	if _, ok := c.get("k"); !ok {
		t.Fatal("an entry was gone before its TTL")
	}
	now = now.Add(1)
	if _, ok := c.get("k"); ok {
		t.Fatal("an entry outlived its TTL")
	}
	gen, at = c.begin()
	c.listen(true) // a listener connects: notifications may have been missed
	c.put("k", gen, at, "old")
	if _, ok := c.get("k"); ok {
		t.Fatal("a read from before a listener connected was kept")
	}
	if newReadCache(-1, 0) != nil {
		t.Fatal("a negative TTL made a cache")
	}
}

// While a listener is connected entries live the listened TTL, else the
// TTL; a listener that connects or disconnects empties the cache.
func TestReadCacheListening(t *testing.T) {
	t.Parallel()
	now := time.Unix(1000, 0)
	c := newReadCache(time.Second, time.Minute)
	c.now = func() time.Time { return now }
	put := func() {
		gen, at := c.begin()
		c.put("k", gen, at, "v")
	}
	put()
	now = now.Add(2 * time.Second)
	if _, ok := c.get("k"); ok {
		t.Fatal("without a listener an entry outlived the TTL")
	}
	c.listen(true)
	put()
	now = now.Add(59 * time.Second)
	if _, ok := c.get("k"); !ok {
		t.Fatal("while listening an entry was gone before the listened TTL")
	}
	c.listen(false)
	if _, ok := c.get("k"); ok {
		t.Fatal("a lost listener left the cache as it was")
	}
	put()
	now = now.Add(2 * time.Second)
	if _, ok := c.get("k"); ok {
		t.Fatal("after the listener went, an entry outlived the TTL")
	}
	c.listen(true)
	put()
	c.listen(true) // a second Notifier connects
	if _, ok := c.get("k"); ok {
		t.Fatal("a listener that connected left the cache as it was")
	}
}
