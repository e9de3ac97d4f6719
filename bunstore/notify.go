package bunstore

import (
	"context"
	"crypto/sha256"
	"database/sql"
	"encoding/hex"
	"fmt"
	"log/slog"
	"maps"
	"math/rand/v2"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/stdlib"
)

// DefaultChannel is the stem of the PostgreSQL channel a Notifier uses:
// the channel is DefaultChannel, a dot and the schema nodelane's tables
// live in (see NotifierConfig.Channel).
const DefaultChannel = "nodelane_jobs"

// maxChannel is the longest channel name PostgreSQL accepts (NAMEDATALEN-1).
const maxChannel = 63

// The defaults of NotifierConfig's timings.
const (
	// DefaultNotifierPingInterval is the default of
	// NotifierConfig.PingInterval.
	DefaultNotifierPingInterval = 30 * time.Second
	// DefaultNotifierConnectTimeout is the default of
	// NotifierConfig.ConnectTimeout.
	DefaultNotifierConnectTimeout = 10 * time.Second
	// DefaultNotifierReconnectMin is the default of
	// NotifierConfig.ReconnectMin.
	DefaultNotifierReconnectMin = 100 * time.Millisecond
	// DefaultNotifierReconnectMax is the default of
	// NotifierConfig.ReconnectMax.
	DefaultNotifierReconnectMax = 10 * time.Second
)

// NotifierConfig holds a Notifier's optional settings. A nil
// *NotifierConfig means all defaults.
type NotifierConfig struct {
	// Channel is the PostgreSQL channel the Notifier notifies and listens
	// on; every replica of one deployment must use the same one. It
	// defaults to DefaultChannel + "." + the current schema (the first
	// schema of the search_path that exists), so that deployments in
	// different schemas of one database do not wake each other. At most 63
	// bytes; a longer default is shortened with a hash of the schema.
	// Unused on SQLite.
	Channel string
	// Logger receives the listener's connection losses and reconnections
	// (never a secret). Defaults to discarding them.
	Logger *slog.Logger
	// PingInterval is how long the listener waits for a notification
	// before it pings the server, so that a connection that died silently
	// (a dropped network path) is noticed and replaced. Defaults to
	// DefaultNotifierPingInterval (30 s). Unused on SQLite.
	PingInterval time.Duration
	// ConnectTimeout bounds one connection attempt of the listener,
	// LISTEN included, and one ping. Defaults to
	// DefaultNotifierConnectTimeout (10 s). Unused on SQLite.
	ConnectTimeout time.Duration
	// ReconnectMin and ReconnectMax bound the wait before each attempt
	// to reconnect a lost listener: it starts at ReconnectMin and doubles
	// up to ReconnectMax, each wait drawn at random from its upper half so
	// that replicas that lost the server together do not return in step.
	// ReconnectMin defaults to DefaultNotifierReconnectMin (100 ms),
	// ReconnectMax to DefaultNotifierReconnectMax (10 s), and ReconnectMin
	// may not exceed ReconnectMax. Unused on SQLite.
	ReconnectMin time.Duration
	ReconnectMax time.Duration
}

// withDefaults validates c and returns it with every zero setting
// replaced by its default.
func (c *NotifierConfig) withDefaults() (NotifierConfig, error) {
	var out NotifierConfig
	if c != nil {
		out = *c
	}
	for _, d := range []struct {
		name string
		v    *time.Duration
		def  time.Duration
	}{
		{"PingInterval", &out.PingInterval, DefaultNotifierPingInterval},
		{"ConnectTimeout", &out.ConnectTimeout, DefaultNotifierConnectTimeout},
		{"ReconnectMin", &out.ReconnectMin, DefaultNotifierReconnectMin},
		{"ReconnectMax", &out.ReconnectMax, DefaultNotifierReconnectMax},
	} {
		if *d.v < 0 {
			return NotifierConfig{}, fmt.Errorf("bunstore: NotifierConfig.%s is negative (%v)", d.name, *d.v)
		}
		if *d.v == 0 {
			*d.v = d.def
		}
	}
	if out.ReconnectMin > out.ReconnectMax {
		return NotifierConfig{}, fmt.Errorf("bunstore: NotifierConfig.ReconnectMin (%v) exceeds NotifierConfig.ReconnectMax (%v)", out.ReconnectMin, out.ReconnectMax)
	}
	if out.Logger == nil {
		out.Logger = slog.New(slog.DiscardHandler)
	}
	return out, nil
}

