#!/usr/bin/env bash
# Where the live queue's CPU goes, per role (BENCHMARKS.md, the live queue's seventh round).
# Usage: scripts/live_cpu.sh queen|table CONSUMERS      (needs python3)
# Starts a fresh private cluster (/tmp/queen-live-cpu, port 5485, scripts/bench.conf) with
# the installed queen.so (`make install` first: a release build), starts the bench's live
# scenario for one system with CONSUMERS consumers, samples 3 s of its first flush-bound
# round, and stops the bench and the cluster once that round has ended. Prints one line:
# the round's rate and consumer batches (cycles that took messages) per second, and the
# consumers' and the producers' backend CPU (/proc/PID/stat) per message and per batch.
# The CPU is of the 3 s sample, the rates are the whole round's; the maintenance worker,
# the WAL writer and the bench client count in neither role.
set -euo pipefail
system=${1:?usage: scripts/live_cpu.sh queen|table CONSUMERS}
consumers=${2:?usage: scripts/live_cpu.sh queen|table CONSUMERS}
cd "$(dirname "$0")/.."
D=/tmp/queen-live-cpu P=5485
bench="" out=$(mktemp)
cleanup() {
  if [ -n "$bench" ]; then kill "$bench" 2>/dev/null || true; fi
  bash scripts/cluster.sh stop $D $P >/dev/null 2>&1 || true
  rm -f "$out"
}
trap cleanup EXIT
cargo build --release -q -p queen-bench # the bench that prints batches per round
bash scripts/cluster.sh stop $D $P >/dev/null 2>&1 || true
rm -rf $D
bash scripts/cluster.sh start $D $P scripts/bench.conf >/dev/null
Q="psql -X -A -t -q -h $D/sock -p $P -U postgres"
$Q -c "CREATE DATABASE queen_bench" >/dev/null
QUEEN_BENCH_LIVE_CONSUMERS=$consumers QUEEN_BENCH_LIVE_SYSTEM=$system ./target/release/queen-bench \
  --dsn "host=$D/sock port=$P user=postgres dbname=queen_bench" --only live > "$out" 2>&1 &
bench=$!
sleep 6 # inside the first flush-bound round: after the reset, the warm-up and a checkpoint

# The bench's backends by the last statement they ran. Producers: a push or an INSERT.
# Consumers: the others (queen's pop or ack; the table's BEGIN, SELECT, DELETE or
# COMMIT), but for the bench's main connection (it ran a CHECKPOINT or a VACUUM).
backends() {
  local role=$1 # producers or consumers
  local writes="(query ILIKE '%push%' OR query ILIKE '%insert%')"
  [ "$role" = consumers ] && writes="NOT $writes"
  $Q -d postgres -c "SELECT string_agg(pid::text, ' ') FROM pg_stat_activity
     WHERE datname = 'queen_bench' AND backend_type = 'client backend' AND pid <> pg_backend_pid()
       AND query NOT ILIKE '%checkpoint%' AND query NOT ILIKE '%vacuum%' AND $writes"
}
cons=$(backends consumers)
prod=$(backends producers)
found=$(wc -w <<< "$cons")
[ "$found" -eq "$consumers" ] || { echo "found $found consumers, not $consumers: not inside a round?" >&2; exit 1; }
[ "$(wc -w <<< "$prod")" -eq 8 ] || { echo "found $(wc -w <<< "$prod") producers, not 8" >&2; exit 1; }
# User plus system CPU ticks of the backends (fields 14 and 15 of /proc/PID/stat; a
# backend's command name is "postgres", without spaces).
ticks() {
  local s=0 f p
  for p in $1; do
    [ -r "/proc/$p/stat" ] || { echo "backend $p is gone" >&2; return 1; }
    read -r -a f < "/proc/$p/stat"
    s=$((s + f[13] + f[14]))
  done
  echo $s
}
t0=$(date +%s.%N)
c0=$(ticks "$cons")
p0=$(ticks "$prod")
sleep 3
c1=$(ticks "$cons")
p1=$(ticks "$prod")
t1=$(date +%s.%N)
if grep -q "flush-bound, round 1" "$out"; then
  echo "the first round ended before the sample did" >&2
  exit 1
fi
while ! grep -q "flush-bound, round 1" "$out"; do
  kill -0 $bench 2>/dev/null || { cat "$out"; exit 1; }
  sleep 1
done
round1=$(grep -m1 "flush-bound, round 1" "$out")
grep -q "batches" <<< "$round1" || { echo "the bench prints no batches: $round1" >&2; exit 1; }
rate=$(sed -E 's/.*consumed +([0-9]+).*/\1/' <<< "$round1")
batches=$(sed -E 's/.*batches +([0-9]+).*/\1/' <<< "$round1")
python3 - "$system" "$consumers" "$rate" "$batches" "$t0" "$t1" $((c1 - c0)) $((p1 - p0)) "$(getconf CLK_TCK)" <<'PY'
import sys
system, n, rate, batches, t0, t1, c, p, hz = sys.argv[1:]
secs, rate, batches, hz = float(t1) - float(t0), float(rate), float(batches), float(hz)
c, p = int(c) / hz, int(p) / hz  # CPU seconds in the sample
print(f"{system}, {n} consumers: {rate:,.0f} msg/s in {batches:,.0f} batches/s ({rate / batches:.1f} each); "
      f"consumers {c / secs:.2f} cores, {c / (rate * secs) * 1e6:.0f} us/msg, {c / (batches * secs) * 1e6:.0f} us/batch; "
      f"producers {p / secs:.2f} cores, {p / (rate * secs) * 1e6:.0f} us/msg")
PY
