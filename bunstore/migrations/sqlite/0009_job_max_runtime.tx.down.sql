ALTER TABLE nodelane_jobs DROP COLUMN max_runtime_seconds;
