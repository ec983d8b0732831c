#!/usr/bin/env bash
# A three-node Citus cluster on this machine (a coordinator and two workers: private
# ports and socket directories, the project's cluster script), with citus and queen
# preloaded on each node, and checks that both extensions work together on every node:
# the workers are registered and active, queen is installed on each node, and the
# README's SQL tour passes on the coordinator and on a worker.
#
# This is the first step of running queen on Citus: queen's tables are not distributed
# yet, so each node holds its own queues.
#
# Usage: citus_test.sh DIR BASE_PORT   (nodes on BASE_PORT, +1, +2; stopped at the end)
set -euo pipefail
dir=$1 base=$2
root=$(cd "$(dirname "$0")/.." && pwd)
REGRESS=/usr/lib/postgresql/15/lib/pgxs/src/test/regress
names=(coordinator worker1 worker2)
ports=("$base" "$((base + 1))" "$((base + 2))")
conf=$(mktemp)
cat > "$conf" <<CONF
shared_preload_libraries = 'citus,queen'
max_prepared_transactions = 50
CONF

stop_all() {
  for i in 0 1 2; do bash "$root/scripts/cluster.sh" stop "$dir/${names[$i]}" "${ports[$i]}" || true; done
}
trap 'stop_all; rm -f "$conf"' EXIT
stop_all
rm -rf "$dir"
for i in 0 1 2; do
  bash "$root/scripts/cluster.sh" start "$dir/${names[$i]}" "${ports[$i]}" "$conf"
done
psql_on() { # psql_on NODE_INDEX SQL...
  local i=$1; shift
  psql -X -q -At -v ON_ERROR_STOP=1 -h "$dir/${names[$i]}/sock" -p "${ports[$i]}" -U postgres -d queen_citus "$@"
}
for i in 0 1 2; do
  psql -X -q -v ON_ERROR_STOP=1 -h "$dir/${names[$i]}/sock" -p "${ports[$i]}" -U postgres \
    -c "CREATE DATABASE queen_citus"
  psql_on "$i" -c "CREATE EXTENSION citus"
done
psql_on 0 -c "SELECT citus_set_coordinator_host('127.0.0.1', ${ports[0]})" >/dev/null
psql_on 0 -c "SELECT citus_add_node('127.0.0.1', ${ports[1]})" -c "SELECT citus_add_node('127.0.0.1', ${ports[2]})" >/dev/null
workers=$(psql_on 0 -c "SELECT count(*) FROM citus_get_active_worker_nodes()")
if [ "$workers" != 2 ]; then
  echo "citus-test: expected 2 active workers, the coordinator sees $workers" >&2
  exit 1
fi
# queen on every node: created on the coordinator, which propagates CREATE EXTENSION to
# its workers (a worker refuses it directly); checked on each node below.
psql_on 0 -c "CREATE EXTENSION queen"
for i in 0 1 2; do
  versions=$(psql_on "$i" -c "SELECT string_agg(extname || ' ' || extversion, ', ' ORDER BY extname)
                               FROM pg_extension WHERE extname IN ('citus', 'queen')")
  echo "citus-test: ${names[$i]}: $versions"
  case "$versions" in
    "citus 13.2-1, queen "*) ;;
    *) echo "citus-test: ${names[$i]} lacks citus 13.2 or queen" >&2; exit 1 ;;
  esac
done
# The README's SQL tour (the pg_regress test `readme`) on the coordinator and on a worker.
python3 "$root/scripts/readme_sql.py" "$root/README.md" > "$dir/readme.sql"
mkdir -p "$dir/in/sql" "$dir/in/expected"
cp "$dir/readme.sql" "$dir/in/sql/readme.sql"
cp "$root/pg_test/expected/readme.out" "$dir/in/expected/readme.out"
for i in 0 1; do
  "$REGRESS/pg_regress" --host="$dir/${names[$i]}/sock" --port="${ports[$i]}" --user=postgres \
    --inputdir="$dir/in" --outputdir="$dir/out-${names[$i]}" --dbname=queen_citus_tour \
    --load-extension=citus readme \
    || { cat "$dir/out-${names[$i]}/regression.diffs"; exit 1; }
done
echo "citus-test: passed (coordinator and two workers, citus and queen on each)"
