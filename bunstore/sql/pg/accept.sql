-- Guarded accepts (lease.AcceptWrite), a column an array: id, worker, token hash, now, ttl, default max runtime.
UPDATE nodelane_jobs AS j SET state = 'running', accepted_at = b.now, rev = j.rev + 1,
  lease_expires_at = CASE WHEN j.cancel_requested THEN j.lease_expires_at
    ELSE b.now + LEAST(b.ttl, CASE WHEN j.max_runtime_seconds > 0 THEN j.max_runtime_seconds * 1000000 ELSE b.maxrt END) END
FROM unnest($1::text[], $2::text[], $3::bytea[], $4::bigint[], $5::bigint[], $6::bigint[]) AS b(id, w, th, now, ttl, maxrt)
WHERE j.id = b.id AND j.state = 'leased' AND j.lease_worker_id = b.w AND j.lease_token_hash = b.th
  AND j.lease_expires_at > b.now AND j.lease_accept_by > b.now
RETURNING j.*
