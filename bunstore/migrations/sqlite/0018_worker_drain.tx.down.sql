ALTER TABLE nodelane_workers DROP COLUMN drain_requested_by;
--bun:split
ALTER TABLE nodelane_workers DROP COLUMN drain_requested_at;
