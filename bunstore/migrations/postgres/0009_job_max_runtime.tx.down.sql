ALTER TABLE nodelane_jobs DROP COLUMN IF EXISTS max_runtime_seconds;
