ALTER TABLE nodelane_nonce_nodes DROP COLUMN IF EXISTS rows_held;
