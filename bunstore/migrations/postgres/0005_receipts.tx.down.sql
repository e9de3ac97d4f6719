DROP TABLE IF EXISTS nodelane_receipt_checkpoints;
--bun:split
DROP TABLE IF EXISTS nodelane_receipt_tree;
--bun:split
DROP TABLE IF EXISTS nodelane_receipt_hashes;
--bun:split
DROP TABLE IF EXISTS nodelane_receipts;
