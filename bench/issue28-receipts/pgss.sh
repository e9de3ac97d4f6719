#!/bin/bash
# pgss.sh VARIANT: one PostgreSQL batched run of /tmp/rcb/nl-server-VARIANT (-check-receipts=false),
# then pg_stat_statements of its database by calls (pgss/VARIANT-*.txt were made with it).
v=$1; name=lg_receipts_pgss_$v; dir=/tmp/rcb/pgss-$v; rm -rf $dir; mkdir -p $dir
psql -q -h 127.0.0.1 -p 5433 -U postgres -c "drop database if exists $name" -c "create database $name" >/dev/null
dsn="postgres://postgres@127.0.0.1:5433/$name?sslmode=disable"
/tmp/rcb/nl-server-$v -db "$dsn" -addr 127.0.0.1:18281 -secrets-file $dir/s.json -tokens-file $dir/t.json -log-level warn >$dir/server.log 2>&1 &
spid=$!
for i in $(seq 50); do [ -s $dir/t.json ] && curl -s -o /dev/null http://127.0.0.1:18281/ && break; sleep 0.2; done
{ uptime; /tmp/rcb/lg -server http://127.0.0.1:18281 -tokens-file $dir/t.json -nodes 32 -jobs 3000 -flow batched -server-pid $spid -pg "$dsn" -check-receipts=false; } > $dir/out.txt 2>&1
psql -h 127.0.0.1 -p 5433 -U postgres -d $name -c "select calls, round(total_exec_time::numeric,0) ms, left(regexp_replace(query,'\s+',' ','g'),110) q from pg_stat_statements where dbid=(select oid from pg_database where datname='$name') order by calls desc limit 14" > $dir/pgss.txt
kill $spid; wait $spid 2>/dev/null
psql -q -h 127.0.0.1 -p 5433 -U postgres -c "drop database if exists $name" >/dev/null
