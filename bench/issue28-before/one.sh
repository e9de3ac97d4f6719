#!/bin/bash
# one.sh DB FLOW N: one loadgen run against a fresh database, on a fresh server.
# DB is pg or sqlite. Output in /tmp/lgb/out/DB-FLOW-N.txt.
set -u
db=$1 flow=$2 n=$3
dir=/tmp/lgb/run-$db-$flow-$n; rm -rf $dir; mkdir -p $dir /tmp/lgb/out
if [ $db = pg ]; then
  name=lgb_${flow}_$n
  psql -q -h 127.0.0.1 -p 5433 -U postgres -c "drop database if exists $name" -c "create database $name" >/dev/null
  dsn="postgres://postgres@127.0.0.1:5433/$name?sslmode=disable"
  pgflags=(-pg "$dsn")
else
  dsn="sqlite:$dir/nodelane.db"
  pgflags=()
fi
/tmp/nl-server -db "$dsn" -addr 127.0.0.1:18081 -secrets-file $dir/secrets.json -tokens-file $dir/tokens.json -log-level warn >$dir/server.log 2>&1 &
spid=$!
for i in $(seq 50); do [ -s $dir/tokens.json ] && curl -s -o /dev/null http://127.0.0.1:18081/ && break; sleep 0.2; done
{ echo "# $(date -u +%FT%TZ) db=$db flow=$flow run=$n; uptime: $(uptime)"
  timeout 600 /tmp/lg-new -server http://127.0.0.1:18081 -tokens-file $dir/tokens.json -nodes 32 -jobs 3000 -flow $flow -server-pid $spid "${pgflags[@]}"
  echo "# exit $?"; } > /tmp/lgb/out/$db-$flow-$n.txt 2>&1
kill $spid; wait $spid 2>/dev/null
