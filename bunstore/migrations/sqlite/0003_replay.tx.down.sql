DROP TABLE IF EXISTS nodelane_nonces;
