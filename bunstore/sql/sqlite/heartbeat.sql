-- A heartbeat (lease.HeartbeatStore), the worker's row and nothing else of it: ?1 seen at, ?2 status
-- ('' keeps it, and a retired worker stays retired: ?3), ?4 metrics (NULL keeps them), ?5 worker id.
UPDATE nodelane_workers SET last_seen_at = ?1,
  status = CASE WHEN ?2 = '' OR status = ?3 THEN status ELSE ?2 END,
  metrics = COALESCE(?4, metrics)
WHERE id = ?5 RETURNING *
