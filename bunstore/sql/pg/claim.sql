-- The claim (lease.LeaseClaim): $8 candidates locked in claim order, the k-th given the k-th lease ($9 to $18, a column an
-- array). $1 prices as JSON [{w, sku, price}]; $2 types; $3 now; $4 to $6 fits (sku, gpus, vram); $7 tags (JSON array).
WITH p AS MATERIALIZED (SELECT * FROM json_to_recordset($1::json) AS p(w text, sku text, price bigint))
UPDATE nodelane_jobs AS j SET state = CASE WHEN b.ak THEN 'running' ELSE 'leased' END, leased_at = b.now,
  accepted_at = CASE WHEN b.ak THEN b.now END, lease_id = b.lid, lease_job_id = j.id, lease_worker_id = b.w,
  lease_epoch = COALESCE(j.lease_epoch, 0) + 1, lease_token_hash = b.th, lease_accept_by = b.acc, lease_policy_version = b.pv,
  lease_expires_at = CASE WHEN b.ak THEN LEAST(b.exp, b.now + CASE WHEN j.max_runtime_seconds > 0 THEN j.max_runtime_seconds * 1000000 ELSE b.maxrt END) ELSE b.exp END,
  lease_sku = CASE WHEN j.gpu_sku <> '' THEN j.gpu_sku ELSE b.dsku END,
  lease_price_micro_usd = COALESCE((SELECT p.price FROM p WHERE p.w = b.w AND p.sku = CASE WHEN j.gpu_sku <> '' THEN j.gpu_sku ELSE b.dsku END), 0),
  rev = j.rev + 1
FROM unnest(ARRAY(SELECT id FROM nodelane_jobs WHERE state = 'queued' AND type = ANY($2::text[]) AND scheduled_at <= $3
    AND (SELECT bool_or(gpu_sku = f.sku AND gpu_count <= f.gpus AND min_vram_mb <= f.vram)
      FROM unnest($4::text[], $5::bigint[], $6::bigint[]) AS f(sku, gpus, vram)) -- a filter, not a join: the walk stays in order
    AND (tags = '' OR NULLIF(tags, '')::jsonb <@ $7::jsonb)
    ORDER BY priority DESC, created_at, id LIMIT $8 FOR UPDATE SKIP LOCKED),
  $9::text[], $10::text[], $11::text[], $12::bytea[], $13::bigint[], $14::bigint[], $15::bigint[], $16::bigint[], $17::boolean[], $18::bigint[])
  AS b(id, lid, w, dsku, th, now, exp, acc, pv, ak, maxrt)
WHERE j.id = b.id RETURNING j.*
