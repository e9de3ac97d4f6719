#!/bin/bash
# diag.sh BIN DB: one fleet run (2 min) of server BIN with -pprof-addr: a 30 s CPU profile and a
# goroutine dump once the fleet runs, /metrics at the end, the GC trace (GODEBUG=gctrace=1).
# Output in /tmp/fl/diag-BIN-DB/.
set -u
bin=$1 db=$2
tag=$(basename $bin)-$db
dir=/tmp/fl/diag-$tag; rm -rf $dir; mkdir -p $dir
ulimit -n 65536
if [ $db = pg ]; then
  name=lg_fleet_diag_$(basename $bin)
  psql -q -h 127.0.0.1 -p 5433 -U postgres -c "drop database if exists $name" -c "create database $name" >/dev/null
  dsn="postgres://postgres@127.0.0.1:5433/$name?sslmode=disable"; pgflags=(-pg "$dsn")
else
  dsn="sqlite:$dir/nodelane.db"; pgflags=()
fi
GODEBUG=gctrace=1 $bin -db "$dsn" -addr 127.0.0.1:18092 -max-conns 20000 -pprof-addr 127.0.0.1:16060 \
  -secrets-file $dir/secrets.json -tokens-file $dir/tokens.json -log-level warn >$dir/server.log 2>&1 &
spid=$!
for i in $(seq 100); do [ -s $dir/tokens.json ] && curl -s -o /dev/null http://127.0.0.1:18092/ && break; sleep 0.2; done
/tmp/fl/loadgen -server http://127.0.0.1:18092 -tokens-file $dir/tokens.json -mode fleet -nodes 10000 -long-polls 1000 \
  -heartbeat-interval 30s -duration 2m -server-pid $spid "${pgflags[@]}" > $dir/loadgen.txt 2>&1 &
lpid=$!
until grep -q registered $dir/loadgen.txt 2>/dev/null; do sleep 1; done
sleep 40 # the long-polls all begun, the heartbeats in their steady phase
uptime > $dir/uptime-profile.txt
go tool pprof -top -nodecount 60 "http://127.0.0.1:16060/debug/pprof/profile?seconds=30" > $dir/pprof-top.txt 2>&1
curl -s "http://127.0.0.1:16060/debug/pprof/goroutine?debug=1" > $dir/goroutines.txt
wait $lpid
curl -s http://127.0.0.1:18092/metrics > $dir/metrics.txt
kill $spid; wait $spid 2>/dev/null
[ $db = pg ] && psql -q -h 127.0.0.1 -p 5433 -U postgres -c "drop database if exists $name" >/dev/null
exit 0
