-- The fingerprints' kind and id are keys, ordered and compared as bytes
-- (fingerprint.Store), as every other id column here: collate them as
-- "C", not as the database's default, which may be a language's. The
-- table holds a handful of rows.
ALTER TABLE nodelane_secret_fingerprints
    ALTER COLUMN kind TYPE TEXT COLLATE "C",
    ALTER COLUMN id TYPE TEXT COLLATE "C";
