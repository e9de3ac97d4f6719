-- The replay package's nonces: one row per (node, nonce) until its
-- signature expires (expires_at, unix microseconds, UTC). A row that has
-- expired is dead: Insert may replace it, Collect deletes it. WITHOUT
-- ROWID keeps the rows in the primary key's b-tree, with no second one.
CREATE TABLE IF NOT EXISTS nodelane_nonces (
    node_id    TEXT    NOT NULL,
    nonce      TEXT    NOT NULL,
    expires_at INTEGER NOT NULL,
    PRIMARY KEY (node_id, nonce)
) STRICT, WITHOUT ROWID;
--bun:split
-- The quota counts a node's live nonces from this index alone.
CREATE INDEX IF NOT EXISTS nodelane_nonces_node_expiry_idx ON nodelane_nonces (node_id, expires_at);
--bun:split
-- Collect deletes in expiry order.
CREATE INDEX IF NOT EXISTS nodelane_nonces_expiry_idx ON nodelane_nonces (expires_at);
