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
				"_pragma": {"busy_timeout(10000)", "foreign_keys(1)", "synchronous(NORMAL)", "temp_store(MEMORY)"},
				"_txlock": {"immediate"},
			},
		},
		{
			name: "file DSN keeps its settings",
			dsn:  "file:x.db?_pragma=busy_timeout(5)&_pragma=JOURNAL_MODE = DELETE&_pragma=temp_store(FILE)&_txlock=exclusive&_fk=0&cache=shared",
			path: "file:x.db",
			want: url.Values{
				"_pragma": {"busy_timeout(5)", "JOURNAL_MODE = DELETE", "temp_store(FILE)", "synchronous(NORMAL)"},
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
				"_pragma":       {"foreign_keys(1)", "temp_store(MEMORY)"},
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

// look reads the cache's entry k as cachedRead does, the version row
// reading version when a look at it is due; it reports whether the entry
// was served and whether the version was looked at.
func look(c *readCache, k string, version int64) (v any, ok, looked bool) {
	v, ok, due := c.get(k)
	if due {
		c.checkedAt(c.now(), version, nil)
		v, ok = c.peek(k)
	}
	return v, ok, due
}

// A read that began before an invalidation is not kept: it may hold the
// value from before the change. One that began after is, and is served
// as long as the version reads as it did, looked at once per TTL; a new
// version empties the cache.
func TestReadCacheGeneration(t *testing.T) {
	t.Parallel()
	now := time.Unix(1000, 0)
	c := newReadCache(time.Second, 0)
	c.now = func() time.Time { return now }
	if _, ok, looked := look(c, "k", 7); ok || !looked {
		t.Fatalf("an empty cache: served %v, looked at the version %v", ok, looked)
	}

	gen := c.begin()
	c.drop("k") // a change committed while the read ran
	c.put("k", gen, "old")
	if v, ok, _ := look(c, "k", 7); ok {
		t.Fatalf("a read from before the change was kept: %v", v)
	}
	gen = c.begin()
	c.put("k", gen, "new")
	if v, ok, looked := look(c, "k", 7); !ok || v != "new" || looked {
		t.Fatalf("get = %v, %v, looked %v; want new without a look", v, ok, looked)
	}
	// Past the TTL the version is looked at, once, and the entry stays.
	now = now.Add(time.Second - 1)
	if _, _, looked := look(c, "k", 7); looked {
		t.Fatal("the version was looked at before the TTL")
	}
	now = now.Add(1)
	if _, ok, looked := look(c, "k", 7); !ok || !looked {
		t.Fatalf("past the TTL, the same version: served %v, looked %v; want both", ok, looked)
	}
	// One look at a time: a read while another looks goes to the database.
	now = now.Add(time.Second)
	if _, _, due := c.get("k"); !due {
		t.Fatal("past the TTL the look was not due")
	}
	if _, ok, due := c.get("k"); ok || due {
		t.Fatalf("while a look ran: served %v, due %v; want neither", ok, due)
	}
	c.checkedAt(now, 8, nil) // a change was made elsewhere
	if _, ok, _ := c.get("k"); ok {
		t.Fatal("a new version left the entries")
	}
	gen = c.begin()
	c.listen(true) // a listener connects: notifications may have been missed
	c.put("k", gen, "old")
	if _, ok, _ := look(c, "k", 8); ok {
		t.Fatal("a read from before a listener connected was kept")
	}
	// A failed look vouches for nothing.
	c.listen(false)
	gen = c.begin()
	c.put("k", gen, "v")
	now = now.Add(time.Hour)
	if _, _, due := c.get("k"); !due {
		t.Fatal("past the TTL the look was not due")
	}
	c.checkedAt(now, 0, errNoCheck)
	if _, ok := c.peek("k"); ok {
		t.Fatal("after a failed look, the entry was served")
	}
	if _, ok, due := c.get("k"); ok || !due {
		t.Fatalf("after a failed look and a peek: served %v, due %v; want a look due again", ok, due)
	}
	if newReadCache(-1, 0) != nil {
		t.Fatal("a negative TTL made a cache")
	}
}

// While a listener is connected the version is looked at every listened
// TTL, else every TTL; a listener that connects or disconnects empties
// the cache.
func TestReadCacheListening(t *testing.T) {
	t.Parallel()
	now := time.Unix(1000, 0)
	c := newReadCache(time.Second, time.Minute)
	c.now = func() time.Time { return now }
	put := func() {
		gen := c.begin()
		c.put("k", gen, "v")
	}
	look(c, "k", 1)
	put()
	now = now.Add(2 * time.Second)
	if _, _, looked := look(c, "k", 1); !looked {
		t.Fatal("without a listener the version went unread past the TTL")
	}
	c.listen(true)
	put()
	now = now.Add(59 * time.Second)
	if _, ok, looked := look(c, "k", 1); !ok || looked {
		t.Fatalf("while listening, before the listened TTL: served %v, looked %v", ok, looked)
	}
	now = now.Add(time.Second)
	if _, ok, looked := look(c, "k", 1); !ok || !looked {
		t.Fatalf("while listening, past the listened TTL: served %v, looked %v", ok, looked)
	}
	c.listen(false)
	if _, ok, _ := look(c, "k", 1); ok {
		t.Fatal("a lost listener left the cache as it was")
	}
	put()
	now = now.Add(2 * time.Second)
	if _, _, looked := look(c, "k", 1); !looked {
		t.Fatal("after the listener went, the version went unread past the TTL")
	}
	c.listen(true)
	put()
	c.listen(true) // a second Notifier connects
	if _, ok, _ := look(c, "k", 1); ok {
		t.Fatal("a listener that connected left the cache as it was")
	}
}
