-- The workers of a claim ($1) with the count of their live leases.
SELECT w.*, (SELECT count(*) FROM nodelane_jobs AS j WHERE j.lease_worker_id = w.id AND j.state IN ('leased', 'running')) AS live
FROM nodelane_workers AS w WHERE w.id = ANY($1::text[])
