#!/usr/bin/env bash
# Instructions per call of queen's hot paths, counted by valgrind's callgrind: repeatable
# for the same build and inputs whatever else the machine does, so two builds can be
# compared without alternating runs (BENCHMARKS.md says where this was used).
#
# Usage: scripts/callgrind.sh PKG_ROOT [WORK_DIR]
#   PKG_ROOT: the tree `cargo pgrx package` writes (target/release/queen-pg15), of any
#   build; it is laid over a private copy of PostgreSQL 15 in WORK_DIR (default
#   /tmp/queen-callgrind), whose binaries find their own library and share directories.
#
# In one single-user backend (`postgres --single`, queen preloaded, fsync off), a queue of
# single sends in one partition, then under callgrind a procedure that commits after each
# call: `send` (1 message), an INSERT into a plain table (bigserial and jsonb, the bench's
# baseline, same payload), and `pop(batch => 1)` + `ack(lease)`. Each runs at two sizes;
# the difference over the difference in calls is the cost of one call (or cycle), without
# the backend's start and end. It counts the calls through PL/pgSQL, not the client
# protocol's parse, bind and portal, so the percentages of a real client's call are lower.
# callgrind_annotate on the .out files says where the instructions go.
set -euo pipefail
pkg=$(realpath "$1")
work=${2:-/tmp/queen-callgrind}
small=500 large=2500
root=$work/pg
rm -rf "$work"
mkdir -p "$root/usr/lib/postgresql" "$root/usr/share/postgresql"
cp -a /usr/lib/postgresql/15 "$root/usr/lib/postgresql/"
cp -a /usr/share/postgresql/15 "$root/usr/share/postgresql/"
cp -a "$pkg/usr/lib/postgresql/15/lib/." "$root/usr/lib/postgresql/15/lib/"
cp -a "$pkg/usr/share/postgresql/15/extension/." "$root/usr/share/postgresql/15/extension/"
chown -R postgres "$work"
bin=$root/usr/lib/postgresql/15/bin
as_pg() { runuser -u postgres -- "$@"; }

# run MODE N: a fresh cluster with N + 100 messages queued, then `CALL MODE(N)` under
# callgrind; prints the instructions counted.
run() {
  local mode=$1 n=$2 data=$work/data
  rm -rf "$data"
  mkdir -p "$data" && chown postgres "$data"
  as_pg "$bin/initdb" -D "$data" -A trust --locale=C.UTF-8 >/dev/null
  printf "shared_preload_libraries = 'queen'\nsynchronous_commit = off\nfsync = off\n" >> "$data/postgresql.conf"
  cat > "$work/setup.sql" <<SQL
CREATE EXTENSION queen;
CREATE PROCEDURE fill(n int) LANGUAGE plpgsql AS \$\$ BEGIN FOR i IN 1..n LOOP PERFORM queen.send('q', '{"a": 1, "b": "xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx"}'::jsonb); COMMIT; END LOOP; END \$\$;
CREATE TABLE plain (id bigserial PRIMARY KEY, payload jsonb NOT NULL);
CREATE PROCEDURE insert(n int) LANGUAGE plpgsql AS \$\$ BEGIN FOR i IN 1..n LOOP INSERT INTO plain (payload) VALUES ('{"a": 1, "b": "xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx"}'::jsonb); COMMIT; END LOOP; END \$\$;
CREATE PROCEDURE cycle(n int) LANGUAGE plpgsql AS \$\$ DECLARE l uuid; BEGIN FOR i IN 1..n LOOP SELECT lease_id INTO l FROM queen.pop('q', batch => 1); PERFORM queen.ack(l); COMMIT; END LOOP; END \$\$;
CALL fill($((n + 100)));
CALL cycle(10);
SQL
  echo "CALL $mode($n);" > "$work/run.sql"
  chmod 644 "$work"/*.sql
  as_pg "$bin/postgres" --single -D "$data" -c exit_on_error=on postgres < "$work/setup.sql" > "$work/setup.log" 2>&1 \
    || { cat "$work/setup.log" >&2; exit 1; }
  (cd "$work" && as_pg valgrind --tool=callgrind --callgrind-out-file="$work/$mode-$n.out" \
    "$bin/postgres" --single -D "$data" -c exit_on_error=on postgres < "$work/run.sql" > "$work/$mode-$n.log" 2>&1) \
    || { cat "$work/$mode-$n.log" >&2; exit 1; }
  if grep -q ERROR "$work/$mode-$n.log"; then cat "$work/$mode-$n.log" >&2; exit 1; fi
  sed -n 's/^totals: //p' "$work/$mode-$n.out"
}

for mode in fill insert cycle; do
  a=$(run $mode $small)
  b=$(run $mode $large)
  case $mode in
    fill) what="send, one message" ;;
    insert) what="a plain INSERT (bigserial + jsonb), for comparison" ;;
    cycle) what="pop(batch => 1) + ack" ;;
  esac
  echo "$what: $(( (b - a) / (large - small) )) instructions a call ($work/$mode-$large.out)"
done
