package bunstore

import (
	"context"
	"database/sql"
	"strings"
	"sync"
	"time"

	"github.com/uptrace/bun"
)

// The read cache. Every worker request reads its credential, the
// credential's principal and the envelope state, which change rarely: a
// DB keeps what it read of them in memory for at most Config.CacheTTL
// (DefaultCacheTTL, 1 s), so that a busy node's requests do not read
// them again, and forgets an entry as soon as it learns of a change:
//
//   - a change this DB makes is forgotten when its transaction commits
//     (DB.InTx), or at once when it runs outside one; a transaction of
//     DB.InTx that changed an entry reads it from the database until it
//     ends, and one the host began (WithTx) never reads from the cache;
//   - on PostgreSQL, the statement that changes an entry also sends a
//     notification (pg_notify in the same transaction, so it goes out
//     when the change commits) on the channel of the DB's Notifier, and
//     every Notifier hearing it, on every replica, makes its DB forget
//     the entry; a Notifier that lost its connection makes its DB forget
//     everything once it listens again.
//
// So a revocation, a ban or a deactivation takes effect on every replica
// within milliseconds when they listen (a Notifier), and within CacheTTL
// in every case: a replica without a Notifier, a SQLite file written by
// another process, a notification lost with its connection. While a
// Notifier of the DB listens, on PostgreSQL, every change reaches it, and
// entries live Config.ListenedCacheTTL (1 min), so that a node that
// heartbeats every 30 s finds its credential in memory; the cache is
// emptied whenever a listener connects or loses its connection.
//
// A read that started before a change was forgotten is not kept (the
// generation check of put), so the cache never keeps a value older than
// a change it learnt of.

// DefaultCacheTTL is the default of Config.CacheTTL, and
// DefaultListenedCacheTTL of Config.ListenedCacheTTL.
const (
	DefaultCacheTTL         = time.Second
	DefaultListenedCacheTTL = time.Minute
)

// cachePayload prefixes the key of a changed entry in the payload of a
// notification; a notification without it announces jobs.
const cachePayload = "nodelane-cache:"

// maxCacheEntries bounds the cache; when it is full it starts afresh.
const maxCacheEntries = 1 << 16

// The keys of the cache's entries.
func credentialKey(id string) string { return "credential/" + id }
func principalKey(id string) string  { return "principal/" + id }

const envelopeKey = "envelope"

// readCache holds values read from the database, each for at most ttl,
// or listenedTTL while a Notifier of its DB listens.
type readCache struct {
	ttl         time.Duration
	listenedTTL time.Duration
	now         func() time.Time

	mu sync.Mutex
	// listening counts the Notifiers of the DB whose listener is
	// connected: while one is, every change any replica commits reaches
	// the cache, and entries live listenedTTL. The cache is emptied when a
	// listener connects and when one loses its connection.
	listening int
	// gen counts the invalidations: a value read while one happened is
	// not kept.
	gen   uint64
	items map[string]cacheEntry
}

type cacheEntry struct {
	v  any
	at time.Time // when the read that gave v began
}

// newReadCache returns a cache whose entries live ttl, or nil (no
// cache) for a negative ttl.
func newReadCache(ttl, listenedTTL time.Duration) *readCache {
	if ttl < 0 {
		return nil
	}
	if ttl == 0 {
		ttl = DefaultCacheTTL
	}
	if listenedTTL <= 0 {
		listenedTTL = DefaultListenedCacheTTL
	}
	return &readCache{ttl: ttl, listenedTTL: max(ttl, listenedTTL), now: time.Now, items: map[string]cacheEntry{}}
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

// get returns the live entry of key.
func (c *readCache) get(key string) (any, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	e, ok := c.items[key]
	if !ok {
		return nil, false
	}
	ttl := c.ttl
	if c.listening > 0 {
		ttl = c.listenedTTL
	}
	if c.now().Sub(e.at) >= ttl {
		delete(c.items, key)
		return nil, false
	}
	return e.v, true
}

// begin returns the generation and the time a read from the database
// starts at, for put.
func (c *readCache) begin() (uint64, time.Time) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.gen, c.now()
}

// put keeps v for key unless an invalidation came after begin gave gen.
func (c *readCache) put(key string, gen uint64, at time.Time, v any) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if gen != c.gen {
		return
	}
	if len(c.items) >= maxCacheEntries {
		clear(c.items)
	}
	c.items[key] = cacheEntry{v: v, at: at}
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

// cachedRead returns key's value from the cache when ctx may read it
// there, and otherwise loads it and keeps it.
func cachedRead[T any](ctx context.Context, db *DB, key string, load func() (T, error)) (T, error) {
	if !db.mayCache(ctx, key) {
		return load()
	}
	if v, ok := db.cache.get(key); ok {
		return v.(T), nil
	}
	gen, at := db.cache.begin()
	v, err := load()
	if err == nil {
		db.cache.put(key, gen, at, v)
	}
	return v, err
}

// changed announces that a write through idb, just made with ctx,
// changed the entries keys: on PostgreSQL by a notification in the same
// transaction, and for this DB's cache when that transaction commits
// (DB.InTx) or at once (outside one, or in the host's own).
func (db *DB) changed(ctx context.Context, idb bun.IDB, keys ...string) error {
	if t, ok := ctx.Value(txChangesKey{}).(*txChanges); ok {
		t.add(keys)
	} else if db.cache != nil {
		db.cache.drop(keys...)
	}
	if !db.postgres() {
		return nil
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
