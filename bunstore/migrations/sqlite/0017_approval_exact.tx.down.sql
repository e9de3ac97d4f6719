ALTER TABLE nodelane_workers DROP COLUMN approval_exact;
