#!/bin/bash
# DB time per statement, before vs after, on the private cluster (5433, db lg_onepath only).
export NODELANE_TEST_POSTGRES='postgres://postgres@127.0.0.1:5433/lg_onepath?sslmode=disable' CI=true
P="psql -h 127.0.0.1 -p 5433 -U postgres -d lg_onepath -At"
bench='BenchmarkLeaseAcceptComplete/postgres/claimers=32/max_jobs=10/accept=lease'
for round in 1 2; do for v in before after; do
  $P -c "select pg_stat_statements_reset(0, (select oid from pg_database where datname='lg_onepath'), 0)" >/dev/null
  l=$(uptime | sed 's/.*average: //')
  out=$(cd /work/wt/onepath/bunstore && /usr/bin/time -f 'cpu %U user %S sys' /tmp/onepath/$v.test -test.run '^$' -test.bench "$bench" -test.benchtime 20000x 2>&1 | grep -E '^Benchmark|^cpu' | tr '\n' ' ')
  echo "== round $round $v load $l :: $out"
  $P -F ' | ' -c "select calls, round(total_exec_time::numeric,0) as ms, round(mean_exec_time::numeric,3) as mean, left(regexp_replace(query, '\s+', ' ', 'g'), 70) from pg_stat_statements where dbid=(select oid from pg_database where datname='lg_onepath') order by total_exec_time desc limit 6"
  $P -c "select 'total exec ms', round(sum(total_exec_time)::numeric,0) from pg_stat_statements where dbid=(select oid from pg_database where datname='lg_onepath') and query not like '%INSERT INTO%nodelane_jobs%' and query not like '%CREATE%'"
done; done
