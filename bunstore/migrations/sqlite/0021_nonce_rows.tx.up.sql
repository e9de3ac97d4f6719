-- How many rows of nodelane_nonces each node holds, at least (as on
-- PostgreSQL, where the table already locked a node's inserts): Insert
-- adds one to it, and the nonce's quota is counted only when it reaches
-- the quota (a node below it in rows is below it in live nonces); Collect
-- takes off what it deleted, after the delete commits. It never falls
-- below the rows held, so the quota stays exact while a node below it
-- pays no count.
CREATE TABLE IF NOT EXISTS nodelane_nonce_nodes (
    node_id TEXT NOT NULL PRIMARY KEY,
    rows_held BIGINT NOT NULL DEFAULT 0
);
--bun:split
INSERT INTO nodelane_nonce_nodes (node_id, rows_held)
SELECT node_id, count(*) FROM nodelane_nonces WHERE true GROUP BY node_id
ON CONFLICT (node_id) DO UPDATE SET rows_held = excluded.rows_held;
