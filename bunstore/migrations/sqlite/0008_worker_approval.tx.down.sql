ALTER TABLE nodelane_workers DROP COLUMN approved_tags;
--bun:split
ALTER TABLE nodelane_workers DROP COLUMN approved_job_types;
--bun:split
ALTER TABLE nodelane_workers DROP COLUMN approval_reason;
--bun:split
ALTER TABLE nodelane_workers DROP COLUMN approved_by;
--bun:split
ALTER TABLE nodelane_workers DROP COLUMN approved_at;
--bun:split
ALTER TABLE nodelane_workers DROP COLUMN approval_pending;
