DROP INDEX IF EXISTS nodelane_jobs_ended_idx;
