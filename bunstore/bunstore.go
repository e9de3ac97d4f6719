// Package bunstore keeps nodelane's state in SQLite or PostgreSQL through
// bun. One [DB] implements every core Store (see [DB.LeaseStore]) on one
// *bun.DB, runs nodelane's own migrations under its own table names, and
// carries a transaction in the context so that several store calls commit
// together ([DB.InTx], [WithTx]), or concurrent callers' calls commit
// together, each caller's atomically ([DB.InSharedTx]).
//
// Every time is stored as a BIGINT of unix microseconds (UTC), so times
// compare and round-trip exactly in both dialects; JSON payloads are stored
// as TEXT, byte for byte as the caller gave them; every table name starts
// with nodelane_.
package bunstore

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"errors"
	"fmt"
	"io/fs"
	"net/url"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/stdlib"
	"github.com/nodelane/nodelane/lease"
	"github.com/uptrace/bun"
	"github.com/uptrace/bun/dialect"
	"github.com/uptrace/bun/dialect/pgdialect"
	"github.com/uptrace/bun/dialect/sqlitedialect"
	"github.com/uptrace/bun/schema"
	_ "modernc.org/sqlite" // registers the "sqlite" database/sql driver
)

// ErrUnsupported is returned by Open for a DSN of an unknown scheme and by
// New for a *bun.DB of a dialect other than SQLite or PostgreSQL.
var ErrUnsupported = errors.New("bunstore: unsupported database")

// Config holds the optional settings of Open and New. A nil *Config means
// all defaults.
type Config struct {
	// BusyTimeout is how long a SQLite write waits for others: for
	// another process's writer (the SQLite busy timeout), or, in this
	// process, while no other write finishes. Defaults to 10 s.
	BusyTimeout time.Duration
	// SkipMigrations stops Open from running Migrate. Defaults to false:
	// Open migrates.
	SkipMigrations bool
	// MigrationLockTimeout bounds how long Migrate waits for another
	// process that is migrating the same database. Defaults to 1 minute.
	MigrationLockTimeout time.Duration
	// MaxOpenConns caps the connections Open's pool holds; Migrate on
	// PostgreSQL needs two. On PostgreSQL it defaults to
	// DefaultMaxOpenConns, so that a burst of requests queues for a
	// connection instead of running the server out of them (PostgreSQL
	// allows 100 by default, for every replica together); on SQLite to no
	// limit. A negative value means no limit.
	MaxOpenConns int
	// MaxIdleConns is how many idle connections Open's pool keeps, so
	// that busy claimers do not reconnect on every call. Defaults to
	// MaxOpenConns when that is bounded, else to 16: with fewer idle than
	// open, a pool that is busy in bursts closes connections between
	// bursts and opens them again (measured: 485 reconnections in an 8 s
	// burn-down with 16 of 20, each a PostgreSQL backend started and its
	// statements prepared again).
	MaxIdleConns int
	// CacheTTL is how often a DB looks for changes of the credentials,
	// principals and envelope state it serves from memory that no
	// notification announced: the bound on how long a change made
	// elsewhere may go unseen (see cache.go: changes made through this DB,
	// and on PostgreSQL those any replica makes while this DB has a
	// Notifier, are seen at once). On SQLite a look is one read of a
	// version row that every change increments, and the entries stay
	// while it is unchanged; on PostgreSQL without a listening Notifier a
	// look forgets them all. Defaults to DefaultCacheTTL (1 s); a negative
	// value turns the cache off.
	CacheTTL time.Duration
	// ListenedCacheTTL, when positive, bounds how long an entry is served
	// on PostgreSQL while a Notifier made from the DB listens (every
	// change any replica commits then reaches the cache at once, and its
	// connection's loss empties it); never less than CacheTTL. By default
	// entries are served until a change is heard.
	ListenedCacheTTL time.Duration
}

// DefaultMaxOpenConns is the default of Config.MaxOpenConns on
// PostgreSQL.
const DefaultMaxOpenConns = 20

func (c *Config) withDefaults() Config {
	var out Config
	if c != nil {
		out = *c
	}
	if out.BusyTimeout <= 0 {
		out.BusyTimeout = 10 * time.Second
	}
	if out.MigrationLockTimeout <= 0 {
		out.MigrationLockTimeout = time.Minute
	}
	return out
}

