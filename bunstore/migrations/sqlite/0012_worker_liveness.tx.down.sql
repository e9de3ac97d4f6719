DROP INDEX IF EXISTS nodelane_workers_last_seen_idx;
