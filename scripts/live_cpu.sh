#!/usr/bin/env bash
# Where the live queue's CPU goes, per role (BENCHMARKS.md, the live queue's seventh round).
# Usage: scripts/live_cpu.sh queen|table CONSUMERS
# Starts a fresh private cluster (/tmp/queen-live-cpu, port 5485, scripts/bench.conf) with
# the installed queen.so (`make install` first: a release build), runs the bench's live
# scenario for one system with CONSUMERS consumers, and in its first flush-bound round
# samples 3 s of the consumers' and the producers' backend CPU (/proc/PID/stat). Prints
# one line: the round's rate and consumer batches (cycles that took messages) per second,
# both roles' CPU per message, and the consumers' CPU per batch. The CPU is of 3 s inside
# the round, the rates are the whole round's.
set -euo pipefail
system=$1 consumers=$2
cd "$(dirname "$0")/.."
D=/tmp/queen-live-cpu P=5485
[ -x target/release/queen-bench ] || cargo build --release -q -p queen-bench
bash scripts/cluster.sh stop $D $P >/dev/null 2>&1 || true
rm -rf $D
bash scripts/cluster.sh start $D $P scripts/bench.conf >/dev/null
trap 'kill $bench 2>/dev/null || true; bash scripts/cluster.sh stop $D $P >/dev/null 2>&1 || true' EXIT
Q="psql -X -A -t -q -h $D/sock -p $P -U postgres"
$Q -c "CREATE DATABASE queen_bench" >/dev/null
out=$(mktemp)
QUEEN_BENCH_LIVE_CONSUMERS=$consumers QUEEN_BENCH_LIVE_SYSTEM=$system ./target/release/queen-bench \
  --dsn "host=$D/sock port=$P user=postgres dbname=queen_bench" --only live > "$out" 2>&1 &
bench=$!
sleep 6 # inside the first flush-bound round (after the reset, the warm-up and a checkpoint)
# Producers last ran a push or an INSERT; consumers are the bench's other client backends
# (the table's last ran BEGIN, its SELECT, its DELETE or COMMIT), but for its main
# connection (a CHECKPOINT or a VACUUM) and this one.
pids() {
  $Q -d postgres -c "SELECT string_agg(pid::text, ' ') FROM pg_stat_activity
     WHERE datname = 'queen_bench' AND backend_type = 'client backend' AND pid <> pg_backend_pid()
       AND query NOT ILIKE '%checkpoint%' AND query NOT ILIKE '%vacuum%'
       AND ($1 (query ILIKE '%push%' OR query ILIKE '%insert%'))"
}
cons=$(pids "NOT") prod=$(pids "")
ticks() { local s=0 f; for p in $1; do read -r -a f < /proc/$p/stat; s=$((s + f[13] + f[14])); done; echo $s; }
c0=$(ticks "$cons") p0=$(ticks "$prod") t0=$(date +%s.%N)
sleep 3
c1=$(ticks "$cons") p1=$(ticks "$prod") t1=$(date +%s.%N)
while ! grep -q "flush-bound, round 1" "$out"; do
  kill -0 $bench 2>/dev/null || { cat "$out"; exit 1; }
  sleep 1
done
round1=$(grep -m1 "flush-bound, round 1" "$out")
rate=$(sed -E 's/.*consumed +([0-9]+).*/\1/' <<< "$round1")
batches=$(sed -E 's/.*batches +([0-9]+).*/\1/' <<< "$round1")
hz=$(getconf CLK_TCK)
python3 - "$system" "$consumers" "$rate" "$batches" "$t0" "$t1" $((c1 - c0)) $((p1 - p0)) "$hz" \
  "$(echo $cons | wc -w)" "$(echo $prod | wc -w)" <<'PY'
import sys
system, n, rate, batches, t0, t1, c, p, hz, nc, np_ = sys.argv[1:]
secs, rate, batches, hz = float(t1) - float(t0), float(rate), float(batches), float(hz)
c, p = int(c) / hz, int(p) / hz
print(f"{system}, {n} consumers ({nc} found, {np_} producers): {rate:,.0f} msg/s in {batches:,.0f} batches/s "
      f"({rate / batches:.1f} each); consumers {c / secs:.2f} cores, {c / (rate * secs) * 1e6:.0f} us/msg, "
      f"{c / (batches * secs) * 1e6:.0f} us/batch; producers {p / secs:.2f} cores, {p / (rate * secs) * 1e6:.0f} us/msg")
PY
