-- An operator's request that a worker drain (lease.Worker.Drain): it is
-- granted no job while it stands, and its signals and heartbeat answers
-- carry drain: true. drain_requested_at is unix microseconds, NULL when
-- no drain is requested. PutWorker never writes these columns of a
-- stored worker; SetDrain writes only them.
ALTER TABLE nodelane_workers
    ADD COLUMN IF NOT EXISTS drain_requested_at BIGINT,
    ADD COLUMN IF NOT EXISTS drain_requested_by TEXT NOT NULL DEFAULT '';
