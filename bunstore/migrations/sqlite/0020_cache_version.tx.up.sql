-- The version of what the read cache keeps (cache.go): one row, whose
-- version every change of a credential, a principal or the envelope state
-- increments in its transaction. A DB serves its cached entries while the
-- version it last read is current, and reads it again at most once per
-- Config.CacheTTL, so that a change another process makes to the file is
-- seen. SQLite only: on PostgreSQL the changes are heard (NOTIFY), and
-- an increment would make every change of a cached entry wait for the
-- last one's commit.
CREATE TABLE IF NOT EXISTS nodelane_cache_version (
    id INTEGER PRIMARY KEY CHECK (id = 1),
    version BIGINT NOT NULL
);
--bun:split
INSERT INTO nodelane_cache_version (id, version) VALUES (1, 0) ON CONFLICT (id) DO NOTHING;
