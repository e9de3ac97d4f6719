ALTER TABLE nodelane_workers
    DROP COLUMN IF EXISTS drain_requested_by,
    DROP COLUMN IF EXISTS drain_requested_at;
