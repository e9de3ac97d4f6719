#!/bin/bash
# bench/burndown.sh's runs, with two nodelane binaries (before, after) alternated with River each round.
set -u
export NODELANE_TEST_POSTGRES='postgres://postgres@127.0.0.1:5432/test?sslmode=disable' CI=true
export PATH=/usr/local/go/bin:$PATH
RIVER_DIR=/work/shared/bench/river
RIVER_DB='postgres://postgres@127.0.0.1:5432/riverbench?sslmode=disable'
(cd $RIVER_DIR && go build -o /tmp/onepath/river .)
bench='BenchmarkLeaseAcceptComplete/postgres/claimers=32/max_jobs=10/accept=lease'
loadavg() { uptime | sed 's/.*load average[s]*: *//'; }
for round in 1 2 3; do
  l=$(loadavg); jps=$(cd $RIVER_DIR && /tmp/onepath/river -db "$RIVER_DB" -n 20000 2>&1 | sed -n 's/.*jobs_per_s=\([0-9.]*\).*/\1/p')
  echo "round $round river $jps jobs/s load $l"
  for v in ${ORDER:-before after}; do
    l=$(loadavg); out=$(cd /work/wt/onepath/bunstore && /tmp/onepath/$v.test -test.run '^$' -test.bench "$bench" -test.benchtime 20000x -test.count 1 2>&1 | grep '^BenchmarkLeaseAcceptComplete/')
    echo "round $round $v load $l :: $out"
  done
done
