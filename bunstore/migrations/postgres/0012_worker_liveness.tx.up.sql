-- The maintainer finds the live leases of offline workers (ExpireOffline):
-- the workers not seen since a cutoff, through this index, then their
-- live jobs through nodelane_jobs_worker_live_idx.
CREATE INDEX IF NOT EXISTS nodelane_workers_last_seen_idx ON nodelane_workers (last_seen_at);