// Notifier wakes long-polls, on every replica, when jobs may have become
// leasable, and a worker's long-polls when a signal is due to it
// (NotifyWorker). It implements workerapi.Notifier and
// workerapi.SignalNotifier. Make one per DB with
// DB.Notifier and Close it before the DB.
//
// On PostgreSQL a Notifier also keeps its DB's read cache (Config.CacheTTL)
// in step with the other replicas: the channel carries the changes to
// credentials, principals and the envelope state that any replica commits,
// and the Notifier makes its DB forget each (see DB for the cache).
//
// On PostgreSQL, Notify calls pg_notify on the channel in the
// transaction its context carries, if any, so the notification is delivered
// when that transaction commits and never if it rolls back; PostgreSQL
// folds repeated notifications of one transaction into one. Every Notifier
// holds one connection of its own, outside the DB's pool, that LISTENs on
// the channel and wakes the Notifier's subscribers for each notification,
// from any replica. If that connection drops, the Notifier reconnects with
// a growing backoff and, once it listens again, wakes every subscriber once,
// since a notification may have been missed meanwhile. The listener needs
// a DB whose *sql.DB was opened through pgx (as Open does, or
// stdlib.OpenDB), and does not work through a transaction-pooling proxy
// such as PgBouncer in transaction mode. Notifications do not cross
// databases, and replicas must reach the database directly or through a
// session-pooling proxy.
//
// On SQLite, Notify wakes the subscribers of every Notifier made from the
// same *DB, and no others: the wake-ups travel through the DB, not the
// database file. Two *DB handles opened separately on one file, in one
// process or in two, do not wake each other's subscribers; a long-poll on
// the other handle sees the new work when it next looks again, as one in
// another process would (workerapi's long-poll looks again after 1 s, then
// less often, up to every 5 s).
// Make every Notifier that should wake the others from one *DB. Notify
// with a context that carries a transaction of this DB (DB.InTx) delivers
// once that transaction ends, which on SQLite is also when it has
// committed or rolled back; a rollback thus wakes the subscribers too,
// needlessly but harmlessly (a long-poll woken early looks again and finds
// nothing new). A transaction the host began itself (WithTx) is not
// tracked, and Notify in it delivers as soon as no DB.InTx transaction or
// write of this DB is running, possibly before the host's commit: notify
// after the commit instead.
//
// Each subscriber channel holds one wake-up: notifications that arrive
// while one is pending fold into it.
type Notifier struct {
	db      *DB
	cfg     NotifierConfig // with defaults
	channel string         // PostgreSQL
	log     *slog.Logger

	mu     sync.Mutex
	subs   map[chan struct{}]struct{}
	wsubs  map[string]map[chan struct{}]struct{} // by worker id: SubscribeWorker's
	closed bool

	closeOnce sync.Once
	stop      context.CancelFunc // PostgreSQL: stops the listener
	done      chan struct{}      // PostgreSQL: closed when the listener returns
}

// notifyHub connects the SQLite Notifiers of one DB: a Notify on any of
// them wakes the subscribers of all. Its zero value is ready to use.
type notifyHub struct {
	mu sync.Mutex
	ns map[*Notifier]struct{}
	// waiting is set while a goroutine waits for the running DB.InTx
	// transaction to end to publish; further Notify calls fold into it.
	waiting bool
}

func (h *notifyHub) add(n *Notifier) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.ns == nil {
		h.ns = map[*Notifier]struct{}{}
	}
	h.ns[n] = struct{}{}
}

func (h *notifyHub) remove(n *Notifier) {
	h.mu.Lock()
	defer h.mu.Unlock()
	delete(h.ns, n)
}

// publish wakes the subscribers of every Notifier in h.
func (h *notifyHub) publish() {
	for _, n := range h.notifiers() {
		n.wake()
	}
}

// publishWorker wakes the subscribers of worker id's signals of every
// Notifier in h.
func (h *notifyHub) publishWorker(id string) {
	for _, n := range h.notifiers() {
		n.wakeWorker(id)
	}
}

// notifiers returns the Notifiers in h, to wake without holding h.mu.
func (h *notifyHub) notifiers() []*Notifier {
	h.mu.Lock()
	defer h.mu.Unlock()
	return slices.Collect(maps.Keys(h.ns))
}

