#!/bin/bash
# diag.sh: the regression's diagnosis on SQLite, alternated: main as it is
# (base) and main with the sequencer's transaction at synchronous=NORMAL
# like every other (nofull), both flows, 3 rounds.
cd $(dirname $0)
for n in 1 2 3; do for flow in v02 batched; do for v in base nofull; do ./one.sh $v sqlite $flow $n; done; done; done
echo done > /tmp/rcb/diag.done
