#!/bin/bash
# hist.sh: the SQLite v02 figure through the history, to find where it fell:
# 628a8f9 (issue 11's figures: 449 jobs/s), 44588e1 (just before the
# sequencer's synchronous=FULL), 2b648a9 (FULL), f5e6f11 (issues 12-15),
# 1028398 (issues 25-26), 8a3c640 (issue 27, the "before" of issue 28) and
# base (main today); 3 rounds alternated. Waits for cmp.sh first.
cd $(dirname $0)
while [ ! -e /tmp/rcb/cmp.done ]; do sleep 5; done
for n in 1 2 3; do for v in 628a8f9 44588e1 2b648a9 f5e6f11 1028398 8a3c640 base; do ./one.sh $v sqlite v02 h$n; done; done
echo done > /tmp/rcb/hist.done
