#!/usr/bin/env bash
# `make integration`: the Rust integration tests, the client packages, the console and the
# benchmark's smoke run, in two streams at once on two private clusters, so that one
# stream's waits (sleeps, long-polls, restarts, the fixed-length soak and stress runs) overlap
# the other's work. On this 2-core machine the layer took 400 s this way against 725 s
# one binary after the other.
#
# - Stream A, cluster A (TEST_DIR, TEST_PORT), with PgBouncer and postgres_exporter in
#   front of it: the tests that crash or restart their server (a crash ends every session
#   of the cluster, so nothing else may run there meanwhile) and the tests that need the
#   pooler or the exporter, then the clients, the console and the benchmark's smoke run,
#   one after the other.
# - Stream B, cluster B (B_DIR, B_PORT): the harness library's own tests and every other
#   integration test binary. Its output goes to B_DIR.log and is printed when both end.
#
# Each stream runs its binaries one at a time with 4 test threads; only the two streams
# overlap. Every binary in tests/tests is in exactly one stream (checked below), so a new
# test file must be added to A if it crashes, restarts or reconfigures its server, or uses
# the pooler or the exporter; otherwise it runs in B.
#
# Usage: integration.sh TEST_DIR TEST_PORT B_DIR B_PORT POOLER_DIR POOLER_PORT EXPORTER_DIR EXPORTER_PORT [CONF]
set -uo pipefail
cd "$(dirname "$0")/.."
A_DIR=$1 A_PORT=$2 B_DIR=$3 B_PORT=$4 POOLER_DIR=$5 POOLER_PORT=$6 EXPORTER_DIR=$7 EXPORTER_PORT=$8
CONF=${9:-scripts/test.conf}
B_LOG=$B_DIR.log

# Crash or restart the server, or use the pooler or the exporter of cluster A.
STREAM_A=(chaos chaos_fresh crash failpoints soak journal_restart prepared pgbouncer metrics fairness)

psql_on() { psql -X -q -v ON_ERROR_STOP=1 -h "$1/sock" -p "$2" -U postgres "${@:3}"; }

b_pid=
stop_all() {
  if [ -n "$b_pid" ]; then
    # Stream B runs in a process group of its own (setsid): end it and its cargo.
    kill -- -"$b_pid" 2>/dev/null
    wait "$b_pid" 2>/dev/null
    b_pid=
  fi
  bash scripts/exporter.sh stop "$EXPORTER_DIR" "$EXPORTER_PORT" >/dev/null 2>&1
  bash scripts/pgbouncer.sh stop "$POOLER_DIR" "$POOLER_PORT" >/dev/null 2>&1
  bash scripts/cluster.sh stop "$A_DIR" "$A_PORT" >/dev/null 2>&1
  bash scripts/cluster.sh stop "$B_DIR" "$B_PORT" >/dev/null 2>&1
}
# However this ends (a failure, an interrupt), nothing it started stays running.
trap stop_all EXIT
trap 'exit 130' INT TERM
fail() { echo "integration: $*" >&2; exit 1; }

