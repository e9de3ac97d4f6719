#!/bin/bash
# alternate before/after bunstore benches
export NODELANE_TEST_POSTGRES='postgres://postgres@127.0.0.1:5432/test?sslmode=disable' CI=true
cd /work/wt/onepath/bunstore
for round in 1 2 3; do
  for v in before after; do
    for b in 'postgres/claimers=32/max_jobs=10/accept=lease' 'postgres/claimers=32/max_jobs=10/accept=call' 'postgres/claimers=1$/max_jobs=1$/accept=call' 'sqlite/claimers=32/max_jobs=10/accept=lease' 'sqlite/claimers=1$/max_jobs=1$/accept=call'; do
      n=10000; case $b in *claimers=1/*) n=2000;; esac
      load=$(uptime | sed 's/.*load average[s]*: *//')
      out=$(/tmp/onepath/$v.test -test.run '^$' -test.bench "BenchmarkLeaseAcceptComplete/$b\$" -test.benchtime ${n}x -test.count 1 2>&1 | grep '^BenchmarkLeaseAcceptComplete/')
      echo "round=$round $v load=[$load] $out"
    done
  done
done
