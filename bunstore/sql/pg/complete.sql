-- Guarded completions (lease.CompleteWrite), a column an array: id, worker, token hash, now, default max runtime, and the
-- result's output URI, metrics, final message and receipt id. A job never ends before it started (lease's finish).
UPDATE nodelane_jobs AS j SET state = 'succeeded', finished_at = GREATEST(b.now, j.accepted_at), rev = j.rev + 1,
  result_output_uri = b.uri, result_metrics = b.metrics, result_final_message = b.msg, receipt_id = COALESCE(NULLIF(b.rcpt, ''), j.receipt_id)
FROM unnest($1::text[], $2::text[], $3::bytea[], $4::bigint[], $5::bigint[], $6::text[], $7::text[], $8::text[], $9::text[])
  AS b(id, w, th, now, maxrt, uri, metrics, msg, rcpt)
WHERE j.id = b.id AND j.state = 'running' AND j.lease_worker_id = b.w AND j.lease_token_hash = b.th AND NOT j.cancel_requested
  AND j.lease_expires_at > b.now AND j.accepted_at + CASE WHEN j.max_runtime_seconds > 0 THEN j.max_runtime_seconds * 1000000 ELSE b.maxrt END > b.now
RETURNING j.*