// DB is nodelane's storage on one *bun.DB. It is safe for concurrent use.
type DB struct {
	bun     *bun.DB
	dialect dialect.Name
	cfg     Config
	// owned is set when Open created bun, so Close closes it.
	owned bool
	// writeSlot, on SQLite, admits one writer of this process at a time,
	// in arrival order. SQLite has one writer anyway, and its busy
	// handler, which polls with growing sleeps, lets a writer starve past
	// the busy timeout when dozens contend.
	writeSlot chan struct{}
	// writes counts the writes that released the slot.
	writes atomic.Uint64
	// slotWaiters counts the writes waiting for the slot: tests watch it
	// to know that a write is held up by another (export_test.go).
	slotWaiters atomic.Int32
	// hub, on SQLite, connects the Notifiers made from this DB.
	hub notifyHub
	// accepts and completes gather the guarded writes of the lease hot
	// path that run outside a transaction (see hot.go).
	accepts   *batcher[lease.AcceptWrite, *lease.Job]
	completes *batcher[lease.CompleteWrite, *lease.Job]
	// claims gathers the claims that run outside a transaction (claim.go).
	claims *batcher[claimCall, claimResult]
	// shared gathers the calls of InSharedTx (group.go).
	shared *batcher[sharedCall, error]
	// observer, set by tests, sees every statement run past bun.
	observer func(ctx context.Context, query string)
	// cache keeps credentials, principals and the envelope state
	// (cache.go); nil when Config.CacheTTL turns it off.
	cache *readCache
	// channel, on PostgreSQL, is where changes to cached entries are
	// announced (cacheChannel).
	chMu    sync.Mutex
	channel string
	// sql holds the hot statements of the dialect (stmt.go).
	sql statements
	// stmts, on SQLite, are the bound statements prepared (stmt.go,
	// prepared), by text; Close closes them.
	stmtMu sync.Mutex
	stmts  map[string]*sql.Stmt
}

func newDB(b *bun.DB, name dialect.Name, cfg Config, owned bool) *DB {
	db := &DB{bun: b, dialect: name, cfg: cfg, owned: owned, cache: newReadCache(cfg.CacheTTL, cfg.ListenedCacheTTL), sql: loadStatements(name), stmts: map[string]*sql.Stmt{}}
	if name == dialect.SQLite {
		db.writeSlot = make(chan struct{}, 1)
	}
	// On PostgreSQL two batches of a kind run at once, so that the
	// database works on one while the next gathers; SQLite has one writer.
	parallel, shared := 2, sharedParallel
	if name == dialect.SQLite {
		parallel, shared = 1, 1
	}
	db.accepts = newBatcher(maxBatch, parallel, gatherWait, func(ctx context.Context, ws []lease.AcceptWrite) ([]*lease.Job, error) {
		return db.guardedTx(ctx, func(ctx context.Context, tx bun.IDB) ([]*lease.Job, error) { return db.acceptLeased(ctx, tx, ws) })
	})
	db.completes = newBatcher(maxBatch, parallel, gatherWait, func(ctx context.Context, ws []lease.CompleteWrite) ([]*lease.Job, error) {
		return db.guardedTx(ctx, func(ctx context.Context, tx bun.IDB) ([]*lease.Job, error) { return db.completeRunning(ctx, tx, ws) })
	})
	db.claims = newBatcher(maxClaimBatch, parallel, gatherWait, db.claimTx)
	// A shared transaction gathers the calls that queued while others
	// ran, waiting for no more.
	db.shared = newBatcher(maxShared, shared, 0, db.runShared)
	db.shared.key = func(c sharedCall) string { return c.key }
	return db
}

