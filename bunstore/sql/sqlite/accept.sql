-- A guarded accept (lease.AcceptWrite): ?1 id, ?2 worker, ?3 token hash, ?4 now, ?5 ttl, ?6 default max runtime.
UPDATE nodelane_jobs AS j SET state = 'running', accepted_at = ?4, rev = j.rev + 1,
  lease_expires_at = CASE WHEN j.cancel_requested THEN j.lease_expires_at
    ELSE ?4 + min(?5, CASE WHEN j.max_runtime_seconds > 0 THEN j.max_runtime_seconds * 1000000 ELSE ?6 END) END
WHERE j.id = ?1 AND j.state = 'leased' AND j.lease_worker_id = ?2 AND j.lease_token_hash = ?3
  AND j.lease_expires_at > ?4 AND j.lease_accept_by > ?4
RETURNING *
