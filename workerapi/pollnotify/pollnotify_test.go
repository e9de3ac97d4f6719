package pollnotify_test

import (
	"context"
	"database/sql"
	"errors"
	"log/slog"
	"maps"
	"slices"
	"strings"
	"testing"
	"time"

	_ "github.com/jackc/pgx/v5/stdlib" // the "pgx" database/sql driver
	"github.com/uptrace/bun"
	_ "modernc.org/sqlite" // the "sqlite" database/sql driver

	"github.com/nodelane/nodelane/internal/logtest"
	"github.com/nodelane/nodelane/internal/testdb"
	"github.com/nodelane/nodelane/internal/waitfor"
	"github.com/nodelane/nodelane/workerapi"
	"github.com/nodelane/nodelane/workerapi/pollnotify"
)

var (
	_ workerapi.Notifier = (*pollnotify.Notifier)(nil)
	_ pollnotify.Counter = (*pollnotify.SQLCounter)(nil)
	_ pollnotify.Execer  = (*sql.DB)(nil)
	_ pollnotify.Execer  = (*sql.Tx)(nil)
	_ pollnotify.Execer  = (*sql.Conn)(nil)
	_ pollnotify.Execer  = bun.IDB(nil)
)

// txKey carries a *sql.Tx in a context, as a host's Transactor would.
type txKey struct{}

func withTx(ctx context.Context, tx *sql.Tx) context.Context {
	return context.WithValue(ctx, txKey{}, tx)
}

// txOf is the tx function of the tests' SQLCounters.
func txOf(ctx context.Context) (pollnotify.Execer, bool) {
	tx, ok := ctx.Value(txKey{}).(*sql.Tx)
	return tx, ok
}

// open opens a handle on d through database/sql: each call a pool of its
// own, as another process's would be. It is closed when the test ends.
func open(t testing.TB, d testdb.DB) *sql.DB {
	t.Helper()
	var db *sql.DB
	var err error
	switch d.Dialect {
	case "sqlite":
		path := strings.TrimPrefix(d.DSN, "sqlite:")
		db, err = sql.Open("sqlite", "file:"+path+"?_pragma=busy_timeout(10000)&_pragma=journal_mode(WAL)")
	default:
		db, err = sql.Open("pgx", d.DSN)
	}
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	return db
}

// counter returns a SQLCounter on db's DefaultTable, made by its DDL.
func counter(t testing.TB, db *sql.DB) *pollnotify.SQLCounter {
	t.Helper()
	c, err := pollnotify.NewSQLCounter(db, "", txOf)
	if err != nil {
		t.Fatal(err)
	}
	for _, q := range c.DDL() {
		if _, err := db.Exec(q); err != nil {
			t.Fatalf("%s: %v", q, err)
		}
	}
	return c
}

// ticker is a Notifier's clock that the test drives: every read waits
// for a tick of the test's, and each wait the Notifier begins (after its
// first read, or a poll, is done) is reported on waits.
type ticker struct {
	waits chan time.Duration
	tick  chan time.Time
}

func newTicker() *ticker {
	return &ticker{waits: make(chan time.Duration, 64), tick: make(chan time.Time)}
}

// After is Config.After.
func (k *ticker) After(d time.Duration) <-chan time.Time {
	k.waits <- d
	return k.tick
}

// step lets the Notifier read once, and returns when it has done with
// what it read (it waits again), with the wait it asked for next.
func (k *ticker) step(t testing.TB) time.Duration {
	t.Helper()
	select {
	case k.tick <- time.Time{}:
	case <-time.After(waitfor.Deadline):
		t.Fatalf("waited %v for the Notifier to wait for a tick", waitfor.Deadline)
	}
	return waitfor.Receive(t, "the Notifier's next wait", k.waits)
}

// notifier returns a Notifier on c driven by a ticker, closed when the
// test ends, and its ticker.
func notifier(t testing.TB, c pollnotify.Counter, cfg pollnotify.Config) (*pollnotify.Notifier, *ticker) {
	t.Helper()
	k := newTicker()
	cfg.After = k.After
	n, err := pollnotify.New(t.Context(), c, &cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { n.Close() })
	waitfor.Receive(t, "the Notifier's first wait", k.waits)
	return n, k
}

// woken reports whether ch holds a wake-up, taking it.
func woken(ch <-chan struct{}) bool {
	select {
	case <-ch:
		return true
	default:
		return false
	}
}