all=$(ls tests/tests/*.rs | xargs -n1 basename | sed 's/\.rs$//' | sort)
for t in "${STREAM_A[@]}"; do
  echo "$all" | grep -qx "$t" || fail "stream A names $t, which is not in tests/tests"
done
A_ARGS=() B_ARGS=(--lib)
for t in "${STREAM_A[@]}"; do A_ARGS+=(--test "$t"); done
for t in $all; do
  [[ " ${STREAM_A[*]} " == *" $t "* ]] || B_ARGS+=(--test "$t")
done
[ "${#B_ARGS[@]}" -gt 1 ] || fail "stream B has no test binary"

# Everything is built first, so the two streams never wait on each other's cargo.
cargo build -q -p queen-consumer --examples || fail "build of the consumer's examples failed"
cargo build -q -p queenctl || fail "build of queenctl failed"
cargo build -q -p queen-bench || fail "build of the benchmark failed"
cargo test -q -p queen-it --lib --tests --no-run || fail "build of the integration tests failed"

for c in "$A_DIR:$A_PORT" "$B_DIR:$B_PORT"; do
  dir=${c%:*} port=${c#*:}
  bash scripts/cluster.sh stop "$dir" "$port"
  rm -rf "$dir"
  bash scripts/cluster.sh start "$dir" "$port" "$CONF" || fail "cluster $dir did not start"
  psql_on "$dir" "$port" -c "CREATE DATABASE queen_it" -c "\c queen_it" -c "CREATE EXTENSION queen" \
    || fail "CREATE EXTENSION in $dir failed"
done
# A real PgBouncer in transaction pooling mode, 4 server connections per database.
bash scripts/pgbouncer.sh start "$POOLER_DIR" "$POOLER_PORT" "$A_DIR" "$A_PORT" 4 || fail "PgBouncer did not start"
# A real postgres_exporter with queen's queries (prometheus/queen.yaml).
bash scripts/exporter.sh start "$EXPORTER_DIR" "$EXPORTER_PORT" \
  "postgresql://postgres@127.0.0.1:$A_PORT/queen_it?sslmode=disable" || fail "the exporter did not start"

export QUEEN_SOAK_SECONDS=30 QUEEN_STRESS_SECS=30 QUEEN_CHURN_PARTITIONS=30000

stream_b() {
  QUEEN_TEST_DSN="host=$B_DIR/sock port=$B_PORT user=postgres dbname=queen_it" \
  QUEEN_TEST_DIR=$B_DIR QUEEN_TEST_PORT=$B_PORT \
    cargo test -p queen-it "${B_ARGS[@]}" -- --test-threads=4
}

stream_a() {
  QUEEN_TEST_DSN="host=$A_DIR/sock port=$A_PORT user=postgres dbname=queen_it" \
  QUEEN_TEST_DIR=$A_DIR QUEEN_TEST_PORT=$A_PORT \
  QUEEN_TEST_POOLER_DSN="host=127.0.0.1 port=$POOLER_PORT user=postgres dbname=queen_it" \
  QUEEN_TEST_METRICS_URL="http://127.0.0.1:$EXPORTER_PORT/metrics" \
    cargo test -p queen-it "${A_ARGS[@]}" -- --test-threads=4 || return 1
  bash scripts/exporter.sh stop "$EXPORTER_DIR" "$EXPORTER_PORT"
  # The README's client examples (psycopg 3, SQLAlchemy text(), node-postgres) and the
  # Python package's suite, directly and through PgBouncer.
  bash scripts/clients.sh "postgresql://postgres@127.0.0.1:$A_PORT/queen_it" \
    "postgresql://postgres@127.0.0.1:$POOLER_PORT/queen_it" || return 1
  # The web console in headless Chromium (screenshots in target/console-screenshots).
  bash scripts/console_test.sh "postgresql://postgres@127.0.0.1:$A_PORT/queen_it" || return 1
  # The benchmark, for a moment and on tiny sizes: it must not rot. No thresholds.
  psql_on "$A_DIR" "$A_PORT" -c "CREATE DATABASE queen_bench" || return 1
  cargo run -q -p queen-bench -- --dsn "host=$A_DIR/sock port=$A_PORT user=postgres dbname=queen_bench" --smoke \
    --pooler-dsn "host=127.0.0.1 port=$POOLER_PORT user=postgres dbname=queen_bench"
}

start=$(date +%s)
export -f stream_b
export B_DIR B_PORT
export B_ARGS_LINE="${B_ARGS[*]}"
# Stream B in a process group of its own, so that stop_all can end all of it.
setsid -w bash -c 'B_ARGS=($B_ARGS_LINE); stream_b; rc=$?; echo "stream B took $(( $(date +%s) - '"$start"' )) s"; exit $rc' \
  > "$B_LOG" 2>&1 &
b_pid=$!
echo "integration: stream B runs on cluster B (port $B_PORT), its output in $B_LOG"
stream_a
a_rc=$?
echo "integration: stream A took $(( $(date +%s) - start )) s"
wait "$b_pid"
b_rc=$?
b_pid=
echo "---- stream B (cluster B, port $B_PORT): ${B_ARGS[*]}"
cat "$B_LOG"
echo "integration: both streams took $(( $(date +%s) - start )) s"
[ "$a_rc" = 0 ] || fail "stream A FAILED"
[ "$b_rc" = 0 ] || fail "stream B FAILED"