// publishAfterWrites publishes once the write slot is free: after the
// DB.InTx transaction that holds it, and every write queued before, has
// ended. A transaction of DB.InTx holds the slot from before it begins
// until after it ends. Calls made while a publication waits fold into it.
func (h *notifyHub) publishAfterWrites(slot chan struct{}) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.waiting {
		return
	}
	h.waiting = true
	go func() {
		slot <- struct{}{}
		// Clear the flag while holding the slot: a Notify in the next
		// transaction, which takes the slot after us, must wait again.
		h.mu.Lock()
		h.waiting = false
		h.mu.Unlock()
		<-slot
		h.publish()
	}()
}

// Notifier returns a Notifier on db; cfg may be nil. On PostgreSQL it
// connects the listener before it returns, so that any Notify that
// follows is heard, and fails if it cannot.
func (db *DB) Notifier(ctx context.Context, cfg *NotifierConfig) (*Notifier, error) {
	c, err := cfg.withDefaults()
	if err != nil {
		return nil, err
	}
	n := &Notifier{db: db, cfg: c, log: c.Logger, subs: map[chan struct{}]struct{}{}, wsubs: map[string]map[chan struct{}]struct{}{}}
	if !db.postgres() {
		db.hub.add(n)
		return n, nil
	}

	pc, schema, err := db.listenerConfig(ctx)
	if err != nil {
		return nil, err
	}
	n.channel = c.Channel
	if n.channel == "" {
		n.channel = channelFor(schema)
	}
	if len(n.channel) > maxChannel {
		return nil, fmt.Errorf("bunstore: notifier channel %q is longer than %d bytes", n.channel, maxChannel)
	}
	conn, err := n.connect(ctx, pc)
	if err != nil {
		return nil, fmt.Errorf("bunstore: notifier: listen: %w", err)
	}
	// Changes to cached entries are announced on this channel too (see
	// cache.go), and entries read before it listened may have missed one.
	db.useChannel(n.channel)
	db.listening(true)
	life, stop := context.WithCancel(context.Background())
	n.stop = stop
	n.done = make(chan struct{})
	go n.listen(life, pc, conn)
	return n, nil
}

// Channel returns the PostgreSQL channel n uses, or "" on SQLite.
func (n *Notifier) Channel() string { return n.channel }

// Notify announces that jobs may have become leasable. See Notifier for
// when the notification is delivered if ctx carries a transaction.
func (n *Notifier) Notify(ctx context.Context) error {
	if n.db.postgres() {
		if _, err := n.db.idb(ctx).ExecContext(ctx, "SELECT pg_notify(?, '')", n.channel); err != nil {
			return fmt.Errorf("bunstore: notify: %w", err)
		}
		return nil
	}
	if _, ok := txFrom(ctx); ok {
		// A host's own transaction (WithTx) does not hold the slot, and
		// the wake-up goes out once the DB's own writes are done.
		n.db.hub.publishAfterWrites(n.db.writeSlot)
		return nil
	}
	n.db.hub.publish()
	return nil
}

// Subscribe returns a channel that receives after every Notify that
// reaches n (see Notifier), until cancel is called or n is closed. The
// channel is never closed. cancel may be called more than once.
func (n *Notifier) Subscribe() (<-chan struct{}, func()) {
	ch := make(chan struct{}, 1)
	n.mu.Lock()
	n.subs[ch] = struct{}{}
	n.mu.Unlock()
	return ch, func() {
		n.mu.Lock()
		delete(n.subs, ch)
		n.mu.Unlock()
	}
}

// signalPayload prefixes the worker id in the payload of a notification
// of NotifyWorker. A replica older than it hears such a notification as
// one of jobs, and its long-polls look again and find nothing new.
const signalPayload = "nodelane-signal:"

// NotifyWorker implements workerapi.SignalNotifier: it announces a signal
// for worker workerID (a cancel of a job it holds, its ban, retirement or
// drain request), delivered as Notify delivers, on the same channel (its
// payload names the worker), to that worker's subscribers only
// (SubscribeWorker): a job's Notify wakes none of them, and this wakes no
// Subscribe channel.
func (n *Notifier) NotifyWorker(ctx context.Context, workerID string) error {
	if n.db.postgres() {
		if _, err := n.db.idb(ctx).ExecContext(ctx, "SELECT pg_notify(?, ?)", n.channel, signalPayload+workerID); err != nil {
			return fmt.Errorf("bunstore: notify worker %s: %w", workerID, err)
		}
		return nil
	}
	if _, ok := txFrom(ctx); ok {
		// As Notify: once the DB's own writes are done.
		go func() {
			n.db.writeSlot <- struct{}{}
			<-n.db.writeSlot
			n.db.hub.publishWorker(workerID)
		}()
		return nil
	}
	n.db.hub.publishWorker(workerID)
	return nil
}

