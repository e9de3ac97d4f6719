#!/bin/bash
# round2.sh: 3 more rounds on PostgreSQL, alternated: /tmp/fl/sb (main) and /tmp/fl/sc (this branch
# with the credential check from memory, commit after the runs of all.sh).
cd "$(dirname "$0")"
for n in 4 5 6; do
  for bin in /tmp/fl/sb /tmp/fl/sc; do
    ./fleet.sh $bin pg $n 1m
  done
done
