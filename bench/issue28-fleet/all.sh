#!/bin/bash
# all.sh: 3 rounds of {before, after} fleet runs on PostgreSQL, alternated, then SQLite likewise.
# /tmp/fl/sb is cmd/server built at main (81eb475), /tmp/fl/sa at this branch; loadgen is main's.
cd "$(dirname "$0")"
for db in ${DBS:-pg sqlite}; do
  for n in 1 2 3; do
    for bin in /tmp/fl/sb /tmp/fl/sa; do
      ./fleet.sh $bin $db $n 1m
    done
  done
done
