package bunstore

import (
	"context"
	"fmt"
	"time"

	"github.com/uptrace/bun"

	"github.com/nodelane/nodelane/replay"
)

// NonceConfig holds a NonceStore's optional settings. A nil *NonceConfig
// means all defaults.
type NonceConfig struct {
	// PerNode caps the live nonces (those that expire after now) of one
	// node: a node that holds this many gets replay.ErrQuota until some
	// expire. At 300 s a signature, the default lets a node make 33
	// requests a second. Defaults to 10,000.
	PerNode int
}

// NonceStore is the replay.Store of a DB: table nodelane_nonces, one
// row per (node, nonce) until the signature expires, shared by every
// replica on the database. Insert joins the transaction its context
// carries (see DB.InTx and WithTx), so a request's nonce is consumed only
// if the request's transaction commits; a caller that must consume it
// whatever happens calls Insert (or replay.Verifier.Consume) without one.
//
// Every error other than replay.ErrReplayedNonce and replay.ErrQuota wraps
// replay.ErrUnavailable as well as the driver's error: a store that cannot
// answer never lets a request pass. When PostgreSQL aborted the
// transaction (a serialization failure or a deadlock), the error matches
// replay.ErrAborted too.
//
// On PostgreSQL, Insert locks a row per node in nodelane_nonce_nodes,
// which keeps one row for every node that ever recorded a nonce.
//
// The store keeps no total cap: the database's disk is the limit, and a
// maintainer calls Collect (through replay.Verifier.Collect) to delete dead
// rows. Expired rows also stop counting towards the quota, and Insert
// replaces them, before Collect runs.
type NonceStore struct {
	db      *DB
	perNode int
}

var _ replay.Store = (*NonceStore)(nil)

// NonceStore returns the replay.Store kept in db. cfg may be nil.
func (db *DB) NonceStore(cfg *NonceConfig) *NonceStore {
	s := &NonceStore{db: db, perNode: 10000}
	if cfg != nil && cfg.PerNode > 0 {
		s.perNode = cfg.PerNode
	}
	return s
}

// insertNonce records a nonce in one statement, atomically in both
// dialects: the row goes in only if the node is below its quota of live
// nonces (the sub-select), and a row of the pair already there is replaced
// only if it is dead (expires_at <= now). Of concurrent inserts of one
// pair, PostgreSQL makes all but the first wait on its index entry and
// then re-check the WHERE against the committed row, so exactly one
// affects a row; SQLite runs one writer at a time. The sub-select's WHERE
// is required by SQLite, whose parser would otherwise read ON CONFLICT as
// a join constraint.
const insertNonce = `INSERT INTO nodelane_nonces (node_id, nonce, expires_at)
SELECT ?0, ?1, ?2
WHERE (SELECT count(*) FROM nodelane_nonces WHERE node_id = ?0 AND expires_at > ?3) < ?4
ON CONFLICT (node_id, nonce) DO UPDATE SET expires_at = EXCLUDED.expires_at
WHERE nodelane_nonces.expires_at <= ?3`

// lockNonceNode, on PostgreSQL, locks the node's row of
// nodelane_nonce_nodes (creating it on the node's first nonce) before
// insertNonce counts the node's live nonces. Without it, concurrent
// inserts of one node's different nonces would each count the rows
// committed before they started and together pass the quota by as many as
// ran at once. Both statements go in one query string, which PostgreSQL
// runs in one implicit transaction (or in the one the context carries) in
// one round trip, each statement under a snapshot of its own: under READ
// COMMITTED the count's snapshot is taken once the lock is granted, so it
// sees every nonce the previous holder committed. Under REPEATABLE READ or
// SERIALIZABLE, a holder that committed after the transaction's snapshot
// makes the lock a serialization failure (replay.ErrAborted) rather than a
// stale count. The UPDATE changes nothing but is a real one on purpose:
// it is what a later snapshot's transaction conflicts with.
//
// Bun sends a query with its arguments already in the text, and pgx (as
// lib/pq) sends a query without arguments as one simple query, which may
// hold several statements; its result is the last statement's.
const lockNonceNode = `INSERT INTO nodelane_nonce_nodes (node_id) VALUES (?0)
ON CONFLICT (node_id) DO UPDATE SET node_id = EXCLUDED.node_id;
`

