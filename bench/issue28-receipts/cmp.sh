#!/bin/bash
# cmp.sh: main (base) against this branch (new: completions answered at
# once; new_wait: loadgen -wait-for-proofs), SQLite and PostgreSQL, both
# flows, 3 rounds alternated.
cd $(dirname $0)
for n in 1 2 3; do for db in sqlite pg; do for flow in v02 batched; do
  ./one.sh base $db $flow $n
  ./one.sh new $db $flow $n
  ./one.sh new_wait $db $flow $n -wait-for-proofs
done; done; done
echo done > /tmp/rcb/cmp.done
