#!/usr/bin/env bash
# A private PgBouncer (Debian's) in transaction pooling mode, run by the `postgres` OS user
# (pgbouncer refuses root), in front of a cluster started by scripts/cluster.sh.
# Usage: pgbouncer.sh start|stop DIR PORT UPSTREAM_DIR UPSTREAM_PORT [POOL_SIZE]
# Clients connect to 127.0.0.1:PORT (or DIR as the socket directory), any database name of
# the upstream, as user postgres; each database gets POOL_SIZE (default 4) server
# connections, shared by up to 200 clients.
set -euo pipefail
cmd=$1 dir=$2 port=$3 up_dir=${4:-} up_port=${5:-} pool=${6:-4}
as_pg() { runuser -u postgres -- "$@"; }

case "$cmd" in
  start)
    mkdir -p "$dir" && chown postgres:postgres "$dir"
    cat > "$dir/userlist.txt" <<'USERS'
"postgres" ""
USERS
    cat > "$dir/pgbouncer.ini" <<INI
[databases]
* = host=$up_dir/sock port=$up_port user=postgres

[pgbouncer]
listen_addr = 127.0.0.1
listen_port = $port
unix_socket_dir = $dir
auth_type = trust
auth_file = $dir/userlist.txt
pool_mode = transaction
default_pool_size = $pool
min_pool_size = 0
reserve_pool_size = 0
max_client_conn = 200
max_db_connections = $pool
server_reset_query =
ignore_startup_parameters = extra_float_digits,application_name
logfile = $dir/pgbouncer.log
pidfile = $dir/pgbouncer.pid
INI
    chown postgres:postgres "$dir"/*
    if [ -f "$dir/pgbouncer.pid" ] && kill -0 "$(cat "$dir/pgbouncer.pid")" 2>/dev/null; then
      exit 0
    fi
    as_pg pgbouncer -d "$dir/pgbouncer.ini"
    for _ in $(seq 50); do
      [ -S "$dir/.s.PGSQL.$port" ] && exit 0
      sleep 0.1
    done
    echo "pgbouncer did not start; see $dir/pgbouncer.log" >&2
    exit 1
    ;;
  stop)
    if [ -f "$dir/pgbouncer.pid" ]; then
      pid=$(cat "$dir/pgbouncer.pid")
      kill "$pid" 2>/dev/null || true
      for _ in $(seq 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
      rm -f "$dir/pgbouncer.pid"
    fi
    ;;
  *) echo "usage: $0 start|stop DIR PORT UPSTREAM_DIR UPSTREAM_PORT [POOL_SIZE]" >&2; exit 2 ;;
esac
