ALTER TABLE nodelane_jobs DROP COLUMN tags;