// SubscribeWorker implements workerapi.SignalNotifier: the channel
// receives after every NotifyWorker of workerID that reaches n, and when
// n's listener reconnected (a signal may have been missed), until cancel
// is called or n is closed. The channel is never closed.
func (n *Notifier) SubscribeWorker(workerID string) (<-chan struct{}, func()) {
	ch := make(chan struct{}, 1)
	n.mu.Lock()
	m := n.wsubs[workerID]
	if m == nil {
		m = map[chan struct{}]struct{}{}
		n.wsubs[workerID] = m
	}
	m[ch] = struct{}{}
	n.mu.Unlock()
	return ch, func() {
		n.mu.Lock()
		defer n.mu.Unlock()
		m := n.wsubs[workerID]
		delete(m, ch)
		if len(m) == 0 {
			delete(n.wsubs, workerID)
		}
	}
}

// wakeWorker gives every subscriber of worker id's signals a wake-up,
// unless one is pending.
func (n *Notifier) wakeWorker(id string) {
	n.mu.Lock()
	defer n.mu.Unlock()
	if !n.closed {
		poke(n.wsubs[id])
	}
}

// wakeAll wakes every subscriber, of jobs and of every worker's signals:
// after a reconnection, when any notification may have been missed.
func (n *Notifier) wakeAll() {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.closed {
		return
	}
	poke(n.subs)
	for _, m := range n.wsubs {
		poke(m)
	}
}

// Close stops delivering to n's subscribers and, on PostgreSQL, closes the
// listener's connection and waits for the listener's goroutine to return.
// It leaves the subscribers' channels open. Notify still works after
// Close, for the other Notifiers' and replicas' sake. Close always returns
// nil.
func (n *Notifier) Close() error {
	n.closeOnce.Do(func() {
		n.mu.Lock()
		n.closed = true
		clear(n.subs)
		clear(n.wsubs)
		n.mu.Unlock()
		if n.stop != nil {
			n.stop()
			<-n.done
		}
		if !n.db.postgres() {
			n.db.hub.remove(n)
		}
	})
	return nil
}

// wake gives every subscriber a wake-up, unless one is pending.
func (n *Notifier) wake() {
	n.mu.Lock()
	defer n.mu.Unlock()
	if !n.closed {
		poke(n.subs)
	}
}

// poke gives every channel of subs a wake-up, unless one is pending.
func poke(subs map[chan struct{}]struct{}) {
	for ch := range subs {
		select {
		case ch <- struct{}{}:
		default: // one is pending; this one folds into it
		}
	}
}

// channelFor returns the default channel of a schema.
func channelFor(schema string) string {
	if schema == "" {
		return DefaultChannel
	}
	ch := DefaultChannel + "." + schema
	if len(ch) > maxChannel {
		sum := sha256.Sum256([]byte(schema))
		ch = DefaultChannel + "." + hex.EncodeToString(sum[:16])
	}
	return ch
}

// listenerConfig returns the pgx configuration of a connection of db's
// pool, for the listener to connect as the pool does, and the schema the
// pool's connections work in.
func (db *DB) listenerConfig(ctx context.Context) (*pgx.ConnConfig, string, error) {
	conn, err := db.bun.Conn(ctx)
	if err != nil {
		return nil, "", fmt.Errorf("bunstore: notifier: %w", err)
	}
	defer conn.Close()
	var schema sql.NullString
	if err := conn.QueryRowContext(ctx, "SELECT current_schema()").Scan(&schema); err != nil {
		return nil, "", fmt.Errorf("bunstore: notifier: current schema: %w", err)
	}
	var pc *pgx.ConnConfig
	err = conn.Raw(func(dc any) error {
		c, ok := dc.(*stdlib.Conn)
		if !ok {
			return fmt.Errorf("%w: the PostgreSQL Notifier needs a *sql.DB opened through pgx (github.com/jackc/pgx/v5/stdlib), not %T", ErrUnsupported, dc)
		}
		pc = c.Conn().Config()
		return nil
	})
	if err != nil {
		return nil, "", err
	}
	// The copied config carries the pool connection's notification
	// handler; the listener's connection buffers its own.
	pc.OnNotification = nil
	if pc.RuntimeParams == nil {
		pc.RuntimeParams = map[string]string{}
	}
	if pc.RuntimeParams["application_name"] == "" {
		pc.RuntimeParams["application_name"] = "nodelane notifier"
	}
	return pc, schema.String, nil
}

