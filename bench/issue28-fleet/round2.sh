#!/bin/bash
# round2.sh: 3 more rounds on PostgreSQL, alternated: /tmp/fl/sb (main) and /tmp/fl/sc (this branch
# with the credential check from memory, commit after the runs of all.sh).
cd "$(dirname "$0")"
for n in 4 5 6; do
  for bin in /tmp/fl/sb /tmp/fl/sc; do
    ./fleet.sh $bin pg $n 1m
  done
done
# Then, when the machine fell quiet (load 0.2 at 17:50), one more pair each way round:
# ./fleet.sh /tmp/fl/sc pg 7 1m; ./fleet.sh /tmp/fl/sb pg 7 1m; ./fleet.sh /tmp/fl/sb pg 8 1m; ./fleet.sh /tmp/fl/sc pg 8 1m
