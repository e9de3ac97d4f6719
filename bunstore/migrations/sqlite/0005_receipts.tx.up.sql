-- The receipts package's tables (DESIGN §7). A receipt is written when it
-- is minted (idx NULL) and gets its log index when a sequencer integrates
-- it; seq is the mint order the sequencer follows. The Merkle tree lives
-- in nodelane_receipt_hashes (golang.org/x/mod/sumdb/tlog stored hashes,
-- by stored-hash index) and nodelane_receipt_tree (its one row is the
-- committed size and root). Signed checkpoints are kept for every size
-- published.
CREATE TABLE IF NOT EXISTS nodelane_receipts (
    seq  INTEGER NOT NULL PRIMARY KEY AUTOINCREMENT,
    id   TEXT    NOT NULL,
    kind TEXT    NOT NULL,
    idx  INTEGER,
    body BLOB    NOT NULL
) STRICT;
--bun:split
CREATE UNIQUE INDEX IF NOT EXISTS nodelane_receipts_id_key ON nodelane_receipts (id);
--bun:split
-- One receipt per log index; NULLs (not yet sequenced) do not collide.
CREATE UNIQUE INDEX IF NOT EXISTS nodelane_receipts_idx_key ON nodelane_receipts (idx);
--bun:split
-- The sequencer takes pending receipts in mint order.
CREATE INDEX IF NOT EXISTS nodelane_receipts_pending_idx ON nodelane_receipts (seq) WHERE idx IS NULL;
--bun:split
CREATE TABLE IF NOT EXISTS nodelane_receipt_hashes (
    idx  INTEGER NOT NULL PRIMARY KEY,
    hash BLOB    NOT NULL
) STRICT;
--bun:split
CREATE TABLE IF NOT EXISTS nodelane_receipt_tree (
    id        INTEGER NOT NULL PRIMARY KEY CHECK (id = 1),
    tree_size INTEGER NOT NULL,
    root_hash BLOB    NOT NULL
) STRICT;
--bun:split
-- The empty tree: size 0, root SHA-256 of nothing (RFC 6962).
INSERT INTO nodelane_receipt_tree (id, tree_size, root_hash)
VALUES (1, 0, X'e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855')
ON CONFLICT (id) DO NOTHING;
--bun:split
CREATE TABLE IF NOT EXISTS nodelane_receipt_checkpoints (
    tree_size INTEGER NOT NULL PRIMARY KEY,
    root_hash BLOB    NOT NULL,
    origin    TEXT    NOT NULL,
    note      TEXT    NOT NULL
) STRICT;