// Open connects to the database named by dsn and, unless cfg says
// otherwise, migrates it. The DSN selects the driver:
//
//   - sqlite:PATH, or a file: DSN, opens SQLite (modernc.org/sqlite) in WAL
//     mode with IMMEDIATE transactions, a busy timeout, foreign keys,
//     synchronous=NORMAL and temp_store=MEMORY, so that callers never see
//     SQLITE_BUSY and savepoints write no temporary files. Settings a
//     file: DSN already gives (its own journal mode included) are kept.
//     The transactions that sequence receipts run with synchronous=FULL
//     (unless the DSN asks for more), so that no power loss rolls back a
//     tree whose checkpoint was signed.
//   - postgres:// or postgresql:// opens PostgreSQL through pgx.
//
// A PostgreSQL DSN may carry a search_path parameter to put nodelane's
// tables in a schema of their own.
func Open(ctx context.Context, dsn string, cfg *Config) (*DB, error) {
	c := cfg.withDefaults()
	var (
		sqldb *sql.DB
		d     schema.Dialect
		wal   bool
	)
	switch {
	case strings.HasPrefix(dsn, "sqlite:") || strings.HasPrefix(dsn, "file:"):
		var err error
		sdsn, ownMode := sqliteDSN(dsn, c.BusyTimeout)
		wal = !ownMode
		if err := createPrivate(sdsn); err != nil {
			return nil, err
		}
		if sqldb, err = sql.Open("sqlite", sdsn); err != nil {
			return nil, fmt.Errorf("bunstore: open sqlite: %w", err)
		}
		d = sqlitedialect.New()
	case strings.HasPrefix(dsn, "postgres://") || strings.HasPrefix(dsn, "postgresql://"):
		pc, err := pgx.ParseConfig(dsn)
		if err != nil {
			return nil, fmt.Errorf("bunstore: parse postgres dsn: %w", err)
		}
		// bun sends every statement with its arguments in the text,
		// different from one call to the next: preparing it (pgx's
		// default, QueryExecModeCacheStatement) would cost a round trip
		// and a parse more per statement and churn the statement cache.
		// The simple protocol sends it once. The hot statements, whose
		// text does not change, ask for the statement cache themselves
		// (boundArgs).
		pc.DefaultQueryExecMode = pgx.QueryExecModeSimpleProtocol
		sqldb = stdlib.OpenDB(*pc)
		d = pgdialect.New()
	default:
		// Never echo the DSN: it may hold a password.
		return nil, fmt.Errorf("%w: the DSN must start with sqlite:, file:, postgres:// or postgresql://", ErrUnsupported)
	}
	open := c.MaxOpenConns
	if open == 0 && d.Name() == dialect.PG {
		open = DefaultMaxOpenConns
	}
	sqldb.SetMaxOpenConns(max(open, 0))
	idle := c.MaxIdleConns
	switch {
	case idle <= 0 && open > 0:
		idle = open
	case idle <= 0:
		idle = 16
	case open > 0:
		idle = min(idle, open)
	}
	sqldb.SetMaxIdleConns(idle)
	if err := sqldb.PingContext(ctx); err != nil {
		sqldb.Close()
		return nil, fmt.Errorf("bunstore: connect: %w", err)
	}
	if wal {
		if err := enableWAL(ctx, sqldb, c.BusyTimeout); err != nil {
			sqldb.Close()
			return nil, fmt.Errorf("bunstore: enable WAL: %w", err)
		}
	}
	db := newDB(bun.NewDB(sqldb, d), d.Name(), c, true)
	if !c.SkipMigrations {
		if err := db.Migrate(ctx); err != nil {
			db.Close()
			return nil, err
		}
	}
	return db, nil
}

// New returns a DB over a *bun.DB the host opened, SQLite or PostgreSQL.
// It does not migrate: call Migrate. Close does not close db.
//
// A SQLite handle should be opened as Open does (WAL, _txlock=immediate,
// a busy timeout): with deferred transactions a writer that read first can
// fail with SQLITE_BUSY instead of waiting.
func New(db *bun.DB, cfg *Config) (*DB, error) {
	name := db.Dialect().Name()
	if name != dialect.SQLite && name != dialect.PG {
		return nil, fmt.Errorf("%w: dialect %s", ErrUnsupported, name)
	}
	return newDB(db, name, cfg.withDefaults(), false), nil
}

// Bun returns the underlying handle, for queries of the host's own.
func (db *DB) Bun() *bun.DB { return db.bun }

// Close closes the statements the DB prepared and, if Open created it,
// the connection pool.
func (db *DB) Close() error {
	db.stmtMu.Lock()
	for q, st := range db.stmts {
		st.Close()
		delete(db.stmts, q)
	}
	db.stmtMu.Unlock()
	if !db.owned {
		return nil
	}
	return db.bun.Close()
}

// sqliteDSN turns "sqlite:PATH" or a "file:" DSN into a modernc.org/sqlite
// DSN with nodelane's per-connection settings, keeping any the DSN already
// has. It reports whether the DSN sets the journal mode itself.
func sqliteDSN(dsn string, busy time.Duration) (string, bool) {
	if p, ok := strings.CutPrefix(dsn, "sqlite:"); ok {
		dsn = "file:" + p
	}
	path, query, _ := strings.Cut(dsn, "?")
	q, err := url.ParseQuery(query)
	if err != nil {
		// Let the driver report the malformed query.
		return dsn, false
	}
	set := map[string]bool{}
	for _, p := range q["_pragma"] {
		name, _, _ := strings.Cut(strings.ToLower(strings.TrimSpace(p)), "(")
		name, _, _ = strings.Cut(name, "=")
		set[strings.TrimSpace(name)] = true
	}
	for k, name := range map[string]string{
		"_busy_timeout": "busy_timeout", "_timeout": "busy_timeout", "_journal_mode": "journal_mode", "_journal": "journal_mode",
		"_foreign_keys": "foreign_keys", "_fk": "foreign_keys", "_synchronous": "synchronous", "_sync": "synchronous",
	} {
		if q.Has(k) {
			set[name] = true
		}
	}
	add := func(pragma, value string) {
		if !set[pragma] {
			q.Add("_pragma", pragma+"("+value+")")
		}
	}
	add("busy_timeout", strconv.FormatInt(busy.Milliseconds(), 10))
	add("foreign_keys", "1")
	add("synchronous", "NORMAL")
	// The journals of savepoints (a shared transaction sets one a request)
	// stay in memory rather than spill to temporary files.
	add("temp_store", "MEMORY")
	if !q.Has("_txlock") {
		q.Set("_txlock", "immediate")
	}
	return path + "?" + q.Encode(), set["journal_mode"]
}

