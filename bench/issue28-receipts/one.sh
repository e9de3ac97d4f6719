#!/bin/bash
# one.sh VARIANT DB FLOW N [loadgen flags...]: one loadgen run of server binary
# /tmp/rcb/nl-server-BIN (BIN: VARIANT up to its first "_", so that new_wait
# runs nl-server-new) against a fresh database, on a fresh server.
# DB is pg (the private cluster on 127.0.0.1:5433) or sqlite (a file on /tmp).
# Output in /tmp/rcb/out/VARIANT-DB-FLOW-N.txt. Environment: STRACE=1 (below).
set -u
v=$1 db=$2 flow=$3 n=$4; shift 4
dir=/tmp/rcb/run-$v-$db-$flow-$n; rm -rf $dir; mkdir -p $dir /tmp/rcb/out
if [ $db = pg ]; then
  name=lg_receipts_${v//-/_}_${flow}_$n
  psql -q -h 127.0.0.1 -p 5433 -U postgres -c "drop database if exists $name" -c "create database $name" >/dev/null
  dsn="postgres://postgres@127.0.0.1:5433/$name?sslmode=disable"
  pgflags=(-pg "$dsn")
else
  dsn="sqlite:$dir/nodelane.db"
  pgflags=()
fi
bin=/tmp/rcb/nl-server-${v%%_*}
# Servers older than -log-level (the issue 11 ones, for the regression's history) log at INFO.
loglevel=(); $bin -h 2>&1 | grep -q -- -log-level && loglevel=(-log-level warn)
# STRACE=1 counts the server's fsync and fdatasync calls and their time (strace -c) into
# /tmp/rcb/out/VARIANT-DB-FLOW-N.strace; the CPU figures of such a run are strace's, not the server's.
wrap=(); [ "${STRACE:-}" = 1 ] && wrap=(strace -f --seccomp-bpf -c -e trace=fsync,fdatasync -o /tmp/rcb/out/$v-$db-$flow-$n.strace)
"${wrap[@]}" $bin -db "$dsn" -addr 127.0.0.1:18281 -secrets-file $dir/secrets.json -tokens-file $dir/tokens.json "${loglevel[@]}" >$dir/server.log 2>&1 &
spid=$!
for i in $(seq 50); do [ -s $dir/tokens.json ] && curl -s -o /dev/null http://127.0.0.1:18281/ && break; sleep 0.2; done
{ echo "# $(date -u +%FT%TZ) variant=$v db=$db flow=$flow run=$n flags=$*; uptime: $(uptime)"
  timeout 600 /tmp/rcb/lg -server http://127.0.0.1:18281 -tokens-file $dir/tokens.json -nodes 32 -jobs ${JOBS:-3000} -flow $flow -server-pid $spid "${pgflags[@]}" "$@"
  echo "# exit $?"; } > /tmp/rcb/out/$v-$db-$flow-$n.txt 2>&1
# Under strace, the server is strace's child: stop it, and strace writes its count.
[ "${STRACE:-}" = 1 ] && kill $(pgrep -P $spid)
kill $spid; wait $spid 2>/dev/null
[ $db = pg ] && psql -q -h 127.0.0.1 -p 5433 -U postgres -c "drop database if exists $name" >/dev/null
rm -rf $dir
