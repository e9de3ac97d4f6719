#!/bin/bash
# all.sh: the loadgen runs of bench/issue28-final, 3 rounds, the order of the
# variants rotated each round (the second run of a pair measured slower in
# this session, whatever ran first). Each run is ../issue28-receipts/one.sh
# (a fresh database and server; loadgen -nodes 32 -jobs 3000). Binaries:
# /tmp/rcb/nl-server-base (main at the start of the session) and
# /tmp/rcb/nl-server-final (this commit), loadgen /tmp/rcb/lg (this commit).
# Variants: base and final dispatch one job a request (POST /operator/jobs);
# final_b25 25 a request (POST /operator/jobs/batch); final_r1000 10 a request
# at 1,000 jobs a second (-rate), for the latencies below capacity.
# Outputs in /tmp/rcb/out, copied to out/; table: python3 ../issue28-before/table.py out.
set -u
cd "$(dirname "$0")/../issue28-receipts"
rm -rf /tmp/rcb/out
flags() {
  case $1 in
  final_b25) echo -dispatch-batch 25 ;;
  final_r1000) echo -dispatch-batch 10 -rate 1000 ;;
  esac
}
variants=(base final final_b25)
for r in 1 2 3; do
  for c in "pg batched" "pg v02" "sqlite batched" "sqlite v02"; do
    set -- $c
    for k in 0 1 2; do
      v=${variants[$(((k + r) % 3))]}
      bash one.sh $v $1 $2 $r $(flags $v) 2>/dev/null
    done
  done
  bash one.sh final_r1000 pg batched $r $(flags final_r1000) 2>/dev/null
  bash one.sh final_r1000 sqlite batched $r $(flags final_r1000) 2>/dev/null
done
rm -rf ../issue28-final/out && cp -r /tmp/rcb/out ../issue28-final/out
