ALTER TABLE nodelane_workers DROP COLUMN IF EXISTS approval_exact;
