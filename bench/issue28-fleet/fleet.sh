#!/bin/bash
# fleet.sh BIN DB N [DURATION]: one fleet run (10,000 nodes, 1,000 idle long-polls) of the server
# binary BIN against a fresh database (pg: a database of its own on the private cluster 127.0.0.1:5433;
# sqlite: a file), on a fresh server. Output in /tmp/fl/out/BIN-DB-N.txt (BIN's base name).
set -u
bin=$1 db=$2 n=$3 dur=${4:-1m}
tag=$(basename $bin)-$db-$n
dir=/tmp/fl/run-$tag; rm -rf $dir; mkdir -p $dir /tmp/fl/out
ulimit -n 65536
if [ $db = pg ]; then
  name=lg_fleet_$(echo $tag | tr -c 'a-z0-9\n' _)
  psql -q -h 127.0.0.1 -p 5433 -U postgres -c "drop database if exists $name" -c "create database $name" >/dev/null
  psql -q -h 127.0.0.1 -p 5433 -U postgres -d $name -c "create extension if not exists pg_stat_statements" >/dev/null
  dsn="postgres://postgres@127.0.0.1:5433/$name?sslmode=disable"
  pgflags=(-pg "$dsn")
else
  dsn="sqlite:$dir/nodelane.db"
  pgflags=()
fi
GODEBUG=gctrace=1 $bin -db "$dsn" -addr 127.0.0.1:18091 -max-conns 20000 ${SERVER_FLAGS:-} \
  -secrets-file $dir/secrets.json -tokens-file $dir/tokens.json -log-level warn >$dir/server.log 2>&1 &
spid=$!
for i in $(seq 100); do [ -s $dir/tokens.json ] && curl -s -o /dev/null http://127.0.0.1:18091/ && break; sleep 0.2; done
{ echo "# $(date -u +%FT%TZ) bin=$bin db=$db run=$n; uptime: $(uptime)"
  timeout 900 /tmp/fl/loadgen -server http://127.0.0.1:18091 -tokens-file $dir/tokens.json -mode fleet \
    -nodes 10000 -long-polls 1000 -heartbeat-interval 30s -duration $dur -server-pid $spid "${pgflags[@]}"
  echo "# exit $?; uptime: $(uptime)"
  if [ $db = pg ]; then
    psql -h 127.0.0.1 -p 5433 -U postgres -d $name -c "select calls, round(total_exec_time::numeric,1) total_ms, round(mean_exec_time::numeric,3) mean_ms, left(regexp_replace(query, '\s+', ' ', 'g'), 160) query from pg_stat_statements where dbid = (select oid from pg_database where datname = current_database()) order by calls desc limit 25"
  fi
  echo "# gc: $(grep -c '^gc ' $dir/server.log) cycles; last: $(grep '^gc ' $dir/server.log | tail -1)"
} > /tmp/fl/out/$tag.txt 2>&1
kill $spid; wait $spid 2>/dev/null
[ $db = pg ] && psql -q -h 127.0.0.1 -p 5433 -U postgres -c "drop database if exists $name" >/dev/null
exit 0
