-- A worker's approval by an operator (lease.Approval). A worker stored
-- before this migration is not pending and was never approved.
-- approved_at is unix microseconds, NULL if never approved; the pinned
-- job types and tags are JSON arrays written by encoding/json, NULL when
-- nothing is pinned. PutWorker never writes these columns of a stored
-- worker; SetApproval writes only them.
ALTER TABLE nodelane_workers ADD COLUMN approval_pending INTEGER NOT NULL DEFAULT 0;
--bun:split
ALTER TABLE nodelane_workers ADD COLUMN approved_at INTEGER;
--bun:split
ALTER TABLE nodelane_workers ADD COLUMN approved_by TEXT NOT NULL DEFAULT '';
--bun:split
ALTER TABLE nodelane_workers ADD COLUMN approval_reason TEXT NOT NULL DEFAULT '';
--bun:split
ALTER TABLE nodelane_workers ADD COLUMN approved_job_types TEXT;
--bun:split
ALTER TABLE nodelane_workers ADD COLUMN approved_tags TEXT;
