DROP TABLE IF EXISTS nodelane_secret_fingerprints;
