-- A guarded completion (lease.CompleteWrite): ?1 id, ?2 worker, ?3 token hash, ?4 now, ?5 default max runtime, and the
-- result's ?6 output URI, ?7 metrics, ?8 final message, ?9 receipt id. A job never ends before it started (lease's finish).
UPDATE nodelane_jobs AS j SET state = 'succeeded', finished_at = max(?4, j.accepted_at), rev = j.rev + 1,
  result_output_uri = ?6, result_metrics = ?7, result_final_message = ?8, receipt_id = COALESCE(NULLIF(?9, ''), j.receipt_id)
WHERE j.id = ?1 AND j.state = 'running' AND j.lease_worker_id = ?2 AND j.lease_token_hash = ?3 AND NOT j.cancel_requested
  AND j.lease_expires_at > ?4 AND j.accepted_at + CASE WHEN j.max_runtime_seconds > 0 THEN j.max_runtime_seconds * 1000000 ELSE ?5 END > ?4
RETURNING *
