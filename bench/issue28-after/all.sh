#!/bin/bash
# all.sh: the acceptance runs of issue 28, 3 rounds of {before, after, noshare} x {pg, sqlite} x
# {v02, batched}, alternated run by run (noshare on PostgreSQL only), through ../issue28-receipts/one.sh (one loadgen run, 32 nodes, 3,000 jobs, on a
# fresh server and database). Binaries:
#   (cd cmd && go build -o /tmp/rcb/nl-server-after ./server && go build -o /tmp/rcb/lg ./loadgen)
#   cmd/server of main 81eb475 (before this session) as /tmp/rcb/nl-server-before, and of this commit
#   with workerapi's sharedTx reduced to InTx (no shared transactions) as /tmp/rcb/nl-server-noshare.
# Outputs in /tmp/rcb/out/; table: python3 ../issue28-before/table.py DIR.
cd "$(dirname "$0")"
for n in 1 2 3; do for db in pg sqlite; do for flow in v02 batched; do
  vs="before after noshare"; [ $db = sqlite ] && vs="before after"
  for v in $vs; do ../issue28-receipts/one.sh $v $db $flow $n; done
done; done; done
