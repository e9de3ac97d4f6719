package bunstore_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/nodelane/nodelane/bunstore"
	"github.com/nodelane/nodelane/internal/testdb"
)

// The interface workerapi declares; bunstore may not import it.
var _ interface {
	Notify(ctx context.Context) error
	Subscribe() (<-chan struct{}, func())
} = (*bunstore.Notifier)(nil)

const (
	// delivered bounds how long a notification may take to arrive.
	delivered = 2 * time.Second
	// quiet is how long a test waits to believe nothing will arrive.
	quiet = 300 * time.Millisecond
)

// notifier returns a Notifier on db, closed when the test ends (before db,
// whose cleanup was registered earlier).
func notifier(t *testing.T, db *bunstore.DB, cfg *bunstore.NotifierConfig) *bunstore.Notifier {
	t.Helper()
	n, err := db.Notifier(context.Background(), cfg)
	if err != nil {
		t.Fatalf("Notifier: %v", err)
	}
	t.Cleanup(func() {
		if err := n.Close(); err != nil {
			t.Errorf("Notifier.Close: %v", err)
		}
	})
	return n
}

// receives reports whether ch receives within the given time, or already
// holds a wake-up if that is zero.
func receives(ch <-chan struct{}, within time.Duration) bool {
	select {
	case <-ch:
		return true
	default:
	}
	if within <= 0 {
		return false
	}
	t := time.NewTimer(within)
	defer t.Stop()
	select {
	case <-ch:
		return true
	case <-t.C:
		return false
	}
}

func mustNotify(t *testing.T, ctx context.Context, n *bunstore.Notifier) {
	t.Helper()
	if err := n.Notify(ctx); err != nil {
		t.Fatalf("Notify: %v", err)
	}
}

// A Notify on one replica wakes the subscribers of every replica; a
// cancelled subscription and a closed Notifier receive no more.
func TestNotifierReplicas(t *testing.T) {
	for _, d := range testdb.Dialects() {
		t.Run(d.Name, func(t *testing.T) {
			ctx := context.Background()
			tdb := d.New(t)
			a := notifier(t, open(t, tdb), nil)
			b := notifier(t, open(t, tdb), nil)
			if a.Channel() != b.Channel() {
				t.Fatalf("replicas use channels %q and %q", a.Channel(), b.Channel())
			}
			onA, cancelA := a.Subscribe()
			defer cancelA()
			onB, cancelB := b.Subscribe()
			mustNotify(t, ctx, a)
			if !receives(onB, delivered) {
				t.Fatal("a subscriber on B missed a Notify made on A")
			}
			if !receives(onA, delivered) {
				t.Fatal("a subscriber on A missed its own Notify")
			}
			mustNotify(t, ctx, b)
			if !receives(onA, delivered) {
				t.Fatal("a subscriber on A missed a Notify made on B")
			}
			if !receives(onB, delivered) {
				t.Fatal("a subscriber on B missed its own Notify")
			}

			cancelB()
			cancelB() // idempotent
			mustNotify(t, ctx, a)
			if !receives(onA, delivered) {
				t.Fatal("a subscriber on A missed a Notify")
			}
			if receives(onB, quiet) {
				t.Fatal("a cancelled subscription received")
			}

			// Close stops delivery but Notify on a closed Notifier still
			// reaches the others.
			if err := a.Close(); err != nil {
				t.Fatal(err)
			}
			onB2, cancelB2 := b.Subscribe()
			defer cancelB2()
			mustNotify(t, ctx, a)
			if !receives(onB2, delivered) {
				t.Fatal("a Notify on a closed Notifier did not reach another replica")
			}
			if receives(onA, quiet) {
				t.Fatal("a closed Notifier delivered")
			}
			select {
			case _, ok := <-onA:
				if !ok {
					t.Fatal("Close closed a subscriber channel")
				}
			default:
			}
		})
	}
}

// Notify in a transaction is delivered once it commits, not before, and on
// PostgreSQL never if it rolls back.
func TestNotifierTx(t *testing.T) {
	for _, d := range testdb.Dialects() {
		t.Run(d.Name, func(t *testing.T) {
			ctx := context.Background()
			tdb := d.New(t)
			a := open(t, tdb)
			na := notifier(t, a, nil)
			nb := notifier(t, open(t, tdb), nil)
			onA, cancelA := na.Subscribe()
			defer cancelA()
			onB, cancelB := nb.Subscribe()
			defer cancelB()

			err := a.InTx(ctx, func(ctx context.Context) error {
				mustNotify(t, ctx, na)
				return errRollback
			})
			if err != errRollback {
				t.Fatalf("InTx = %v, want %v", err, errRollback)
			}
			if d.Name == "postgres" {
				if receives(onB, quiet) || receives(onA, 0) {
					t.Fatal("a Notify in a rolled-back transaction was delivered")
				}
			} else {
				// SQLite cannot tell a rollback from a commit and wakes
				// the subscribers once the transaction has ended.
				receives(onA, delivered)
				receives(onB, delivered)
			}

			err = a.InTx(ctx, func(ctx context.Context) error {
				mustNotify(t, ctx, na)
				if receives(onB, quiet) || receives(onA, 0) {
					t.Error("a Notify was delivered before its transaction committed")
				}
				return nil
			})
			if err != nil {
				t.Fatal(err)
			}
			if !receives(onB, delivered) {
				t.Fatal("a subscriber on another replica missed a committed Notify")
			}
			if !receives(onA, delivered) {
				t.Fatal("a subscriber on the same replica missed a committed Notify")
			}
		})
	}
}