// replicas are two handles on one database, each with its SQLCounter and
// Notifier: two replicas, or two processes, sharing it.
type replicas struct {
	db [2]*sql.DB
	c  [2]*pollnotify.SQLCounter
	n  [2]*pollnotify.Notifier
	k  [2]*ticker
}

func newReplicas(t *testing.T, d testdb.DB, cfg pollnotify.Config) *replicas {
	t.Helper()
	r := &replicas{}
	for i := range 2 {
		r.db[i] = open(t, d)
		r.c[i] = counter(t, r.db[i])
		r.n[i], r.k[i] = notifier(t, r.c[i], cfg)
	}
	return r
}

// step lets both Notifiers read once.
func (r *replicas) step(t *testing.T) {
	t.Helper()
	for _, k := range r.k {
		k.step(t)
	}
}

// TestNotifier runs the Notifier's rules on SQLite and PostgreSQL, each
// case on a database of its own with two handles on it.
func TestNotifier(t *testing.T) {
	t.Parallel()
	for _, d := range testdb.Dialects() {
		t.Run(d.Name, func(t *testing.T) {
			t.Parallel()
			t.Run("CommitWakesOnlyAfterCommit", func(t *testing.T) {
				t.Parallel()
				r := newReplicas(t, d.New(t), pollnotify.Config{})
				ch0, cancel0 := r.n[0].Subscribe()
				defer cancel0()
				ch1, cancel1 := r.n[1].Subscribe()
				defer cancel1()
				tx, err := r.db[0].BeginTx(t.Context(), nil)
				if err != nil {
					t.Fatal(err)
				}
				defer tx.Rollback()
				if err := r.n[0].Notify(withTx(t.Context(), tx)); err != nil {
					t.Fatal(err)
				}
				r.step(t)
				if woken(ch0) || woken(ch1) {
					t.Fatal("a Notify in a transaction woke a subscriber before the commit")
				}
				if err := tx.Commit(); err != nil {
					t.Fatal(err)
				}
				r.step(t)
				if !woken(ch0) {
					t.Error("the committed Notify did not wake the subscriber of its own handle")
				}
				if !woken(ch1) {
					t.Error("the committed Notify did not wake the subscriber of the other handle")
				}
				r.step(t)
				if woken(ch0) || woken(ch1) {
					t.Error("one committed Notify woke a subscriber twice")
				}
			})
			t.Run("RollbackWakesNoOne", func(t *testing.T) {
				t.Parallel()
				r := newReplicas(t, d.New(t), pollnotify.Config{})
				ch1, cancel := r.n[1].Subscribe()
				defer cancel()
				tx, err := r.db[0].BeginTx(t.Context(), nil)
				if err != nil {
					t.Fatal(err)
				}
				if err := r.n[0].Notify(withTx(t.Context(), tx)); err != nil {
					t.Fatal(err)
				}
				if err := tx.Rollback(); err != nil {
					t.Fatal(err)
				}
				r.step(t)
				if woken(ch1) {
					t.Error("a rolled back Notify woke a subscriber")
				}
			})
			t.Run("NotifyWithoutTxWakes", func(t *testing.T) {
				t.Parallel()
				r := newReplicas(t, d.New(t), pollnotify.Config{})
				ch1, cancel := r.n[1].Subscribe()
				defer cancel()
				if err := r.n[0].Notify(t.Context()); err != nil {
					t.Fatal(err)
				}
				r.step(t)
				if !woken(ch1) {
					t.Error("a Notify without a transaction did not wake the other handle's subscriber")
				}
			})
			t.Run("WakeUpsFold", func(t *testing.T) {
				t.Parallel()
				r := newReplicas(t, d.New(t), pollnotify.Config{})
				ch, cancel := r.n[1].Subscribe()
				defer cancel()
				other, cancelOther := r.n[1].Subscribe()
				defer cancelOther()
				for range 3 {
					if err := r.n[0].Notify(t.Context()); err != nil {
						t.Fatal(err)
					}
				}
				r.k[1].step(t)
				if err := r.n[0].Notify(t.Context()); err != nil {
					t.Fatal(err)
				}
				r.k[1].step(t)
				if !woken(ch) || !woken(other) {
					t.Fatal("a subscriber was not woken")
				}
				if woken(ch) || woken(other) {
					t.Error("four Notifies seen in two reads left more than one pending wake-up")
				}
				cancel()
				if err := r.n[0].Notify(t.Context()); err != nil {
					t.Fatal(err)
				}
				r.k[1].step(t)
				if woken(ch) {
					t.Error("a cancelled subscription was woken")
				}
				if !woken(other) {
					t.Error("the other subscriber was not woken after one cancelled")
				}
			})
			t.Run("ReadErrorThenRecoveryWakesOnce", func(t *testing.T) {
				t.Parallel()
				rec := logtest.New()
				cfg := pollnotify.Config{Interval: 100 * time.Millisecond, RetryMax: 300 * time.Millisecond, Logger: slog.New(rec)}
				db := open(t, d.New(t))
				n, k := notifier(t, counter(t, db), cfg)
				ch, cancel := n.Subscribe()
				defer cancel()
				if _, err := db.Exec("ALTER TABLE " + pollnotify.DefaultTable + " RENAME TO moved"); err != nil {
					t.Fatal(err)
				}
				var waits []time.Duration
				for range 3 {
					waits = append(waits, k.step(t))
					if woken(ch) {
						t.Fatal("a failed read woke a subscriber")
					}
				}
				if want := []time.Duration{200 * time.Millisecond, 300 * time.Millisecond, 300 * time.Millisecond}; !slices.Equal(waits, want) {
					t.Errorf("waits after failed reads = %v, want %v (doubling from 2×Interval up to RetryMax)", waits, want)
				}
				if _, err := db.Exec("ALTER TABLE moved RENAME TO " + pollnotify.DefaultTable); err != nil {
					t.Fatal(err)
				}
				if w := k.step(t); w != cfg.Interval {
					t.Errorf("wait after the recovery = %v, want Interval (%v)", w, cfg.Interval)
				}
				if !woken(ch) {
					t.Fatal("the first good read after failed ones did not wake the subscriber (the counter is unchanged)")
				}
				k.step(t)
				if woken(ch) {
					t.Error("a good read of an unchanged counter after the recovery woke the subscriber again")
				}
				levels := map[slog.Level]int{}
				for _, r := range rec.Records() {
					levels[r.Level]++
				}
				if want := map[slog.Level]int{slog.LevelWarn: 1, slog.LevelDebug: 2, slog.LevelInfo: 1}; !maps.Equal(levels, want) {
					t.Errorf("log records by level = %v, want %v", levels, want)
				}
			})
			t.Run("Close", func(t *testing.T) {
				t.Parallel()
				r := newReplicas(t, d.New(t), pollnotify.Config{})
				ch, cancel := r.n[0].Subscribe()
				defer cancel()
				other, cancelOther := r.n[1].Subscribe()
				defer cancelOther()
				if err := r.n[0].Close(); err != nil {
					t.Fatal(err)
				}
				// Close returned once the goroutine did: none is left to
				// take a tick.
				select {
				case r.k[0].tick <- time.Time{}:
					t.Fatal("the Notifier read after Close returned")
				default:
				}
				if err := r.n[0].Close(); err != nil {
					t.Fatalf("second Close: %v", err)
				}
				after, cancelAfter := r.n[0].Subscribe()
				defer cancelAfter()
				if err := r.n[0].Notify(t.Context()); err != nil {
					t.Fatalf("Notify after Close: %v", err)
				}
				r.k[1].step(t)
				if !woken(other) {
					t.Error("a Notify after Close did not reach the other handle's Notifier")
				}
				for _, c := range []<-chan struct{}{ch, after} {
					select {
					case _, ok := <-c:
						t.Errorf("a channel of a closed Notifier received (open: %v)", ok)
					default:
					}
				}
			})
			t.Run("ConcurrentTransactionsAllCount", func(t *testing.T) {
				t.Parallel()
				r := newReplicas(t, d.New(t), pollnotify.Config{})
				const txs = 8
				errs := make(chan error, txs)
				for i := range txs {
					go func() {
						db := r.db[i%2]
						tx, err := db.BeginTx(t.Context(), nil)
						if err != nil {
							errs <- err
							return
						}
						if err := r.n[i%2].Notify(withTx(t.Context(), tx)); err != nil {
							tx.Rollback()
							errs <- err
							return
						}
						errs <- tx.Commit()
					}()
				}
				for range txs {
					if err := waitfor.Receive(t, "a notifying transaction", errs); err != nil {
						t.Fatal(err)
					}
				}
				if v, err := r.c[1].Read(t.Context()); err != nil || v != txs {
					t.Errorf("Read after %d concurrent notifying transactions = %d, %v; want %d", txs, v, err, txs)
				}
			})
			t.Run("MissingRow", func(t *testing.T) {
				t.Parallel()
				db := open(t, d.New(t))
				c := counter(t, db)
				if _, err := db.Exec("DELETE FROM " + c.Table()); err != nil {
					t.Fatal(err)
				}
				if err := c.Bump(t.Context()); !errors.Is(err, pollnotify.ErrNoRow) {
					t.Errorf("Bump = %v, want ErrNoRow", err)
				}
				if _, err := c.Read(t.Context()); !errors.Is(err, pollnotify.ErrNoRow) {
					t.Errorf("Read = %v, want ErrNoRow", err)
				}
				if _, err := pollnotify.New(t.Context(), c, nil); !errors.Is(err, pollnotify.ErrNoRow) {
					t.Errorf("New = %v, want ErrNoRow", err)
				}
				// The DDL puts the row back, and is a no-op once it is there.
				for range 2 {
					for _, q := range c.DDL() {
						if _, err := db.Exec(q); err != nil {
							t.Fatalf("%s: %v", q, err)
						}
					}
				}
				if err := c.Bump(t.Context()); err != nil {
					t.Fatal(err)
				}
				if v, err := c.Read(t.Context()); err != nil || v != 1 {
					t.Errorf("Read after the DDL twice and one Bump = %d, %v; want 1", v, err)
				}
			})
		})
	}
}

