ALTER TABLE nodelane_workers
    DROP COLUMN IF EXISTS approved_tags,
    DROP COLUMN IF EXISTS approved_job_types,
    DROP COLUMN IF EXISTS approval_reason,
    DROP COLUMN IF EXISTS approved_by,
    DROP COLUMN IF EXISTS approved_at,
    DROP COLUMN IF EXISTS approval_pending;
