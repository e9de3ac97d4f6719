package bunstore

import (
	"context"
	"database/sql"
	"errors"
	"strings"
	"sync"
	"time"

	"github.com/uptrace/bun"

	"github.com/nodelane/nodelane/credential"
)

// The read cache. Every worker request reads its credential, the
// credential's principal and the envelope state, which change rarely: a
// DB keeps what it read of them in memory, so that a node's requests do
// not read them again, for as long as it knows of no change:
//
//   - a change this DB makes is forgotten when its transaction commits
//     (DB.InTx), or at once when it runs outside one; a transaction of
//     DB.InTx that changed an entry reads it from the database until it
//     ends, and one the host began (WithTx) never reads from the cache;
//   - on PostgreSQL, the statement that changes an entry also sends a
//     notification (pg_notify in the same transaction, so it goes out
//     when the change commits) on the channel of the DB's Notifier, and
//     every Notifier hearing it, on every replica, makes its DB forget
//     the entry; a Notifier that lost its connection (or whose pings go
//     unanswered) makes its DB forget everything, and so does one that
//     connects. While a Notifier of the DB listens, every change any
//     replica commits reaches the cache: entries are served until one
//     is heard (or, if set, for at most Config.ListenedCacheTTL);
//   - otherwise the DB looks once per Config.CacheTTL (DefaultCacheTTL,
//     1 s), when a read finds its last look older. On SQLite every change
//     of an entry increments, in its transaction, the one row of
//     nodelane_cache_version, and a look reads it: the entries stay while
//     it reads as before, and all go when it does not, so that one
//     statement a second keeps a whole fleet's credentials however rarely
//     each node calls, and a change another process made to the file is
//     seen. On PostgreSQL without a listener a look forgets everything
//     (an increment there would make every change of an entry wait for
//     the previous one's commit).
//
// So a revocation, a ban or a deactivation takes effect on every replica
// within milliseconds when they listen (a Notifier), and within CacheTTL
// in every other case: a replica without a Notifier, a SQLite file
// written by another process.
//
// A read that started before a change was forgotten is not kept (the
// generation check of put), so the cache never keeps a value older than
// a change it learnt of; a look vouches for the entries as of when it
// began.

// DefaultCacheTTL is the default of Config.CacheTTL.
const DefaultCacheTTL = time.Second

// cachePayload prefixes the key of a changed entry in the payload of a
// notification; a notification without it announces jobs.
const cachePayload = "nodelane-cache:"

// maxCacheEntries bounds the cache; when it is full it starts afresh.
const maxCacheEntries = 1 << 16

// The keys of the cache's entries.
func credentialKey(id string) string { return "credential/" + id }
func principalKey(id string) string  { return "principal/" + id }

const envelopeKey = "envelope"

// The statements of the version row (SQLite's migration 0020).
const (
	cacheVersionRead = "SELECT version FROM nodelane_cache_version WHERE id = 1"
	cacheVersionBump = "UPDATE nodelane_cache_version SET version = version + 1 WHERE id = 1"
)

// readCache holds values read from the database until it learns of a
// change (see above).
type readCache struct {
	ttl         time.Duration
	listenedTTL time.Duration
	now         func() time.Time

	mu sync.Mutex
	// listening counts the Notifiers of the DB whose listener is
	// connected: while one is, every change any replica commits reaches
	// the cache, and a look is due every listenedTTL (never if 0). The
	// cache is emptied when a listener connects and when one loses its
	// connection.
	listening int
	// gen counts the invalidations: a value read while one happened is
	// not kept.
	gen   uint64
	items map[string]any
	// version is the version row as last read (valid if known), checked
	// when the last look began; checking reports that a look is under
	// way.
	version  int64
	known    bool
	checked  time.Time
	checking bool
}

// newReadCache returns a cache that looks every ttl, or every
// listenedTTL (if positive) while a listener is connected, or nil (no
// cache) for a negative ttl.
func newReadCache(ttl, listenedTTL time.Duration) *readCache {
	if ttl < 0 {
		return nil
	}
	if ttl == 0 {
		ttl = DefaultCacheTTL
	}
	if listenedTTL > 0 {
		listenedTTL = max(ttl, listenedTTL)
	}
	return &readCache{ttl: ttl, listenedTTL: listenedTTL, now: time.Now, items: map[string]any{}}
}

// listen records that a listener connected (up) or lost its connection,
// and empties the cache: notifications may have been missed.
func (c *readCache) listen(up bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if up {
		c.listening++
	} else {
		c.listening--
	}
	c.gen++
	clear(c.items)
}

