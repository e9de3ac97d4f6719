-- The replay package's nonces: one row per (node, nonce) until its
-- signature expires (expires_at, unix microseconds, UTC). A row that has
-- expired is dead: Insert may replace it, Collect deletes it.
CREATE TABLE IF NOT EXISTS nodelane_nonces (
    node_id    TEXT   COLLATE "C" NOT NULL,
    nonce      TEXT   COLLATE "C" NOT NULL,
    expires_at BIGINT NOT NULL,
    PRIMARY KEY (node_id, nonce)
);
--bun:split
-- The quota counts a node's live nonces with an index-only scan.
CREATE INDEX IF NOT EXISTS nodelane_nonces_node_expiry_idx ON nodelane_nonces (node_id, expires_at);
--bun:split
-- Collect deletes in expiry order.
CREATE INDEX IF NOT EXISTS nodelane_nonces_expiry_idx ON nodelane_nonces (expires_at);
