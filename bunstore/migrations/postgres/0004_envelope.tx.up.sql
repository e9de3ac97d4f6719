-- The envelope package's tables. Times are unix microseconds (UTC).
-- nodelane_envelope holds the current state in its one row (id 1), which
-- the first change inserts: until then the state is the initial one
-- (policy version 1, inactive). deadline is NULL for an activation
-- without one. "by" is a keyword, so the operator's column is actor.
-- No column has a DEFAULT: bun writes a nil pointer as DEFAULT on
-- PostgreSQL, and that must mean NULL.
CREATE TABLE IF NOT EXISTS nodelane_envelope (
    id         BIGINT  NOT NULL PRIMARY KEY CHECK (id = 1),
    version    BIGINT  NOT NULL,
    active     BOOLEAN NOT NULL,
    actor      TEXT    NOT NULL,
    reason     TEXT    NOT NULL,
    deadline   BIGINT,
    changed_at BIGINT  NOT NULL
);
--bun:split
-- One row per change, keyed by the policy version it produced.
CREATE TABLE IF NOT EXISTS nodelane_envelope_history (
    version    BIGINT  NOT NULL PRIMARY KEY,
    action     TEXT    NOT NULL,
    actor      TEXT    NOT NULL,
    reason     TEXT    NOT NULL,
    deadline   BIGINT,
    changed_at BIGINT  NOT NULL
);