// connect opens a listener connection and LISTENs on n's channel.
func (n *Notifier) connect(ctx context.Context, pc *pgx.ConnConfig) (*pgx.Conn, error) {
	ctx, cancel := context.WithTimeout(ctx, n.cfg.ConnectTimeout)
	defer cancel()
	conn, err := pgx.ConnectConfig(ctx, pc)
	if err != nil {
		return nil, err
	}
	if _, err := conn.Exec(ctx, "LISTEN "+pgx.Identifier{n.channel}.Sanitize()); err != nil {
		closeConn(conn)
		return nil, err
	}
	return conn, nil
}

func closeConn(conn *pgx.Conn) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	conn.Close(ctx)
}

// listen runs until ctx ends: it wakes the subscribers for every
// notification conn receives, and replaces conn when it fails.
func (n *Notifier) listen(ctx context.Context, pc *pgx.ConnConfig, conn *pgx.Conn) {
	defer close(n.done)
	for {
		err := n.receive(ctx, conn)
		n.db.listening(false)
		closeConn(conn)
		if ctx.Err() != nil {
			return
		}
		n.log.Warn("bunstore: notifier connection lost; reconnecting", "channel", n.channel, "err", err)
		lost := time.Now()
		var failures int
		if conn, failures = n.reconnect(ctx, pc); conn == nil {
			return
		}
		n.log.Info("bunstore: notifier reconnected", "channel", n.channel, "failed_attempts", failures, "after", time.Since(lost).Round(time.Millisecond))
		// Notifications sent while no connection listened are lost: the
		// jobs they announced, and the changes to the DB's cache (which
		// listening empties).
		n.db.listening(true)
		n.wakeAll()
	}
}

// receive wakes the subscribers for every notification on conn until conn
// fails or ctx ends. While nothing arrives it pings the server now and
// then, so that a silently dead connection is replaced.
func (n *Notifier) receive(ctx context.Context, conn *pgx.Conn) error {
	for {
		wctx, cancel := context.WithTimeout(ctx, n.cfg.PingInterval)
		nt, err := conn.WaitForNotification(wctx)
		cancel()
		switch {
		case err == nil:
			if id, ok := strings.CutPrefix(nt.Payload, signalPayload); ok {
				n.wakeWorker(id)
			} else if n.db.heard(nt.Payload) {
				n.wake()
			}
			continue
		case ctx.Err() != nil:
			return ctx.Err()
		case conn.IsClosed() || !pgconn.Timeout(err):
			return err
		}
		pctx, cancel := context.WithTimeout(ctx, n.cfg.ConnectTimeout)
		err = conn.Ping(pctx)
		cancel()
		if err != nil {
			if ctx.Err() != nil {
				return ctx.Err()
			}
			return fmt.Errorf("ping: %w", err)
		}
	}
}

// reconnect connects until it succeeds, waiting longer after each
// failure, or returns nil when ctx ends. It returns how many attempts
// failed. Only the first failure is logged above DEBUG: a database that
// is down fails every attempt, and one line says so.
func (n *Notifier) reconnect(ctx context.Context, pc *pgx.ConnConfig) (*pgx.Conn, int) {
	backoff := n.cfg.ReconnectMin
	for failures := 0; ; failures++ {
		// Jitter in [backoff/2, backoff): see NotifierConfig.ReconnectMin.
		d := backoff/2 + rand.N(backoff/2+1)
		t := time.NewTimer(d)
		select {
		case <-ctx.Done():
			t.Stop()
			return nil, failures
		case <-t.C:
		}
		conn, err := n.connect(ctx, pc)
		if err == nil {
			return conn, failures
		}
		if ctx.Err() != nil {
			return nil, failures
		}
		level := slog.LevelDebug
		if failures == 0 {
			level = slog.LevelError
		}
		backoff = min(2*backoff, n.cfg.ReconnectMax)
		n.log.Log(ctx, level, "bunstore: notifier cannot reconnect; retrying, further failures logged at DEBUG", "channel", n.channel, "err", err, "failed_attempts", failures+1, "retry_in", backoff)
	}
}
