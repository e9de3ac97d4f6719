-- A worker's approval by an operator (lease.Approval). A worker stored
-- before this migration is not pending and was never approved.
-- approved_at is unix microseconds, NULL if never approved; the pinned
-- job types and tags are JSON arrays written by encoding/json, kept as
-- TEXT (never jsonb), NULL when nothing is pinned. PutWorker never writes
-- these columns of a stored worker; SetApproval writes only them.
ALTER TABLE nodelane_workers
    ADD COLUMN IF NOT EXISTS approval_pending   BOOLEAN NOT NULL DEFAULT FALSE,
    ADD COLUMN IF NOT EXISTS approved_at        BIGINT,
    ADD COLUMN IF NOT EXISTS approved_by        TEXT    NOT NULL DEFAULT '',
    ADD COLUMN IF NOT EXISTS approval_reason    TEXT    NOT NULL DEFAULT '',
    ADD COLUMN IF NOT EXISTS approved_job_types TEXT,
    ADD COLUMN IF NOT EXISTS approved_tags      TEXT;
