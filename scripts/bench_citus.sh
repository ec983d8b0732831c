#!/usr/bin/env bash
# make bench-citus: queen on one node against queen on a Citus coordinator and two workers,
# all on this machine, in one run (docs/citus.md). Writes BENCHMARKS-citus.md.
#
# Shapes, the same SQL and client for both arms (pgbench, prepared statements, the same
# ~200 B payload), 16 queues:
#   - push: one message per transaction, 8 clients, each transaction to one of the 16 queues;
#   - pop + ack: batch 100, 4 consumers, one group, each pop from one of the 16 queues
#     (prefilled), then ack of the whole lease by its id;
#   - per-call latency of a routed call that writes nothing (a pop of an empty queue), one
#     client: the coordinator's delegation adds the difference.
# Arms alternate (one node, cluster, one node, cluster); the median of each counts.
#
# Usage: bench_citus.sh DIR BASE_PORT OUT   (one node on BASE_PORT; the cluster on +1..+3)
set -euo pipefail
dir=$1 base=$2 out=$3
root=$(cd "$(dirname "$0")/.." && pwd)
secs=${BENCH_CITUS_SECS:-10}
rounds=${BENCH_CITUS_ROUNDS:-2}
prefill=${BENCH_CITUS_PREFILL:-120000} # messages per queue
conf=$(mktemp)
{ cat "$root/scripts/bench.conf"; echo "shared_preload_libraries = 'citus,queen'"; echo "max_prepared_transactions = 50"; } > "$conf"
work=$(mktemp -d)
names=(single coordinator worker1 worker2)
ports=("$base" "$((base + 1))" "$((base + 2))" "$((base + 3))")
stop_all() {
  for i in 0 1 2 3; do bash "$root/scripts/cluster.sh" stop "$dir/${names[$i]}" "${ports[$i]}" >/dev/null 2>&1 || true; done
}
trap 'stop_all; rm -rf "$conf" "$work"' EXIT
psql_on() { local i=$1; shift; psql -X -q -At -v ON_ERROR_STOP=1 -h "$dir/${names[$i]}/sock" -p "${ports[$i]}" -U postgres -d qb "$@"; }
bench_on() { # bench_on NODE CLIENTS SCRIPTS... : transactions per second
  local i=$1 c=$2; shift 2
  pgbench -n -M prepared -h "$dir/${names[$i]}/sock" -p "${ports[$i]}" -U postgres -c "$c" -j 2 -T "$secs" "$@" qb \
    > "$work/pgbench.out" 2>&1 || { cat "$work/pgbench.out" >&2; exit 1; }
  grep -q "number of failed transactions: 0" "$work/pgbench.out" || { cat "$work/pgbench.out" >&2; exit 1; }
  awk '/^tps/ {print $3}' "$work/pgbench.out"
}
latency_on() { # latency_on NODE SCRIPT : average ms per transaction, one client
  local i=$1 f=$2
  pgbench -n -M prepared -h "$dir/${names[$i]}/sock" -p "${ports[$i]}" -U postgres -c 1 -T "$secs" -f "$f" qb \
    > "$work/pgbench.out" 2>&1 || { cat "$work/pgbench.out" >&2; exit 1; }
  awk '/^latency average/ {print $4}' "$work/pgbench.out"
}

payload='{"orderId": 1, "customer": "customer-00000001", "items": [{"sku": "sku-1", "qty": 1}], "note": "deliver to the back door, ring twice"}'
pushes=() pops=()
for k in $(seq 0 15); do
  echo "SELECT 1 FROM queen.push('bq$k', '$payload');" > "$work/push$k.sql"
  # A pop finds nothing when another consumer holds the queue's one lane: it then acks a
  # lease id that is nobody's (a no-op), and the messages are counted from the cursors.
  printf '%s\n%s\n' "SELECT coalesce(max(lease_id::text), '00000000-0000-7000-8000-000000000000') AS lease_id FROM queen.pop('bq$k', 'g', batch => 100) \\gset" \
    "SELECT queen.ack(:lease_id);" > "$work/pop$k.sql"
  pushes+=(-f "$work/push$k.sql") pops+=(-f "$work/pop$k.sql")
done
echo "SELECT count(*) FROM queen.pop('idle', 'probe', batch => 1);" > "$work/probe.sql"