// TestConfig checks that New and NewSQLCounter refuse invalid settings
// with ErrConfig, and take the valid ones.
func TestConfig(t *testing.T) {
	t.Parallel()
	db := open(t, testdb.SQLite(t))
	c := counter(t, db)
	for _, tc := range []struct {
		name string
		cfg  pollnotify.Config
		ok   bool
	}{
		{"defaults", pollnotify.Config{}, true},
		{"bounds", pollnotify.Config{Interval: pollnotify.MinInterval, RetryMax: pollnotify.MinInterval}, true},
		{"max", pollnotify.Config{Interval: pollnotify.MaxInterval}, true},
		{"negative interval", pollnotify.Config{Interval: -time.Second}, false},
		{"interval below min", pollnotify.Config{Interval: pollnotify.MinInterval - 1}, false},
		{"interval above max", pollnotify.Config{Interval: pollnotify.MaxInterval + 1, RetryMax: time.Minute}, false},
		{"negative retry", pollnotify.Config{RetryMax: -1}, false},
		{"retry below interval", pollnotify.Config{Interval: time.Second, RetryMax: time.Second - 1}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			n, err := pollnotify.New(t.Context(), c, &tc.cfg)
			if n != nil {
				n.Close()
			}
			if tc.ok && err != nil {
				t.Errorf("New(%+v) = %v, want no error", tc.cfg, err)
			}
			if !tc.ok && !errors.Is(err, pollnotify.ErrConfig) {
				t.Errorf("New(%+v) = %v, want ErrConfig", tc.cfg, err)
			}
		})
	}
	if _, err := pollnotify.New(t.Context(), nil, nil); !errors.Is(err, pollnotify.ErrConfig) {
		t.Errorf("New(nil Counter) = %v, want ErrConfig", err)
	}
	long := strings.Repeat("t", 63)
	for table, ok := range map[string]bool{
		"":                  true,
		"nodelane_notify":   true,
		"App_2.notify":      true,
		"_x":                true,
		long:                true,
		long + "t":          false,
		"2x":                false,
		"x.2y":              false,
		"x;DROP TABLE jobs": false,
		"x y":               false,
		`"x"`:               false,
		"x.":                false,
		".x":                false,
		"a..b":              false,
		"é":                 false,
	} {
		c, err := pollnotify.NewSQLCounter(db, table, txOf)
		switch {
		case ok && err != nil:
			t.Errorf("NewSQLCounter(table %q) = %v, want no error", table, err)
		case !ok && !errors.Is(err, pollnotify.ErrConfig):
			t.Errorf("NewSQLCounter(table %q) = %v, want ErrConfig", table, err)
		case ok && table == "" && c.Table() != pollnotify.DefaultTable:
			t.Errorf("NewSQLCounter(table \"\").Table() = %q, want DefaultTable", c.Table())
		}
	}
	if _, err := pollnotify.NewSQLCounter(nil, "", txOf); !errors.Is(err, pollnotify.ErrConfig) {
		t.Errorf("NewSQLCounter(nil db) = %v, want ErrConfig", err)
	}
	if _, err := pollnotify.NewSQLCounter(db, "", nil); !errors.Is(err, pollnotify.ErrConfig) {
		t.Errorf("NewSQLCounter(nil tx) = %v, want ErrConfig", err)
	}
}
