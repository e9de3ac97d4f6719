-- The envelope package's tables. Times are unix microseconds (UTC).
-- nodelane_envelope holds the current state in its one row (id 1), which
-- the first change inserts: until then the state is the initial one
-- (policy version 1, inactive). deadline is NULL for an activation
-- without one. "by" is a keyword, so the operator's column is actor.
CREATE TABLE IF NOT EXISTS nodelane_envelope (
    id         INTEGER NOT NULL PRIMARY KEY CHECK (id = 1),
    version    INTEGER NOT NULL,
    active     INTEGER NOT NULL,
    actor      TEXT    NOT NULL,
    reason     TEXT    NOT NULL,
    deadline   INTEGER,
    changed_at INTEGER NOT NULL
) STRICT;
--bun:split
-- One row per change, keyed by the policy version it produced.
CREATE TABLE IF NOT EXISTS nodelane_envelope_history (
    version    INTEGER NOT NULL PRIMARY KEY,
    action     TEXT    NOT NULL,
    actor      TEXT    NOT NULL,
    reason     TEXT    NOT NULL,
    deadline   INTEGER,
    changed_at INTEGER NOT NULL
) STRICT;
