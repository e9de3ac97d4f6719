-- Retention (lease.Store.DeleteEnded) deletes ended jobs oldest first: an
-- index on finished_at over ended jobs only reads each batch in order and
-- stops at its limit, however many jobs the table keeps. A job enters it
-- once, when it ends; queued and live jobs are not in it.
CREATE INDEX IF NOT EXISTS nodelane_jobs_ended_idx
    ON nodelane_jobs (finished_at) WHERE state IN ('succeeded', 'failed', 'canceled');
