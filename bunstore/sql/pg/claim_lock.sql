-- The advisory locks of the workers of a claim ($1, in id order) and the claim's planner settings (claim.go).
SELECT set_config('enable_sort', 'off', true), set_config('jit', 'off', true), set_config('enable_bitmapscan', 'off', true),
  set_config('enable_hashjoin', 'off', true), set_config('enable_mergejoin', 'off', true),
  (SELECT count(pg_advisory_xact_lock(hashtextextended('nodelane_claim:' || current_schema() || ':' || w, 0))) FROM unnest($1::text[]) AS w)
