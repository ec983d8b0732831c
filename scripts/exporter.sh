#!/usr/bin/env bash
# Debian's prometheus-postgres-exporter with queen's queries (prometheus/queen.yaml), in
# the background. Usage: exporter.sh start|stop DIR PORT DSN
# Metrics at http://127.0.0.1:PORT/metrics.
set -euo pipefail
cmd=$1 dir=$2 port=$3 dsn=${4:-}
root=$(cd "$(dirname "$0")/.." && pwd)
case "$cmd" in
  start)
    mkdir -p "$dir"
    if [ -f "$dir/exporter.pid" ] && kill -0 "$(cat "$dir/exporter.pid")" 2>/dev/null; then exit 0; fi
    DATA_SOURCE_NAME="$dsn" nohup prometheus-postgres-exporter \
      --web.listen-address="127.0.0.1:$port" \
      --extend.query-path="$root/prometheus/queen.yaml" \
      --disable-default-metrics --disable-settings-metrics \
      > "$dir/exporter.log" 2>&1 &
    echo $! > "$dir/exporter.pid"
    for _ in $(seq 100); do
      curl -sf "http://127.0.0.1:$port/metrics" >/dev/null 2>&1 && exit 0
      sleep 0.1
    done
    echo "postgres exporter did not start; see $dir/exporter.log" >&2
    exit 1
    ;;
  stop)
    if [ -f "$dir/exporter.pid" ]; then
      pid=$(cat "$dir/exporter.pid")
      kill "$pid" 2>/dev/null || true
      for _ in $(seq 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
      rm -f "$dir/exporter.pid"
    fi
    ;;
  *) echo "usage: $0 start|stop DIR PORT DSN" >&2; exit 2 ;;
esac
