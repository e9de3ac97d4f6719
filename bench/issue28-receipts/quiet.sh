#!/bin/bash
# quiet.sh: cmp.sh and hist.sh again when the box quietened (load 2-3 at
# 17:21 UTC): main (base) against this branch (new), SQLite and PostgreSQL,
# both flows, and issue 11's server (628a8f9) on SQLite v02; 3 rounds
# alternated, runs named q1-q3.
cd $(dirname $0)
for n in q1 q2 q3; do
  ./one.sh 628a8f9 sqlite v02 $n
  for db in sqlite pg; do for flow in v02 batched; do for v in base new; do ./one.sh $v $db $flow $n; done; done; done
done
echo done > /tmp/rcb/quiet.done