// createPrivate creates the database file of the SQLite DSN sdsn (as
// sqliteDSN makes it), empty and with mode 0600, unless it exists: it
// will hold job payloads and results, credential digests and receipts,
// which no other user of the machine should read, and SQLite would
// create it with the process's default mode (0644 under the usual
// umask). SQLite gives the -wal and -shm files it creates beside it the
// mode of the database file. A file that exists keeps its mode, which
// is its owner's choice; an in-memory or read-only database creates
// nothing.
func createPrivate(sdsn string) error {
	path, query, _ := strings.Cut(strings.TrimPrefix(sdsn, "file:"), "?")
	q, _ := url.ParseQuery(query)
	if path == "" || path == ":memory:" || q.Get("mode") == "memory" || q.Get("mode") == "ro" || q.Has("vfs") {
		return nil
	}
	if rest, ok := strings.CutPrefix(path, "//"); ok {
		// A file://host/path URI: the path starts at the next slash.
		i := strings.IndexByte(rest, '/')
		if i < 0 {
			return nil
		}
		path = rest[i:]
	}
	if p, err := url.PathUnescape(path); err == nil {
		path = p
	}
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE|os.O_EXCL, 0o600)
	switch {
	case errors.Is(err, fs.ErrExist):
		return nil
	case err != nil:
		return fmt.Errorf("bunstore: create the sqlite database file: %w", err)
	}
	return f.Close()
}

// enableWAL puts a SQLite database in WAL mode, which the file keeps, so
// it is done once here rather than as each connection opens. Switching
// modes can fail with SQLITE_BUSY without waiting in the busy handler
// while another process opens the same new file, so it is retried.
func enableWAL(ctx context.Context, db *sql.DB, timeout time.Duration) error {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	for {
		var mode string
		err := db.QueryRowContext(ctx, "PRAGMA journal_mode = WAL").Scan(&mode)
		switch {
		case err == nil && !strings.EqualFold(mode, "wal"):
			return fmt.Errorf("journal mode is %s", mode)
		case err == nil || !isBusy(err):
			return err
		}
		t := time.NewTimer(lockRetry)
		select {
		case <-ctx.Done():
			t.Stop()
			return err
		case <-t.C:
		}
	}
}

type txKey struct{}

// WithTx returns a context that carries tx: every store method called with
// it runs in tx, and InTx joins it. It lets the stores join a transaction
// the host began on the same database.
func WithTx(ctx context.Context, tx bun.Tx) context.Context {
	return context.WithValue(ctx, txKey{}, tx)
}

func txFrom(ctx context.Context) (bun.Tx, bool) {
	tx, ok := ctx.Value(txKey{}).(bun.Tx)
	return tx, ok
}

// InTx runs fn in one transaction carried in fn's context, committing if
// fn returns nil and rolling back otherwise. If ctx already carries a
// transaction, fn joins it and the outermost caller commits. On SQLite
// the transaction is a writer from its start (BEGIN IMMEDIATE).
func (db *DB) InTx(ctx context.Context, fn func(ctx context.Context) error) error {
	return db.inTx(ctx, func(ctx context.Context, _ bun.IDB) error { return fn(ctx) })
}

// Every store method runs its statements through idb (reads), write (one
// write statement) or inTx (statements that commit together), so that it
// joins the context's transaction and, on SQLite, takes the write slot.

// idb is what a read runs on: the context's transaction, if any, else
// the pool.
func (db *DB) idb(ctx context.Context) bun.IDB {
	if tx, ok := txFrom(ctx); ok {
		return tx
	}
	return db.bun
}

