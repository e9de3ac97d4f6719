package bunstore_test

import (
	"context"
	"net/url"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/nodelane/nodelane/bunstore"
	"github.com/nodelane/nodelane/internal/testdb"
	"github.com/nodelane/nodelane/internal/waitfor"
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

// fast is a NotifierConfig with short listener timings, for tests that
// exercise the listener's pings and reconnections.
func fast() *bunstore.NotifierConfig {
	return &bunstore.NotifierConfig{
		PingInterval:   20 * time.Millisecond,
		ConnectTimeout: 5 * time.Second,
		ReconnectMin:   10 * time.Millisecond,
		ReconnectMax:   50 * time.Millisecond,
	}
}

// Notifiers made from one DB wake each other's subscribers; a cancelled
// subscription and a closed Notifier receive no more, and a closed
// Notifier's Notify still reaches the others.
func TestNotifierSharedDB(t *testing.T) {
	t.Parallel()
	for _, d := range bunstore.MigratedDialects() {
		t.Run(d.Name, func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			db := open(t, d.New(t))
			a := notifier(t, db, nil)
			b := notifier(t, db, nil)
			if a.Channel() != b.Channel() {
				t.Fatalf("Notifiers of one DB use channels %q and %q", a.Channel(), b.Channel())
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
				t.Fatal("a Notify on a closed Notifier did not reach another Notifier")
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

// Two DB handles on one database are two replicas. On PostgreSQL their
// Notifiers wake each other; on SQLite they do not, even in one process
// (their long-polls find new work when they look again).
func TestNotifierReplicas(t *testing.T) {
	t.Parallel()
	for _, d := range bunstore.MigratedDialects() {
		t.Run(d.Name, func(t *testing.T) {
			t.Parallel()
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
			defer cancelB()

			mustNotify(t, ctx, a)
			if !receives(onA, delivered) {
				t.Fatal("a subscriber on A missed its own Notify")
			}
			if d.Name == "postgres" {
				if !receives(onB, delivered) {
					t.Fatal("a subscriber on replica B missed a Notify made on replica A")
				}
			} else if receives(onB, quiet) {
				t.Fatal("a Notify on one SQLite DB woke a subscriber of another DB on the same file")
			}

			mustNotify(t, ctx, b)
			if !receives(onB, delivered) {
				t.Fatal("a subscriber on B missed its own Notify")
			}
			if d.Name == "postgres" {
				if !receives(onA, delivered) {
					t.Fatal("a subscriber on replica A missed a Notify made on replica B")
				}
			} else if receives(onA, quiet) {
				t.Fatal("a Notify on one SQLite DB woke a subscriber of another DB on the same file")
			}
		})
	}
}

// Notify in a DB.InTx transaction is delivered once the transaction ends,
// not before, to the Notifiers of the same DB and, on PostgreSQL, of the
// other replicas; on PostgreSQL never if it rolls back.
func TestNotifierTx(t *testing.T) {
	t.Parallel()
	for _, d := range bunstore.MigratedDialects() {
		t.Run(d.Name, func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			tdb := d.New(t)
			a := open(t, tdb)
			na := notifier(t, a, nil)
			same := notifier(t, a, nil)
			onA, cancelA := na.Subscribe()
			defer cancelA()
			onSame, cancelSame := same.Subscribe()
			defer cancelSame()
			subs := map[string]<-chan struct{}{"the notifying Notifier": onA, "another Notifier of the DB": onSame}
			if d.Name == "postgres" {
				other := notifier(t, open(t, tdb), nil)
				onOther, cancelOther := other.Subscribe()
				defer cancelOther()
				subs["a Notifier of another replica"] = onOther
			}
			none := func(t *testing.T, within time.Duration) bool {
				t.Helper()
				got := false
				for name, ch := range subs {
					if receives(ch, within) {
						t.Errorf("%s received", name)
						got = true
					}
					within = 0 // the first waited for all
				}
				return got
			}

			err := a.InTx(ctx, func(ctx context.Context) error {
				mustNotify(t, ctx, na)
				return errRollback
			})
			if err != errRollback {
				t.Fatalf("InTx = %v, want %v", err, errRollback)
			}
			if d.Name == "postgres" {
				if none(t, quiet) {
					t.Fatal("a Notify in a rolled-back transaction was delivered")
				}
			} else {
				// SQLite cannot tell a rollback from a commit and wakes
				// the subscribers once the transaction has ended.
				for _, ch := range subs {
					receives(ch, delivered)
				}
			}

			err = a.InTx(ctx, func(ctx context.Context) error {
				mustNotify(t, ctx, na)
				mustNotify(t, ctx, same)
				if none(t, quiet) {
					t.Error("a Notify was delivered before its transaction committed")
				}
				return nil
			})
			if err != nil {
				t.Fatal(err)
			}
			for name, ch := range subs {
				if !receives(ch, delivered) {
					t.Fatalf("%s missed a committed Notify", name)
				}
			}
			// The two Notify calls of one transaction fold into one
			// wake-up.
			none(t, quiet)
		})
	}
}

// Negative timings are refused, naming the field; zero ones take their
// defaults.
func TestNotifierConfig(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name string
		cfg  bunstore.NotifierConfig
		want string // in the error; "" means no error
	}{
		{name: "zero", cfg: bunstore.NotifierConfig{}},
		{name: "fast", cfg: *fast()},
		{name: "negative PingInterval", cfg: bunstore.NotifierConfig{PingInterval: -time.Second}, want: "NotifierConfig.PingInterval"},
		{name: "negative ConnectTimeout", cfg: bunstore.NotifierConfig{ConnectTimeout: -1}, want: "NotifierConfig.ConnectTimeout"},
		{name: "negative ReconnectMin", cfg: bunstore.NotifierConfig{ReconnectMin: -time.Millisecond}, want: "NotifierConfig.ReconnectMin"},
		{name: "negative ReconnectMax", cfg: bunstore.NotifierConfig{ReconnectMax: -time.Minute}, want: "NotifierConfig.ReconnectMax"},
		{name: "min above max", cfg: bunstore.NotifierConfig{ReconnectMin: time.Second, ReconnectMax: time.Millisecond}, want: "NotifierConfig.ReconnectMin"},
		{name: "min above default max", cfg: bunstore.NotifierConfig{ReconnectMin: 2 * bunstore.DefaultNotifierReconnectMax}, want: "NotifierConfig.ReconnectMax"},
		{name: "max below default min", cfg: bunstore.NotifierConfig{ReconnectMax: bunstore.DefaultNotifierReconnectMin / 2}, want: "NotifierConfig.ReconnectMin"},
	}
	for _, d := range bunstore.MigratedDialects() {
		t.Run(d.Name, func(t *testing.T) {
			t.Parallel()
			db := open(t, d.New(t))
			for _, tt := range tests {
				t.Run(tt.name, func(t *testing.T) {
					t.Parallel()
					n, err := db.Notifier(context.Background(), &tt.cfg)
					if tt.want == "" {
						if err != nil {
							t.Fatalf("Notifier: %v", err)
						}
						n.Close()
						return
					}
					if err == nil {
						n.Close()
						t.Fatalf("Notifier succeeded, want an error naming %s", tt.want)
					}
					if !strings.Contains(err.Error(), tt.want) {
						t.Fatalf("Notifier: %v, want an error naming %s", err, tt.want)
					}
				})
			}
		})
	}
}

// Close leaves no goroutine of the Notifier behind, a delivery that
// waited for a transaction included.
func TestNotifierCloseLeavesNoGoroutine(t *testing.T) {
	for _, d := range bunstore.MigratedDialects() {
		t.Run(d.Name, func(t *testing.T) {
			ctx := context.Background()
			tdb, app := d.New(t), ""
			if d.Name == "postgres" {
				tdb, app = named(t, tdb)
			}
			db := open(t, tdb)
			// The pool's goroutines, if any, predate the snapshot.
			ignore := goleak.IgnoreCurrent()

			a, err := db.Notifier(ctx, fast())
			if err != nil {
				t.Fatal(err)
			}
			b, err := db.Notifier(ctx, fast())
			if err != nil {
				t.Fatal(err)
			}
			ch, cancel := b.Subscribe()
			mustNotify(t, ctx, a)
			if !receives(ch, delivered) {
				t.Fatal("missed a Notify")
			}
			if err := db.InTx(ctx, func(ctx context.Context) error { return a.Notify(ctx) }); err != nil {
				t.Fatal(err)
			}
			if !receives(ch, delivered) {
				t.Fatal("missed a Notify made in a transaction")
			}
			if app != "" { // on SQLite no listener pings
				waitfor.Until(t, "both listeners to ping", func() bool { return len(pinging(t, db, app)) == 2 })
			}
			cancel()
			if err := a.Close(); err != nil {
				t.Fatal(err)
			}
			if err := b.Close(); err != nil {
				t.Fatal(err)
			}
			goleak.VerifyNone(t, ignore)
		})
	}
}

// Notifications that arrive while a wake-up is pending fold into it.
func TestNotifierFolds(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	n := notifier(t, open(t, bunstore.Migrated.New(t)), nil)
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
	t.Parallel()
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
	t.Parallel()
	ctx := context.Background()
	tdb := testdb.Postgres(t)
	a, b := open(t, tdb), open(t, tdb)
	// Short backoffs; the default ping interval, so that the listeners'
	// last statement stays their LISTEN, which is how listeners finds them.
	cfg := &bunstore.NotifierConfig{ReconnectMin: 10 * time.Millisecond, ReconnectMax: 50 * time.Millisecond}
	na, nb := notifier(t, a, cfg), notifier(t, b, cfg)
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
	if !receives(onB, delivered) {
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

// The listener pings the server while nothing arrives; a ping that
// succeeds neither wakes the subscribers nor replaces the connection.
func TestNotifierPings(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	tdb, app := named(t, testdb.Postgres(t))
	db := open(t, tdb)
	n := notifier(t, db, fast())
	ch, cancel := n.Subscribe()
	defer cancel()

	var pids []int
	waitfor.Until(t, "the listener to ping", func() bool {
		pids = pinging(t, db, app)
		return len(pids) > 0
	})
	if receives(ch, quiet) { // many pings
		t.Fatal("a subscriber woke without a Notify")
	}
	if again := pinging(t, db, app); len(again) != 1 || again[0] != pids[0] {
		t.Fatalf("pinging listeners %v, then %v: the connection was replaced", pids, again)
	}
	mustNotify(t, ctx, n)
	if !receives(ch, delivered) {
		t.Fatal("a Notify was not delivered between pings")
	}
}

// named returns tdb with an application_name of its own on every
// connection, and that name, so that the listeners of one test can be told
// from those of other tests.
func named(t *testing.T, tdb testdb.DB) (testdb.DB, string) {
	t.Helper()
	u, err := url.Parse(tdb.DSN)
	if err != nil {
		t.Fatal(err)
	}
	q := u.Query()
	app := "nodelane_test_" + q.Get("search_path")
	q.Set("application_name", app)
	u.RawQuery = q.Encode()
	tdb.DSN = u.String()
	return tdb, app
}

// pinging returns the pids of the connections named app (see named) that
// pinged and have run nothing since: listeners, told from the pool's
// connections by their last statement.
func pinging(t *testing.T, db *bunstore.DB, app string) []int {
	t.Helper()
	var pids []int
	err := db.Bun().NewRaw(
		"SELECT pid FROM pg_stat_activity WHERE application_name = ? AND query = '-- ping'", app).Scan(context.Background(), &pids)
	if err != nil {
		t.Fatal(err)
	}
	return pids
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

// The interface workerapi.SignalNotifier adds.
var _ interface {
	NotifyWorker(ctx context.Context, workerID string) error
	SubscribeWorker(workerID string) (<-chan struct{}, func())
} = (*bunstore.Notifier)(nil)

// NotifyWorker wakes the subscribers of that worker's signals, on the same
// DB and, on PostgreSQL, on every replica, and no one else: not another
// worker's, not a Subscribe channel; and Notify wakes no worker's. In a
// DB.InTx transaction it is delivered once the transaction ends, and on
// PostgreSQL never if it rolls back.
func TestNotifierWorkerSignals(t *testing.T) {
	t.Parallel()
	for _, d := range bunstore.MigratedDialects() {
		t.Run(d.Name, func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			tdb := d.New(t)
			dbA := open(t, tdb)
			a, a2 := notifier(t, dbA, nil), notifier(t, dbA, nil)
			sigA, cancel := a2.SubscribeWorker("wrk_1")
			defer cancel()
			otherA, cancel := a2.SubscribeWorker("wrk_2")
			defer cancel()
			jobsA, cancel := a2.Subscribe()
			defer cancel()

			if err := a.NotifyWorker(ctx, "wrk_1"); err != nil {
				t.Fatal(err)
			}
			if !receives(sigA, delivered) {
				t.Fatal("a subscriber of wrk_1 missed NotifyWorker(wrk_1)")
			}
			if receives(otherA, quiet) || receives(jobsA, 0) {
				t.Fatal("NotifyWorker(wrk_1) woke another worker's subscriber or a Subscribe channel")
			}
			mustNotify(t, ctx, a)
			if !receives(jobsA, delivered) {
				t.Fatal("Notify missed its subscriber")
			}
			if receives(sigA, quiet) || receives(otherA, 0) {
				t.Fatal("Notify woke a worker's signals subscriber")
			}

			// In a transaction: delivered once it ends.
			release := make(chan struct{})
			inTx := make(chan struct{})
			done := make(chan error, 1)
			go func() {
				done <- dbA.InTx(ctx, func(ctx context.Context) error {
					if err := a.NotifyWorker(ctx, "wrk_1"); err != nil {
						return err
					}
					close(inTx)
					<-release
					return nil
				})
			}()
			<-inTx
			if receives(sigA, quiet) {
				t.Fatal("NotifyWorker in a transaction was delivered before it ended")
			}
			close(release)
			if err := <-done; err != nil {
				t.Fatal(err)
			}
			if !receives(sigA, delivered) {
				t.Fatal("NotifyWorker in a transaction was not delivered once it committed")
			}

			if d.Name != "postgres" {
				return
			}
			b := notifier(t, open(t, tdb), nil)
			sigB, cancel := b.SubscribeWorker("wrk_1")
			defer cancel()
			if err := a.NotifyWorker(ctx, "wrk_1"); err != nil {
				t.Fatal(err)
			}
			if !receives(sigB, delivered) {
				t.Fatal("a subscriber of wrk_1 on replica B missed NotifyWorker on replica A")
			}
			if !receives(sigA, delivered) {
				t.Fatal("a subscriber of wrk_1 on replica A missed NotifyWorker on replica A")
			}
			// Rolled back: never delivered.
			errRollback := context.Canceled
			if err := dbA.InTx(ctx, func(ctx context.Context) error {
				if err := a.NotifyWorker(ctx, "wrk_1"); err != nil {
					return err
				}
				return errRollback
			}); err != errRollback {
				t.Fatalf("InTx = %v", err)
			}
			if receives(sigB, quiet) || receives(sigA, 0) {
				t.Fatal("NotifyWorker in a rolled-back transaction was delivered")
			}
		})
	}
}