// fresh reports whether the last look is recent enough; c.mu is held.
func (c *readCache) fresh() bool {
	if c.listening > 0 {
		return c.known && (c.listenedTTL == 0 || c.now().Sub(c.checked) < c.listenedTTL)
	}
	return c.known && c.now().Sub(c.checked) < c.ttl
}

// get returns the entry of key if the last look is recent enough. due
// reports that it is not, and that no look is under way: the caller is
// to look (checkedAt). After a look, peek (claim false) never claims the
// next one.
func (c *readCache) get(key string) (v any, ok, due bool) { return c.lookup(key, true) }

func (c *readCache) peek(key string) (any, bool) {
	v, ok, _ := c.lookup(key, false)
	return v, ok
}

func (c *readCache) lookup(key string, claim bool) (v any, ok, due bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if !c.fresh() {
		if c.checking || !claim {
			return nil, false, false
		}
		c.checking = true
		return nil, false, true
	}
	v, ok = c.items[key]
	return v, ok, false
}

// checkedAt ends a look that began at start and read version: the
// entries hold as of start if it is the one known, and the cache is
// emptied if it is not. A failed look (err) vouches for nothing.
func (c *readCache) checkedAt(start time.Time, version int64, err error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.checking = false
	if err != nil {
		return
	}
	if !c.known || version != c.version {
		c.gen++
		clear(c.items)
		c.version, c.known = version, true
	}
	c.checked = start
}

// begin returns the generation a read from the database starts at, for
// put.
func (c *readCache) begin() uint64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.gen
}

// put keeps v for key unless an invalidation came after begin gave gen.
func (c *readCache) put(key string, gen uint64, v any) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if gen != c.gen {
		return
	}
	if len(c.items) >= maxCacheEntries {
		clear(c.items)
	}
	c.items[key] = v
}

// drop forgets keys, and every read in flight.
func (c *readCache) drop(keys ...string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.gen++
	for _, k := range keys {
		delete(c.items, k)
	}
}

// txChanges records the entries a transaction of DB.InTx changed, to
// forget once it ends, and which it must read from the database
// meanwhile.
type txChanges struct {
	mu   sync.Mutex
	keys map[string]struct{}
}

type txChangesKey struct{}

func (t *txChanges) add(keys []string) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.keys == nil {
		t.keys = map[string]struct{}{}
	}
	for _, k := range keys {
		t.keys[k] = struct{}{}
	}
}

func (t *txChanges) has(key string) bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	_, ok := t.keys[key]
	return ok
}

func (t *txChanges) list() []string {
	t.mu.Lock()
	defer t.mu.Unlock()
	out := make([]string, 0, len(t.keys))
	for k := range t.keys {
		out = append(out, k)
	}
	return out
}

// mayCache reports whether a read of key with ctx may come from the
// cache: outside a transaction, or in one of DB.InTx that has not changed
// the entry.
func (db *DB) mayCache(ctx context.Context, key string) bool {
	if db.cache == nil {
		return false
	}
	if _, ok := txFrom(ctx); !ok {
		return true
	}
	t, ok := ctx.Value(txChangesKey{}).(*txChanges)
	return ok && !t.has(key)
}

// mayCheck reports whether ctx may read the version row for the cache:
// outside a transaction, or in one of DB.InTx that changed no entry (one
// that did reads its own increment, which may never commit).
func mayCheck(ctx context.Context) bool {
	if _, ok := txFrom(ctx); !ok {
		return true
	}
	t, ok := ctx.Value(txChangesKey{}).(*txChanges)
	return ok && len(t.list()) == 0
}

// cachedRead returns key's value from the cache when ctx may read it
// there, looking first when a look is due, and otherwise loads it and
// keeps it. Under credential.MemoryOnly it reads nothing from the
// database: what it would read it answers credential.ErrNotInMemory.
func cachedRead[T any](ctx context.Context, db *DB, key string, load func() (T, error)) (T, error) {
	c, cached := db.cache, db.mayCache(ctx, key)
	var gen uint64
	if cached {
		v, ok, due := c.get(key)
		if due {
			start := c.now()
			version, err := db.cacheVersion(ctx)
			c.checkedAt(start, version, err)
			v, ok = c.peek(key)
		}
		if ok {
			return v.(T), nil
		}
		gen = c.begin()
	}
	if credential.IsMemoryOnly(ctx) {
		var zero T
		return zero, credential.ErrNotInMemory
	}
	loaded, err := load()
	if err == nil && cached {
		c.put(key, gen, loaded)
	}
	return loaded, err
}

