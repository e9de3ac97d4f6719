#!/bin/bash
# sync.sh: the fsyncs of the server per job on SQLite (strace -c), main
# (base), main with the sequencer's transaction at NORMAL (nofull) and this
# branch (new: completions answered at once; new_wait: they wait for
# proofs), both flows, one round (a second was stopped: the box was at load 20-28).
cd $(dirname $0)
for n in s1; do for flow in v02 batched; do for v in base nofull new new_wait; do
  f=(); [ $v = new_wait ] && f=(-wait-for-proofs)
  STRACE=1 ./one.sh $v sqlite $flow $n "${f[@]}"
done; done; done
echo done > /tmp/rcb/sync.done
