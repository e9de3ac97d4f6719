#!/bin/bash
for n in 1 2 3; do for db in pg sqlite; do for flow in v02 batched; do ./one.sh $db $flow $n; done; done; done
echo done > /tmp/lgb/all.done
