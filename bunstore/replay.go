package bunstore

import (
	"context"
	"fmt"
	"maps"
	"regexp"
	"slices"
	"strings"
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
// Insert counts a node's rows, and on PostgreSQL locks the node, in its
// row of nodelane_nonce_nodes, which keeps one row for every node that
// ever recorded a nonce.
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

// countNonce adds the nonce about to be inserted to its node's rows_held
// (creating the node's row on its first nonce), and so locks the row
// before insertNonce decides the quota. Without the lock, concurrent
// inserts of one node's different nonces would each count the rows
// committed before they started and together pass the quota by as many as
// ran at once. On PostgreSQL both statements go in one query string,
// which runs in one implicit transaction (or in the one the context
// carries) in one round trip, each statement under a snapshot of its own:
// under READ COMMITTED the second's snapshot is taken once the lock is
// granted, so it sees every nonce the previous holder committed. Under
// REPEATABLE READ or SERIALIZABLE, a holder that committed after the
// transaction's snapshot makes the lock a serialization failure
// (replay.ErrAborted) rather than a stale count. SQLite runs one writer
// at a time, and the two statements go one after the other: outside a
// transaction, a crash or an error between them leaves rows_held one
// above the rows, never below.
//
// Bun sends a query with its arguments already in the text, and pgx (as
// lib/pq) sends a query without arguments as one simple query, which may
// hold several statements; its result is the last statement's.
const countNonce = `INSERT INTO nodelane_nonce_nodes (node_id, rows_held) VALUES (?0, 1)
ON CONFLICT (node_id) DO UPDATE SET rows_held = nodelane_nonce_nodes.rows_held + 1;
`

// sqliteNonce are countNonce and insertNonce bound (stmt.go), with
// SQLite's numbered parameters, which count from 1: prepared once a
// connection rather than parsed for every request.
var sqliteNonce = [2]string{sqliteParams(countNonce), sqliteParams(insertNonce)}

// sqliteParams renumbers bun's ?0 to ?9 as SQLite's ?1 to ?10, and drops
// a closing semicolon: the driver prepares a text of one statement once,
// but one with anything after its statement again at every run.
func sqliteParams(q string) string {
	q = strings.TrimSuffix(strings.TrimSpace(q), ";")
	return regexp.MustCompile(`\?\d`).ReplaceAllStringFunc(q, func(p string) string { return fmt.Sprintf("?%d", p[1]-'0'+1) })
}

// insertNonce records a nonce in one statement: the row goes in only if
// the node is below its quota of live nonces, and a row of the pair
// already there is replaced only if it is dead (expires_at <= now). The
// node's rows_held, which never falls below the rows it holds, decides
// the quota while it is within it; only a node with as many rows as its
// quota, live or dead, has its live nonces counted (the migration
// 0021_nonce_rows says why: a count reads every live nonce of the node,
// and was a fifth of a busy server's CPU). Of concurrent inserts of one
// pair, PostgreSQL makes all but the first wait on its index entry and
// then re-check the WHERE against the committed row, so exactly one
// affects a row. The sub-select's WHERE is required by SQLite, whose
// parser would otherwise read ON CONFLICT as a join constraint; CASE
// keeps the count from running when rows_held decides.
const insertNonce = `INSERT INTO nodelane_nonces (node_id, nonce, expires_at)
SELECT ?0, ?1, ?2
WHERE CASE WHEN (SELECT rows_held FROM nodelane_nonce_nodes WHERE node_id = ?0) <= ?4 THEN 1 = 1
  ELSE (SELECT count(*) FROM nodelane_nonces WHERE node_id = ?0 AND expires_at > ?3) < ?4 END
ON CONFLICT (node_id, nonce) DO UPDATE SET expires_at = EXCLUDED.expires_at
WHERE nodelane_nonces.expires_at <= ?3`

// Insert implements replay.Store. It records nonce for nodeID until
// expires, and returns replay.ErrReplayedNonce if the pair is recorded and
// expires after now, or else replay.ErrQuota if nodeID already holds
// PerNode nonces that expire after now.
//
// The quota and single use are exact in both dialects, also across
// replicas: SQLite runs one writer at a time, and on PostgreSQL one node's
// inserts take turns on a lock (see countNonce), held until the
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
	var n int64
	err = s.db.write(ctx, func(ctx context.Context, idb bun.IDB) error {
		var err error
		if s.db.postgres() {
			n, err = affected(idb.NewRaw(countNonce+insertNonce, nodeID, nonce, micros(expires), t, s.perNode).Exec(ctx))
		} else if _, err = s.db.execBound(ctx, idb, sqliteNonce[0], nodeID); err == nil {
			n, err = affected(s.db.execBound(ctx, idb, sqliteNonce[1], nodeID, nonce, micros(expires), t, s.perNode))
		}
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
SELECT ctid FROM nodelane_nonces WHERE expires_at <= ?0 LIMIT ?1 FOR UPDATE SKIP LOCKED))
RETURNING node_id`

// collectSQLite deletes a batch of dead nonces found through the expiry
// index, each by its primary key.
const collectSQLite = `DELETE FROM nodelane_nonces WHERE (node_id, nonce) IN (
SELECT node_id, nonce FROM nodelane_nonces WHERE expires_at <= ?0 LIMIT ?1)
RETURNING node_id`

// uncountNonces takes ?1 rows off node ?0's rows_held, after their delete
// committed: rows_held is never below the rows a node holds.
const uncountNonces = `UPDATE nodelane_nonce_nodes SET rows_held = CASE WHEN rows_held > ?1 THEN rows_held - ?1 ELSE 0 END
WHERE node_id = ?0`

// Collect implements replay.Store: it deletes the nonces that expire
// at or before now, in batches, and returns how many it deleted. Several
// replicas may collect at once.
func (s *NonceStore) Collect(ctx context.Context, now time.Time) (int, error) {
	t := micros(now)
	total := 0
	q := collectSQLite
	if s.db.postgres() {
		q = collectPostgres
	}
	for {
		var nodes []string
		err := s.db.retryOwnTx(ctx, func() error {
			return s.db.write(ctx, func(ctx context.Context, idb bun.IDB) error {
				nodes = nil
				return idb.NewRaw(q, t, collectBatch).Scan(ctx, &nodes)
			})
		})
		if err == nil {
			err = s.uncount(ctx, nodes)
		}
		if err != nil {
			return total, nonceUnavailable("collect nonces", markAborted(err, replay.ErrAborted))
		}
		total += len(nodes)
		if len(nodes) < collectBatch {
			return total, nil
		}
	}
}

// uncount takes the deleted rows of nodes (a node id per row) off the
// nodes' rows_held, in one transaction that updates them in id order, so
// that two replicas' never wait for each other in opposite orders.
func (s *NonceStore) uncount(ctx context.Context, nodes []string) error {
	if len(nodes) == 0 {
		return nil
	}
	n := map[string]int{}
	for _, id := range nodes {
		n[id]++
	}
	ids := slices.Sorted(maps.Keys(n))
	return s.db.retryOwnTx(ctx, func() error {
		return s.db.inTx(ctx, func(ctx context.Context, idb bun.IDB) error {
			for _, id := range ids {
				if _, err := idb.NewRaw(uncountNonces, id, n[id]).Exec(ctx); err != nil {
					return err
				}
			}
			return nil
		})
	})
}

// nonceUnavailable wraps a driver error so that it matches both
// replay.ErrUnavailable and the error itself.
func nonceUnavailable(what string, err error) error {
	return fmt.Errorf("bunstore: %s: %w: %w", what, replay.ErrUnavailable, err)
}
