DROP TABLE IF EXISTS nodelane_workers;
--bun:split
DROP TABLE IF EXISTS nodelane_artifacts;
--bun:split
DROP TABLE IF EXISTS nodelane_job_events;
--bun:split
DROP TABLE IF EXISTS nodelane_jobs;
