#!/usr/bin/env bash
# burndown.sh: River's burn-down and nodelane's Go-API burn-down on
# PostgreSQL, measured alternately (A B A B ...) in one session, with the
# load average beside every run, then the medians and the ratio
# nodelane/River.
#
#   A = River (RIVER_DIR, default ../shared/bench/river):
#         go run . -n N        (no-op jobs, database riverbench)
#   B = nodelane, River's shape (Lease with accept, then Complete):
#         go test ./bunstore -run '^$' \
#           -bench 'BenchmarkLeaseAcceptComplete/postgres/claimers=K/max_jobs=B/accept=lease' \
#           -benchtime Nx -count 1
#
# Both programs are built once before the first round and the binaries are
# run, so that no compilation overlaps a measurement; the runs are the
# commands above.
#
# Environment (defaults in brackets):
#   N [20000]           jobs per run
#   ROUNDS [3]          A B pairs
#   CLAIMERS [32]       nodelane claimers (K)
#   MAX_JOBS [10]       nodelane max_jobs per Lease (B)
#   RIVER_DIR [../shared/bench/river], relative to the repository root
#   RIVER_DB [postgres://postgres@127.0.0.1:5432/riverbench?sslmode=disable]
#   PSQL_ARGS [-h 127.0.0.1 -U postgres]   how psql reaches the server, to
#                       create the database riverbench if it is missing
#   NODELANE_TEST_POSTGRES [postgres://postgres@127.0.0.1:5432/test?sslmode=disable]
#   CI [true]           so that an unreachable PostgreSQL fails the run
set -euo pipefail

N=${N:-20000}
ROUNDS=${ROUNDS:-3}
CLAIMERS=${CLAIMERS:-32}
MAX_JOBS=${MAX_JOBS:-10}
RIVER_DIR=${RIVER_DIR:-../shared/bench/river}
RIVER_DB=${RIVER_DB:-postgres://postgres@127.0.0.1:5432/riverbench?sslmode=disable}
PSQL_ARGS=${PSQL_ARGS:--h 127.0.0.1 -U postgres}
export NODELANE_TEST_POSTGRES=${NODELANE_TEST_POSTGRES:-postgres://postgres@127.0.0.1:5432/test?sslmode=disable}
export CI=${CI:-true}

root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
case $RIVER_DIR in
/*) ;;
*) RIVER_DIR=$root/$RIVER_DIR ;;
esac
RIVER_DIR=$(cd "$RIVER_DIR" && pwd)
bench="BenchmarkLeaseAcceptComplete/postgres/claimers=$CLAIMERS/max_jobs=$MAX_JOBS/accept=lease"

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

loadavg() { uptime | sed 's/.*load average[s]*: *//'; }

# median reads numbers, one a line, and prints their median.
median() {
	sort -g | awk '{ v[NR] = $1 } END {
		if (NR == 0) { print "NaN"; exit }
		if (NR % 2) print v[(NR + 1) / 2]; else print (v[NR / 2] + v[NR / 2 + 1]) / 2
	}'
}

# metric UNIT FILE prints the value reported before UNIT on the benchmark line of FILE.
metric() {
	awk -v unit="$1" '/^BenchmarkLeaseAcceptComplete\// {
		for (i = 2; i <= NF; i++) if ($i == unit) { print $(i - 1); exit }
	}' "$2"
}

# psql arguments are words by design.
# shellcheck disable=SC2086
if [ "$(psql $PSQL_ARGS -d postgres -Atc "SELECT 1 FROM pg_database WHERE datname = 'riverbench'")" != 1 ]; then
	echo "creating database riverbench"
	# shellcheck disable=SC2086
	psql $PSQL_ARGS -d postgres -qc 'CREATE DATABASE riverbench'
fi

echo "building River's burn-down ($RIVER_DIR) and the bunstore test binary"
(cd "$RIVER_DIR" && go build -o "$tmp/river" .)
go test -c -o "$tmp/bunstore.test" ./bunstore

echo "machine: $(nproc) CPUs, $(uname -sr); $(psql $PSQL_ARGS -d postgres -Atc 'SHOW server_version' | sed 's/^/PostgreSQL /')"
echo "N=$N ROUNDS=$ROUNDS nodelane: $bench"
echo

: >"$tmp/river.jps"
: >"$tmp/nodelane.jps"
: >"$tmp/stmts"
: >"$tmp/commits"
for round in $(seq 1 "$ROUNDS"); do
	# A: River.
	before=$(loadavg)
	if ! (cd "$RIVER_DIR" && "$tmp/river" -db "$RIVER_DB" -n "$N") >"$tmp/out" 2>&1; then
		cat "$tmp/out" >&2
		exit 1
	fi
	jps=$(sed -n 's/.*jobs_per_s=\([0-9.]*\).*/\1/p' "$tmp/out")
	if [ -z "$jps" ]; then
		cat "$tmp/out" >&2
		exit 1
	fi
	echo "$jps" >>"$tmp/river.jps"
	printf 'round %d A river    %10s jobs/s   load before: %s   after: %s\n' "$round" "$jps" "$before" "$(loadavg)"

	# B: nodelane.
	before=$(loadavg)
	if ! (cd bunstore && "$tmp/bunstore.test" -test.run '^$' -test.bench "$bench" \
		-test.benchtime "${N}x" -test.count 1) >"$tmp/out" 2>&1; then
		cat "$tmp/out" >&2
		exit 1
	fi
	jps=$(metric jobs/s "$tmp/out")
	stmts=$(metric stmts/job "$tmp/out")
	commits=$(metric commits/job "$tmp/out")
	if [ -z "$jps" ]; then
		cat "$tmp/out" >&2
		exit 1
	fi
	echo "$jps" >>"$tmp/nodelane.jps"
	echo "$stmts" >>"$tmp/stmts"
	echo "$commits" >>"$tmp/commits"
	printf 'round %d B nodelane %10s jobs/s   load before: %s   after: %s   stmts/job %s commits/job %s\n' \
		"$round" "$jps" "$before" "$(loadavg)" "$stmts" "$commits"
done

river=$(median <"$tmp/river.jps")
nodelane=$(median <"$tmp/nodelane.jps")
echo
echo "median river    $river jobs/s"
echo "median nodelane $nodelane jobs/s   stmts/job $(median <"$tmp/stmts")   commits/job $(median <"$tmp/commits")"
awk -v a="$nodelane" -v b="$river" 'BEGIN { printf "ratio nodelane/river %.3f\n", a / b }'