# setup ARM: start the arm's nodes, create queen (and distribute it on the cluster); prints
# the node index that takes the clients.
setup() {
  stop_all
  rm -rf "$dir"
  if [ "$1" = single ]; then
    bash "$root/scripts/cluster.sh" start "$dir/single" "${ports[0]}" "$conf" >/dev/null
    psql -X -q -h "$dir/single/sock" -p "${ports[0]}" -U postgres -c "CREATE DATABASE qb"
    psql_on 0 -c "CREATE EXTENSION queen"
    echo 0
    return
  fi
  for i in 1 2 3; do
    bash "$root/scripts/cluster.sh" start "$dir/${names[$i]}" "${ports[$i]}" "$conf" >/dev/null
    psql -X -q -h "$dir/${names[$i]}/sock" -p "${ports[$i]}" -U postgres -c "CREATE DATABASE qb"
    psql_on "$i" -c "CREATE EXTENSION citus"
  done
  psql_on 1 -c "SELECT citus_set_coordinator_host('127.0.0.1', ${ports[1]})" \
            -c "SELECT citus_add_node('127.0.0.1', ${ports[2]})" -c "SELECT citus_add_node('127.0.0.1', ${ports[3]})" >/dev/null
  psql_on 1 -c "CREATE EXTENSION queen" -c "SELECT queen.distribute()" >/dev/null
  psql_on 1 -c "SELECT string_agg(n, ' and ' ORDER BY n) FROM (
                  SELECT count(*)::text AS n FROM generate_series(0, 15) k
                   GROUP BY (SELECT pl.groupid FROM pg_dist_placement pl
                              WHERE pl.shardid = get_shard_id_for_distribution_column('queen_citus.queue_homes', 'bq' || k))) s" \
    > "$work/split"
  echo 1
}
prefill() { # prefill NODE: every queue gets $prefill messages, in push_batch calls of 1,000
  local i=$1
  { echo "\\set items '$(psql_on "$i" -c "SELECT jsonb_agg(jsonb_build_object('payload', '$payload'::jsonb)) FROM generate_series(1, 1000)")'"
    for k in $(seq 0 15); do
      for _ in $(seq 1 $((prefill / 1000))); do echo "SELECT count(*) FROM queen.push_batch('bq$k', :'items');"; done
    done
    echo "SELECT count(*) FROM queen.pop('idle', 'probe', batch => 1);"
  } > "$work/fill.sql"
  psql_on "$i" -f "$work/fill.sql" >/dev/null
}

acked() { # acked ARM: messages group g acked, per second of the run (cursors, on each node holding queues)
  local nodes=(0) total=0 n
  [ "$1" = cluster ] && nodes=(2 3)
  for i in "${nodes[@]}"; do
    n=$(psql_on "$i" -c "SELECT coalesce(sum(committed), 0) FROM queen.totals() WHERE consumer_group = 'g'")
    total=$((total + n))
  done
  awk -v n="$total" -v s="$secs" 'BEGIN {printf "%.0f", n / s}'
}

declare -A results
for r in $(seq 1 "$rounds"); do
  for arm in single cluster; do
    node=$(setup "$arm")
    push=$(printf '%.0f' "$(bench_on "$node" 8 "${pushes[@]}")")
    prefill "$node"
    bench_on "$node" 4 "${pops[@]}" >/dev/null
    popack=$(acked "$arm")
    lat=$(latency_on "$node" "$work/probe.sql")
    echo "bench-citus: round $r, $arm: push $push msg/s, pop+ack $popack msg/s, empty pop $lat ms"
    results[$arm-push]+="$push " results[$arm-popack]+="$popack " results[$arm-lat]+="$lat "
    stop_all
  done
done
median() { tr ' ' '\n' | grep -v '^$' | sort -g | awk '{a[NR]=$1} END {print a[int((NR + 1) / 2)]}'; }
m() { echo "${results[$1]}" | median; }
sp=$(m single-push) cp=$(m cluster-push) sa=$(m single-popack) ca=$(m cluster-popack) sl=$(m single-lat) cl=$(m cluster-lat)
ratio() { awk -v a="$1" -v b="$2" 'BEGIN {printf "%.2f", a / b}'; }
{
  echo "# queen on Citus: benchmarks"
  echo
  echo "Written by \`make bench-citus\` (scripts/bench_citus.sh) on $(nproc) cores, $(awk '/MemTotal/ {printf "%.0f GiB", $2 / 1048576}' /proc/meminfo) RAM."
  echo "One node against a Citus 13.2.2 coordinator and two workers, all three on the same"
  echo "machine, with \`queen.distribute()\`. Settings from \`scripts/bench.conf\` on every node; pgbench with"
  echo "prepared statements for both arms, the same SQL and payload; 16 queues; ${secs} s per measurement;"
  echo "arms alternate, ${rounds} rounds, the median counts (of two, the lower). Queues per worker: $(cat "$work/split")."
  echo
  echo "| scenario | one node | coordinator + 2 workers | ratio |"
  echo "|---|---|---|---|"
  echo "| push, batch 1, 8 clients, 16 queues (msg/s) | ${sp%.*} | ${cp%.*} | $(ratio "$cp" "$sp") |"
  echo "| pop + ack, batch 100, 4 consumers, 16 queues (msg/s) | $sa | $ca | $(ratio "$ca" "$sa") |"
  echo "| routed call writing nothing (empty pop), 1 client (ms per call) | $sl | $cl | $(ratio "$cl" "$sl") |"
  echo
  echo "Delegation overhead per call through the coordinator: $(awk -v a="$cl" -v b="$sl" 'BEGIN {printf "%.3f", a - b}') ms."
  echo "Every run (msg/s, ms): push one node ${results[single-push]% }, cluster ${results[cluster-push]% };"
  echo "pop + ack one node ${results[single-popack]% }, cluster ${results[cluster-popack]% }; latency one node"
  echo "${results[single-lat]% }, cluster ${results[cluster-lat]% }."
} > "$out"
cat "$out"
