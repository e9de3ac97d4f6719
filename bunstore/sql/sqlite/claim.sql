-- The claim (lease.LeaseClaim): ?6 candidates in claim order, walking the queued index, the k-th given the k-th lease of ?7
-- (JSON [{lid, w, dsku, th (hex), now, exp, acc, pv, ak, maxrt}]). ?1 prices as JSON [{w, sku, price}]; ?2 types (JSON);
-- ?3 now; ?4 fits (JSON [{sku, gpus, vram}]); ?5 tags (JSON). SQLite has one writer: nothing to lock.
UPDATE nodelane_jobs AS j SET state = CASE WHEN b.ak THEN 'running' ELSE 'leased' END, leased_at = b.now,
  accepted_at = CASE WHEN b.ak THEN b.now END, lease_id = b.lid, lease_job_id = j.id, lease_worker_id = b.w,
  lease_epoch = COALESCE(j.lease_epoch, 0) + 1, lease_token_hash = unhex(b.th), lease_accept_by = b.acc, lease_policy_version = b.pv,
  lease_expires_at = CASE WHEN b.ak THEN min(b.exp, b.now + CASE WHEN j.max_runtime_seconds > 0 THEN j.max_runtime_seconds * 1000000 ELSE b.maxrt END) ELSE b.exp END,
  lease_sku = CASE WHEN j.gpu_sku <> '' THEN j.gpu_sku ELSE b.dsku END,
  lease_price_micro_usd = COALESCE((SELECT p.value ->> 'price' FROM json_each(?1) AS p WHERE p.value ->> 'w' = b.w
    AND p.value ->> 'sku' = CASE WHEN j.gpu_sku <> '' THEN j.gpu_sku ELSE b.dsku END), 0),
  rev = j.rev + 1
FROM (SELECT c.value AS id, l.value ->> 'lid' AS lid, l.value ->> 'w' AS w, l.value ->> 'dsku' AS dsku, l.value ->> 'th' AS th,
    l.value ->> 'now' AS now, l.value ->> 'exp' AS exp, l.value ->> 'acc' AS acc, l.value ->> 'pv' AS pv, l.value ->> 'ak' AS ak,
    l.value ->> 'maxrt' AS maxrt
  FROM json_each((SELECT json_group_array(id) FROM (SELECT id FROM nodelane_jobs INDEXED BY nodelane_jobs_queued_idx
    WHERE state = 'queued' AND type IN (SELECT value FROM json_each(?2)) AND scheduled_at <= ?3
      AND EXISTS (SELECT 1 FROM json_each(?4) AS f WHERE gpu_sku = f.value ->> 'sku' AND gpu_count <= f.value ->> 'gpus'
        AND min_vram_mb <= f.value ->> 'vram')
      AND (tags = '' OR NOT EXISTS (SELECT 1 FROM json_each(NULLIF(tags, '')) AS t WHERE t.value NOT IN (SELECT value FROM json_each(?5))))
    ORDER BY priority DESC, created_at, id LIMIT ?6))) AS c
  JOIN json_each(?7) AS l ON l.key = c.key) AS b
WHERE j.id = b.id RETURNING *
