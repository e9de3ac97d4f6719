-- A job's requirements.max_runtime_seconds (lease.Requirements): how long
-- one lease may run from accept, 0 for the Manager's default. Existing
-- jobs keep the default. The DEFAULT only fills existing rows: bun writes
-- this int column as a value.
ALTER TABLE nodelane_jobs ADD COLUMN IF NOT EXISTS max_runtime_seconds BIGINT NOT NULL DEFAULT 0;
