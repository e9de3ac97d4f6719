-- The lease package's tables. Times are unix microseconds (UTC); NULL in a
-- nullable time means unset. A group of columns that maps to an optional
-- struct (lease_*, last_error_*, result_*) is absent when its first column
-- (lease_id, last_error_code, result_output_uri) is NULL.
CREATE TABLE IF NOT EXISTS nodelane_jobs (
    id                    TEXT    NOT NULL PRIMARY KEY,
    type                  TEXT    NOT NULL,
    payload               TEXT,
    gpu_sku               TEXT    NOT NULL,
    gpu_count             INTEGER NOT NULL,
    min_vram_mb           INTEGER NOT NULL,
    priority              INTEGER NOT NULL,
    max_attempts          INTEGER NOT NULL,
    state                 TEXT    NOT NULL,
    attempt               INTEGER NOT NULL,
    created_at            INTEGER NOT NULL,
    scheduled_at          INTEGER NOT NULL,
    leased_at             INTEGER,
    accepted_at           INTEGER,
    finished_at           INTEGER,
    receipt_id            TEXT    NOT NULL,
    cancel_requested      INTEGER NOT NULL,
    last_error_code       TEXT,
    last_error_message    TEXT,
    last_error_payload    TEXT,
    last_error_attempt    INTEGER,
    last_error_at         INTEGER,
    result_output_uri     TEXT,
    result_metrics        TEXT,
    result_final_message  TEXT,
    lease_id              TEXT,
    lease_job_id          TEXT,
    lease_worker_id       TEXT,
    lease_epoch           INTEGER,
    lease_token_hash      BLOB,
    lease_expires_at      INTEGER,
    lease_accept_by       INTEGER,
    lease_sku             TEXT,
    lease_price_micro_usd INTEGER,
    lease_policy_version  INTEGER,
    rev                   INTEGER NOT NULL
) STRICT;
--bun:split
-- Claims scan queued jobs in claim order.
CREATE INDEX IF NOT EXISTS nodelane_jobs_queued_idx
    ON nodelane_jobs (priority DESC, created_at, id) WHERE state = 'queued';
--bun:split
-- The maintainer looks for expired leases and missed accept deadlines.
CREATE INDEX IF NOT EXISTS nodelane_jobs_expiry_idx ON nodelane_jobs (state, lease_expires_at);
--bun:split
CREATE INDEX IF NOT EXISTS nodelane_jobs_accept_idx
    ON nodelane_jobs (lease_accept_by) WHERE state = 'leased';
--bun:split
-- A worker's live leases (MaxActive, ListJobs by worker).
CREATE INDEX IF NOT EXISTS nodelane_jobs_worker_live_idx
    ON nodelane_jobs (lease_worker_id, id) WHERE state IN ('leased', 'running');
--bun:split
CREATE INDEX IF NOT EXISTS nodelane_jobs_state_idx ON nodelane_jobs (state, id);
--bun:split
CREATE TABLE IF NOT EXISTS nodelane_job_events (
    id         INTEGER NOT NULL PRIMARY KEY AUTOINCREMENT,
    job_id     TEXT    NOT NULL,
    kind       TEXT    NOT NULL,
    epoch      INTEGER NOT NULL,
    type       TEXT    NOT NULL,
    message    TEXT    NOT NULL,
    payload    TEXT,
    seq        INTEGER NOT NULL,
    created_at INTEGER NOT NULL
) STRICT;
--bun:split
CREATE INDEX IF NOT EXISTS nodelane_job_events_job_idx ON nodelane_job_events (job_id, id);
--bun:split
-- A log line's seq is stored once per job; status events are never deduplicated.
CREATE UNIQUE INDEX IF NOT EXISTS nodelane_job_events_log_seq_key
    ON nodelane_job_events (job_id, seq) WHERE kind = 'log';
--bun:split
CREATE TABLE IF NOT EXISTS nodelane_artifacts (
    id         TEXT    NOT NULL PRIMARY KEY,
    job_id     TEXT    NOT NULL,
    worker_id  TEXT    NOT NULL,
    epoch      INTEGER NOT NULL,
    type       TEXT    NOT NULL,
    name       TEXT    NOT NULL,
    uri        TEXT    NOT NULL,
    sha256     TEXT    NOT NULL,
    size_bytes INTEGER NOT NULL,
    metadata   TEXT,
    receipt_id TEXT    NOT NULL,
    created_at INTEGER NOT NULL
) STRICT;
--bun:split
CREATE INDEX IF NOT EXISTS nodelane_artifacts_job_idx ON nodelane_artifacts (job_id, id);
--bun:split
-- tags and capabilities are JSON written by encoding/json.
CREATE TABLE IF NOT EXISTS nodelane_workers (
    id                 TEXT    NOT NULL PRIMARY KEY,
    node_id            TEXT    NOT NULL,
    name               TEXT    NOT NULL,
    hostname           TEXT    NOT NULL,
    endpoint_url       TEXT    NOT NULL,
    role               TEXT    NOT NULL,
    tags               TEXT    NOT NULL,
    version            TEXT    NOT NULL,
    heartbeat_interval INTEGER NOT NULL,
    capabilities       TEXT    NOT NULL,
    max_jobs           INTEGER NOT NULL,
    max_vram_mb        INTEGER NOT NULL,
    policy_version     INTEGER NOT NULL,
    status             TEXT    NOT NULL,
    metrics            TEXT,
    registered_at      INTEGER NOT NULL,
    last_seen_at       INTEGER NOT NULL
) STRICT;
--bun:split
CREATE UNIQUE INDEX IF NOT EXISTS nodelane_workers_node_key ON nodelane_workers (node_id);