// Notifications that arrive while a wake-up is pending fold into it.
func TestNotifierFolds(t *testing.T) {
	ctx := context.Background()
	n := notifier(t, open(t, testdb.SQLite(t)), nil)
	ch, cancel := n.Subscribe()
	defer cancel()
	for range 3 {
		mustNotify(t, ctx, n)
	}
	if !receives(ch, delivered) {
		t.Fatal("missed a Notify")
	}
	if receives(ch, quiet) {
		t.Fatal("three Notify calls woke a subscriber twice")
	}
}

// Deployments in different schemas of one database do not wake each other,
// unless they are given one channel.
func TestNotifierSchemas(t *testing.T) {
	ctx := context.Background()
	one := open(t, testdb.Postgres(t))
	two := open(t, testdb.Postgres(t))

	n1, n2 := notifier(t, one, nil), notifier(t, two, nil)
	if n1.Channel() == n2.Channel() {
		t.Fatalf("two schemas share channel %q", n1.Channel())
	}
	if !strings.HasPrefix(n1.Channel(), bunstore.DefaultChannel+".nl_t_") {
		t.Errorf("channel %q does not name the schema", n1.Channel())
	}
	on2, cancel2 := n2.Subscribe()
	defer cancel2()
	mustNotify(t, ctx, n1)
	if receives(on2, quiet) {
		t.Fatal("a Notify in one schema woke a subscriber in another")
	}

	cfg := &bunstore.NotifierConfig{Channel: "nodelane_test_shared_" + strings.TrimPrefix(n1.Channel(), bunstore.DefaultChannel+".")}
	s1, s2 := notifier(t, one, cfg), notifier(t, two, cfg)
	onS2, cancelS2 := s2.Subscribe()
	defer cancelS2()
	mustNotify(t, ctx, s1)
	if !receives(onS2, delivered) {
		t.Fatal("Notifiers given one channel did not wake each other")
	}
}

// The listener survives the loss of its connection: it reconnects, wakes
// its subscribers once (a notification may have been missed), and
// delivers later notifications.
func TestNotifierReconnects(t *testing.T) {
	ctx := context.Background()
	tdb := testdb.Postgres(t)
	a, b := open(t, tdb), open(t, tdb)
	na, nb := notifier(t, a, nil), notifier(t, b, nil)
	onB, cancel := nb.Subscribe()
	defer cancel()

	pids := listeners(t, a, nb.Channel())
	if len(pids) != 2 { // one listener per Notifier
		t.Fatalf("found %d listener connections, want 2", len(pids))
	}
	// Terminate both listeners, so that no path but a reconnected one can
	// deliver.
	for _, pid := range pids {
		var ok bool
		if err := a.Bun().NewRaw("SELECT pg_terminate_backend(?)", pid).Scan(ctx, &ok); err != nil || !ok {
			t.Fatalf("pg_terminate_backend(%d) = %v, %v", pid, ok, err)
		}
	}
	if !receives(onB, 5*time.Second) {
		t.Fatal("no wake-up after the listener reconnected")
	}
	mustNotify(t, ctx, na)
	if !receives(onB, delivered) {
		t.Fatal("a Notify after the reconnection was not delivered")
	}
	// The pool's connections were not the ones terminated, and the new
	// listener LISTENs again.
	again := listeners(t, a, nb.Channel())
	for _, p := range again {
		for _, old := range pids {
			if p == old {
				t.Fatalf("listener %d is still there after it was terminated", p)
			}
		}
	}
}

// listeners returns the pids of the listener connections on channel: those
// whose last statement was LISTEN on it (the channel names the test's own
// schema).
func listeners(t *testing.T, db *bunstore.DB, channel string) []int {
	t.Helper()
	var pids []int
	err := db.Bun().NewRaw(
		"SELECT pid FROM pg_stat_activity WHERE datname = current_database() AND query = ?",
		`LISTEN "`+channel+`"`).Scan(context.Background(), &pids)
	if err != nil {
		t.Fatal(err)
	}
	return pids
}
