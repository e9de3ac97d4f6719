#!/bin/bash
# one.sh VARIANT DB FLOW N: one loadgen run against a fresh database, on a fresh server.
# VARIANT is before or after (the server binary /tmp/grp/srv-VARIANT). DB is pg or sqlite.
# Output in /tmp/grp/out/VARIANT-DB-FLOW-N.txt.
set -u
v=$1 db=$2 flow=$3 n=$4
dir=/tmp/grp/run-$v-$db-$flow-$n; rm -rf $dir; mkdir -p $dir /tmp/grp/out
if [ $db = pg ]; then
  name=lg_group_${v}_${flow}_$n
  psql -q -h 127.0.0.1 -p 5433 -U postgres -c "drop database if exists $name" -c "create database $name" >/dev/null
  dsn="postgres://postgres@127.0.0.1:5433/$name?sslmode=disable"
  pgflags=(-pg "$dsn")
else
  dsn="sqlite:$dir/nodelane.db"
  pgflags=()
fi
/tmp/grp/srv-$v -db "$dsn" -addr 127.0.0.1:18093 -secrets-file $dir/secrets.json -tokens-file $dir/tokens.json -log-level warn >$dir/server.log 2>&1 &
spid=$!
for i in $(seq 300); do [ -s $dir/tokens.json ] && curl -s -o /dev/null http://127.0.0.1:18093/ && break; sleep 0.2; done
out=/tmp/grp/out/$v-$db-$flow-$n.txt
{ echo "# $(date -u +%FT%TZ) server=$v db=$db flow=$flow run=$n; uptime: $(uptime)"
  timeout 600 /tmp/grp/lg -server http://127.0.0.1:18093 -tokens-file $dir/tokens.json -nodes 32 -jobs 3000 -flow $flow -server-pid $spid "${pgflags[@]}"
  echo "# exit $?"
  echo "# end uptime: $(uptime)"
  if [ $db = pg ]; then
    echo "# pg_stat_database: $(psql -At -h 127.0.0.1 -p 5433 -U postgres -c "select 'xact_commit='||xact_commit||' xact_rollback='||xact_rollback||' deadlocks='||deadlocks from pg_stat_database where datname='$name'")"
    psql -At -h 127.0.0.1 -p 5433 -U postgres -d $name -c "select calls, round(total_exec_time::numeric,1), left(regexp_replace(query,'\s+',' ','g'),90) from pg_stat_statements where dbid=(select oid from pg_database where datname='$name') order by calls desc limit 20" > /tmp/grp/out/$v-$db-$flow-$n.pgss
  fi
  echo "# server log lines: $(wc -l < $dir/server.log); 503s/aborted: $(grep -ci 'deadlock\|40P01\|40001\|aborted' $dir/server.log)"; } > $out 2>&1
kill $spid; wait $spid 2>/dev/null
if [ $db = pg ]; then psql -q -h 127.0.0.1 -p 5433 -U postgres -c "drop database if exists $name" >/dev/null; fi
