-- One row per node that ever recorded a nonce, which NonceStore.Insert
-- locks (a no-op UPDATE) before it counts the node's live nonces, so that
-- one node's inserts are serialised and its quota is exact: under READ
-- COMMITTED the count, a statement of its own after the lock, sees every
-- nonce the previous holder committed; under REPEATABLE READ or
-- SERIALIZABLE a holder that committed after the snapshot makes the lock a
-- serialization failure rather than a stale count. SQLite runs one writer
-- at a time and needs no such row. Rows are never deleted: there is one
-- per node id, and it holds nothing else.
CREATE TABLE IF NOT EXISTS nodelane_nonce_nodes (
    node_id TEXT COLLATE "C" NOT NULL PRIMARY KEY
);