// cacheVersion is a look's version: on SQLite the version row's, read
// with ctx if it may (mayCheck); on PostgreSQL, where nothing increments
// it, one the cache never knew, so that the look empties it. Under
// credential.MemoryOnly no look happens.
func (db *DB) cacheVersion(ctx context.Context) (int64, error) {
	if credential.IsMemoryOnly(ctx) {
		return 0, errNoCheck
	}
	if db.postgres() {
		db.cache.mu.Lock()
		defer db.cache.mu.Unlock()
		return db.cache.version + 1, nil
	}
	if !mayCheck(ctx) {
		return 0, errNoCheck
	}
	var version int64
	err := db.idb(ctx).QueryRowContext(ctx, cacheVersionRead).Scan(&version)
	return version, err
}

// errNoCheck ends a look at the version that did not happen.
var errNoCheck = errors.New("bunstore: the version row was not read")

// changed announces that a write through idb, just made with ctx,
// changed the entries keys: in the same transaction, on SQLite by the
// version row's increment, on PostgreSQL by a notification; and for this DB's cache when that transaction commits
// (DB.InTx) or at once (outside one, or in the host's own).
func (db *DB) changed(ctx context.Context, idb bun.IDB, keys ...string) error {
	if t, ok := ctx.Value(txChangesKey{}).(*txChanges); ok {
		t.add(keys)
	} else {
		db.forget(keys...)
	}
	if !db.postgres() {
		_, err := idb.ExecContext(ctx, cacheVersionBump)
		return err
	}
	ch, err := db.cacheChannel(ctx, idb)
	if err != nil {
		return err
	}
	for _, k := range keys {
		if _, err := idb.ExecContext(ctx, "SELECT pg_notify(?, ?)", ch, cachePayload+k); err != nil {
			return err
		}
	}
	return nil
}

// updateCached runs update, a conditional write of the cached entry key,
// and announces the change (changed) if it wrote. If it found the row
// changed or gone, the entry this DB may hold is stale: it is forgotten,
// so that the caller's next read, before it tries again, is fresh.
func (db *DB) updateCached(ctx context.Context, idb bun.IDB, key string, update func() error) error {
	if err := update(); err != nil {
		db.forget(key)
		return err
	}
	return db.changed(ctx, idb, key)
}

// forget drops keys from this DB's cache only: after a conditional write
// that found the row changed, whose cached value is thus stale.
func (db *DB) forget(keys ...string) {
	if db.cache != nil {
		db.cache.drop(keys...)
	}
}

// created records, in a transaction of DB.InTx, that it wrote a new
// entry: until it ends, its own reads of the entry (which see the
// uncommitted row) must not fill the cache. No entry could hold the key
// before, so no one else need forget it.
func (db *DB) created(ctx context.Context, key string) {
	if t, ok := ctx.Value(txChangesKey{}).(*txChanges); ok {
		t.add([]string{key})
	}
}

// listening tells this DB's cache that a listener connected (up) or lost
// its connection.
func (db *DB) listening(up bool) {
	if db.cache != nil {
		db.cache.listen(up)
	}
}

// heard handles a notification's payload: it reports whether it
// announced jobs, and forgets the entry it names otherwise.
func (db *DB) heard(payload string) (jobs bool) {
	key, ok := strings.CutPrefix(payload, cachePayload)
	if !ok {
		return true
	}
	db.forget(key)
	return false
}

// cacheChannel returns the channel changes are announced on: the one of
// the latest Notifier made from db, else the default channel of the
// current schema, which Notifiers use unless configured otherwise.
func (db *DB) cacheChannel(ctx context.Context, idb bun.IDB) (string, error) {
	db.chMu.Lock()
	ch := db.channel
	db.chMu.Unlock()
	if ch != "" {
		return ch, nil
	}
	var schema sql.NullString
	if err := idb.QueryRowContext(ctx, "SELECT current_schema()").Scan(&schema); err != nil {
		return "", err
	}
	db.chMu.Lock()
	defer db.chMu.Unlock()
	if db.channel == "" {
		db.channel = channelFor(schema.String)
	}
	return db.channel, nil
}

// useChannel makes ch, a new Notifier's, the channel changes are
// announced on.
func (db *DB) useChannel(ch string) {
	db.chMu.Lock()
	defer db.chMu.Unlock()
	db.channel = ch
}
