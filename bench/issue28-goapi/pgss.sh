#!/bin/bash
# Database executor time per job, River's burn-down beside nodelane's Go-API
# burn-down (Lease with accept, then Complete; K=32, B=10), from
# pg_stat_statements on a private cluster (PORT, default 5433, with
# shared_preload_libraries = 'pg_stat_statements'). Alternated, ROUNDS
# rounds. Needs /tmp/riverb (go build -o /tmp/riverb in
# ../shared/bench/river) and /tmp/bs.test (go test -c -o /tmp/bs.test
# ./bunstore).
set -u
PORT=${PORT:-5433}
ROUNDS=${ROUNDS:-3}
N=${N:-20000}
root=$(cd "$(dirname "$0")/../.." && pwd)
P="psql -h 127.0.0.1 -p $PORT -U postgres -At"
for db in test riverbench; do $P -d postgres -c "create database $db" >/dev/null 2>&1; done
bench='BenchmarkLeaseAcceptComplete/postgres/claimers=32/max_jobs=10/accept=lease'
total() { # total() DB WHERE: executor ms of the drain's statements
	$P -d "$1" -c "select round(sum(total_exec_time)::numeric,1) from pg_stat_statements where dbid=(select oid from pg_database where datname='$1') and $2"
}
for round in $(seq 1 "$ROUNDS"); do
	$P -d riverbench -c "select pg_stat_statements_reset()" >/dev/null
	r=$(/tmp/riverb -db "postgres://postgres@127.0.0.1:$PORT/riverbench?sslmode=disable" -n "$N" 2>&1 | grep jobs_per_s)
	rms=$(total riverbench "(query like '%JobSetStateIfRunningMany%' or query like '%JobGetAvailable%')")
	echo "round $round river: $r exec_ms=$rms us_per_job=$(echo "scale=1; $rms*1000/$N" | bc) load=$(cut -d' ' -f1 /proc/loadavg)"
	$P -d test -c "select pg_stat_statements_reset()" >/dev/null
	n=$(cd "$root/bunstore" && NODELANE_TEST_POSTGRES="postgres://postgres@127.0.0.1:$PORT/test?sslmode=disable" CI=true \
		/tmp/bs.test -test.run '^$' -test.bench "$bench" -test.benchtime "${N}x" -test.count 1 2>&1 | grep jobs/s | awk '{for(i=1;i<=NF;i++) if($i=="jobs/s") print $(i-1)}')
	nms=$(total test "(query like '%The claim (lease.LeaseClaim)%' or query like '%Guarded completions%' or query like '%The workers of a claim%' or query like '%The advisory locks%')")
	echo "round $round nodelane: jobs_per_s=$n exec_ms=$nms us_per_job=$(echo "scale=1; $nms*1000/$N" | bc) load=$(cut -d' ' -f1 /proc/loadavg)"
done
