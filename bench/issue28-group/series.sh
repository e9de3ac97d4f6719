#!/bin/bash
cd /tmp/grp
for n in 1 2 3; do for db in pg sqlite; do for flow in v02 batched; do for v in before after; do ./one.sh $v $db $flow $n 2>/dev/null; done; done; done; done
echo done > /tmp/grp/all.done
#!/bin/bash
cd /tmp/grp
for n in 1 2; do for flow in v02 batched; do for v in l4w0 l8w0 l16 before; do ./one.sh $v pg $flow $n 2>/dev/null; done; done; done
echo done > /tmp/grp/lanes.done
#!/bin/bash
cd /tmp/grp
for n in 1 2; do for flow in v02 batched; do for v in p4 before p8; do ./one.sh $v pg $flow $n 2>/dev/null; done; done; done
echo done > /tmp/grp/par.done
#!/bin/bash
cd /tmp/grp
for n in 1 2 3; do for flow in v02 batched; do for v in before p8 p16; do ./one.sh $v pg $flow $n 2>/dev/null; done; done; done
echo done > /tmp/grp/final.done
#!/bin/bash
cd /tmp/grp
for flow in v02 batched; do for v in before p8 p16; do ./one.sh $v pg $flow 4 2>/dev/null; done; done
for v in before p8 p16; do ./one.sh $v pg v02 1 2>/dev/null; done
echo done > /tmp/grp/extra.done
#!/bin/bash
cd /tmp/grp
while [ ! -e /tmp/grp/extra.done ]; do sleep 5; done
for n in 1 2; do for flow in v02 batched; do for v in before final; do ./one.sh $v sqlite $flow $n 2>/dev/null; done; done; done
echo done > /tmp/grp/sq.done