// write runs fn, a single write statement, in the context's transaction,
// or else on the pool holding the write slot.
func (db *DB) write(ctx context.Context, fn func(ctx context.Context, idb bun.IDB) error) error {
	if tx, ok := txFrom(ctx); ok {
		return fn(ctx, tx)
	}
	release, err := db.acquire(ctx)
	if err != nil {
		return err
	}
	defer release()
	return fn(ctx, db.bun)
}

// inTx runs fn in the context's transaction, or else in a new one that
// holds the write slot.
func (db *DB) inTx(ctx context.Context, fn func(ctx context.Context, tx bun.IDB) error) error {
	if tx, ok := txFrom(ctx); ok {
		return fn(ctx, tx)
	}
	release, err := db.acquire(ctx)
	if err != nil {
		return err
	}
	defer release()
	changes := &txChanges{}
	err = db.bun.RunInTx(ctx, nil, func(ctx context.Context, tx bun.Tx) error {
		return fn(context.WithValue(WithTx(ctx, tx), txChangesKey{}, changes), tx)
	})
	if keys := changes.list(); len(keys) > 0 {
		db.forget(keys...)
	}
	return err
}

// durableTx is inTx for a transaction that must survive a power loss once
// it has committed, because what follows its commit hands out a promise
// about it: the receipts sequencer signs a checkpoint of the tree the
// transaction made. On SQLite the connections run synchronous=NORMAL,
// under which a commit in WAL mode reaches the disk only at the next
// checkpoint of the WAL; this transaction runs on a connection set to
// synchronous=FULL for it, so that its commit syncs the WAL, and with it
// every commit before it. (FULL for every transaction was measured to
// cost a single writer about two thirds of its throughput; see
// CHANGELOG.) On PostgreSQL every commit is durable; durableTx is inTx.
func (db *DB) durableTx(ctx context.Context, fn func(ctx context.Context, tx bun.IDB) error) error {
	if _, ok := txFrom(ctx); ok || db.postgres() {
		return db.inTx(ctx, fn)
	}
	release, err := db.acquire(ctx)
	if err != nil {
		return err
	}
	defer release()
	conn, err := db.bun.Conn(ctx)
	if err != nil {
		return err
	}
	defer conn.Close()
	var level int
	if err := conn.QueryRowContext(ctx, "PRAGMA synchronous").Scan(&level); err != nil {
		return err
	}
	if level < sqliteSyncFull {
		if _, err := conn.ExecContext(ctx, "PRAGMA synchronous = FULL"); err != nil {
			return err
		}
		defer func() {
			// The connection goes back to the pool as it came, or not at
			// all.
			q := "PRAGMA synchronous = " + strconv.Itoa(level)
			if _, err := conn.ExecContext(context.WithoutCancel(ctx), q); err != nil {
				conn.Raw(func(any) error { return driver.ErrBadConn })
			}
		}()
	}
	changes := &txChanges{}
	err = conn.RunInTx(ctx, nil, func(ctx context.Context, tx bun.Tx) error {
		return fn(context.WithValue(WithTx(ctx, tx), txChangesKey{}, changes), tx)
	})
	if keys := changes.list(); len(keys) > 0 {
		db.forget(keys...)
	}
	return err
}

// sqliteSyncFull is PRAGMA synchronous's number for FULL.
const sqliteSyncFull = 2

// acquire takes the SQLite write slot. It waits as long as other writes
// finish, and gives up only if none finishes for a whole busy timeout,
// which means the slot's holder is stuck (for example, it waits on a
// write that was called without its transaction's context). On
// PostgreSQL it does nothing.
func (db *DB) acquire(ctx context.Context) (release func(), err error) {
	if db.writeSlot == nil {
		return func() {}, nil
	}
	release = func() {
		db.writes.Add(1)
		<-db.writeSlot
	}
	select {
	case db.writeSlot <- struct{}{}:
		return release, nil
	default:
	}
	db.slotWaiters.Add(1)
	defer db.slotWaiters.Add(-1)
	seen := db.writes.Load()
	t := time.NewTicker(db.cfg.BusyTimeout)
	defer t.Stop()
	for {
		select {
		case db.writeSlot <- struct{}{}:
			return release, nil
		case <-ctx.Done():
			return nil, fmt.Errorf("bunstore: waiting to write: %w", context.Cause(ctx))
		case <-t.C:
			n := db.writes.Load()
			if n == seen {
				return nil, fmt.Errorf("bunstore: no write finished within the busy timeout (%v)", db.cfg.BusyTimeout)
			}
			seen = n
		}
	}
}

func (db *DB) postgres() bool { return db.dialect == dialect.PG }