// Insert implements replay.Store. It records nonce for nodeID until
// expires, and returns replay.ErrReplayedNonce if the pair is recorded and
// expires after now, or else replay.ErrQuota if nodeID already holds
// PerNode nonces that expire after now.
//
// The quota and single use are exact in both dialects, also across
// replicas: SQLite runs one writer at a time, and on PostgreSQL one node's
// inserts take turns on a lock (see lockNonceNode), held until the
// transaction that inserts ends; so while a request's transaction holds a
// nonce of a node, that node's other nonces wait for it to commit or roll
// back, as copies of the same nonce must. Other nodes never wait.
//
// On the success path Insert is one round trip. When the database aborts
// the transaction (a serialization failure or a deadlock), Insert runs
// again, up to three times in all, if the context carries no transaction,
// and otherwise returns an error that matches replay.ErrAborted as well as
// replay.ErrUnavailable: the caller's transaction is lost and must be run
// again whole.
func (s *NonceStore) Insert(ctx context.Context, nodeID, nonce string, expires, now time.Time) error {
	var outcome error
	err := s.db.retryOwnTx(ctx, func() error {
		var err error
		outcome, err = s.insert(ctx, nodeID, nonce, expires, now)
		return err
	})
	if err != nil {
		return nonceUnavailable("insert nonce of node "+nodeID, markAborted(err, replay.ErrAborted))
	}
	return outcome
}

// insert tries once. It returns the outcome Insert reports (nil,
// ErrReplayedNonce, ErrQuota) or the error that kept it from knowing.
func (s *NonceStore) insert(ctx context.Context, nodeID, nonce string, expires, now time.Time) (outcome, err error) {
	t := micros(now)
	q := insertNonce
	if s.db.postgres() {
		q = lockNonceNode + insertNonce
	}
	var n int64
	err = s.db.write(ctx, func(ctx context.Context, idb bun.IDB) error {
		res, err := idb.NewRaw(q, nodeID, nonce, micros(expires), t, s.perNode).Exec(ctx)
		if err != nil {
			return err
		}
		n, err = res.RowsAffected()
		return err
	})
	if err != nil {
		return nil, err
	}
	if n > 0 {
		return nil, nil
	}
	// Nothing was written: the pair is live, or the node is at its quota,
	// or both, and then the replay is what the caller must hear.
	live, err := s.db.idb(ctx).NewSelect().TableExpr("nodelane_nonces").
		Where("node_id = ?", nodeID).Where("nonce = ?", nonce).Where("expires_at > ?", t).
		Exists(ctx)
	if err != nil {
		return nil, err
	}
	if live {
		return fmt.Errorf("bunstore: nonce of node %s: %w", nodeID, replay.ErrReplayedNonce), nil
	}
	return fmt.Errorf("bunstore: node %s holds %d live nonces: %w", nodeID, s.perNode, replay.ErrQuota), nil
}

// collectBatch bounds the rows one statement of Collect deletes, so that
// no statement holds SQLite's write lock, or a long PostgreSQL
// transaction, for a backlog of any size.
const collectBatch = 5000

// collectPostgres deletes a batch of dead nonces found through the expiry
// index, by their row addresses: a join on the key would scan the table.
// Replicas collecting at once split the rows rather than wait for each
// other (SKIP LOCKED); the rows stay locked from the sub-select to the
// delete, so their addresses cannot change in between.
const collectPostgres = `DELETE FROM nodelane_nonces WHERE ctid = ANY(ARRAY(
SELECT ctid FROM nodelane_nonces WHERE expires_at <= ?0 LIMIT ?1 FOR UPDATE SKIP LOCKED))`

// collectSQLite deletes a batch of dead nonces found through the expiry
// index, each by its primary key.
const collectSQLite = `DELETE FROM nodelane_nonces WHERE (node_id, nonce) IN (
SELECT node_id, nonce FROM nodelane_nonces WHERE expires_at <= ?0 LIMIT ?1)`

// Collect implements replay.Store: it deletes the nonces that expire
// at or before now, in batches, and returns how many it deleted. Several
// replicas may collect at once.
func (s *NonceStore) Collect(ctx context.Context, now time.Time) (int, error) {
	t := micros(now)
	total := 0
	for {
		var n int64
		err := s.db.retryOwnTx(ctx, func() error {
			return s.db.write(ctx, func(ctx context.Context, idb bun.IDB) error {
				q := collectSQLite
				if s.db.postgres() {
					q = collectPostgres
				}
				res, err := idb.NewRaw(q, t, collectBatch).Exec(ctx)
				if err != nil {
					return err
				}
				n, err = res.RowsAffected()
				return err
			})
		})
		if err != nil {
			return total, nonceUnavailable("collect nonces", markAborted(err, replay.ErrAborted))
		}
		total += int(n)
		if n < collectBatch {
			return total, nil
		}
	}
}

// nonceUnavailable wraps a driver error so that it matches both
// replay.ErrUnavailable and the error itself.
func nonceUnavailable(what string, err error) error {
	return fmt.Errorf("bunstore: %s: %w: %w", what, replay.ErrUnavailable, err)
}
