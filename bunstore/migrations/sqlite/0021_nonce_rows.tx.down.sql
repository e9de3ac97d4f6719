DROP TABLE IF EXISTS nodelane_nonce_nodes;
