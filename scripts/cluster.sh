#!/usr/bin/env bash
# A private PostgreSQL 15 cluster run by the `postgres` OS user (initdb and pg_ctl refuse
# root). Usage: cluster.sh start|stop|status|promote DATADIR PORT [EXTRA_CONF]
#              cluster.sh standby DATADIR PORT PRIMARY_SOCKET_DIR PRIMARY_PORT
# The socket lives in DATADIR/sock; queen is preloaded (shared_preload_libraries).
# `standby` makes DATADIR a streaming standby of the primary (pg_basebackup -R, which the
# primary's default pg_hba.conf allows over its socket) and starts it.
set -euo pipefail
cmd=$1 dir=$2 port=$3 extra=${4:-}
BIN=/usr/lib/postgresql/15/bin
as_pg() { runuser -u postgres -- "$@"; }

case "$cmd" in
  start)
    if [ ! -f "$dir/PG_VERSION" ]; then
      mkdir -p "$dir"
      chown postgres:postgres "$dir"
      as_pg "$BIN/initdb" -D "$dir" -U postgres --auth=trust -E UTF8 --locale=C.UTF-8 >/dev/null
      mkdir -p "$dir/sock" && chown postgres:postgres "$dir/sock"
      cat >> "$dir/postgresql.conf" <<CONF
port = $port
listen_addresses = '127.0.0.1'
unix_socket_directories = '$dir/sock'
max_connections = 200
shared_preload_libraries = 'queen'
fsync = on
logging_collector = off
CONF
      if [ -n "$extra" ]; then cat "$extra" >> "$dir/postgresql.conf"; fi
    fi
    if ! as_pg "$BIN/pg_ctl" -D "$dir" status >/dev/null 2>&1; then
      as_pg "$BIN/pg_ctl" -D "$dir" -l "$dir/server.log" -w -t 60 start >/dev/null
    fi
    ;;
  stop)
    if [ -f "$dir/PG_VERSION" ] && as_pg "$BIN/pg_ctl" -D "$dir" status >/dev/null 2>&1; then
      as_pg "$BIN/pg_ctl" -D "$dir" -m fast -w stop >/dev/null
    fi
    ;;
  crash)
    # An immediate stop: no shutdown checkpoint, and queen's worker saves nothing (as after
    # a kill -9 of the server); the next start replays the WAL.
    as_pg "$BIN/pg_ctl" -D "$dir" -m immediate -w stop >/dev/null
    ;;
  status)
    as_pg "$BIN/pg_ctl" -D "$dir" status
    ;;
  standby)
    primary_sock=$4 primary_port=$5
    mkdir -p "$dir" && chown postgres:postgres "$dir" && chmod 700 "$dir"
    as_pg "$BIN/pg_basebackup" -h "$primary_sock" -p "$primary_port" -U postgres -D "$dir" -R -X stream -c fast
    # The copy has the primary's port and socket directory (and a stale socket file).
    sed -i -e '/^port = /d' -e '/^unix_socket_directories = /d' "$dir/postgresql.conf"
    printf "port = %s\nunix_socket_directories = '%s'\n" "$port" "$dir/sock" >> "$dir/postgresql.conf"
    rm -rf "$dir/sock" && mkdir -p "$dir/sock" && chown postgres:postgres "$dir/sock"
    as_pg "$BIN/pg_ctl" -D "$dir" -l "$dir/server.log" -w -t 60 start >/dev/null
    ;;
  promote)
    as_pg "$BIN/pg_ctl" -D "$dir" -w promote >/dev/null
    ;;
  *) echo "usage: $0 start|stop|crash|status|promote DATADIR PORT | standby DATADIR PORT PRIMARY_SOCKET_DIR PRIMARY_PORT" >&2; exit 2 ;;
esac
