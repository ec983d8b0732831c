#!/usr/bin/env bash
# Installs what queen needs on a fresh Debian machine, and only what is missing:
# PostgreSQL 15 with its server headers, PgQ (a benchmark baseline), PgBouncer (the pooler
# tests and benchmark), prometheus-postgres-exporter and curl (the metrics test), Chromium and Node.js (the
# web console's browser test, the Node.js client), clang (for pgrx's bindgen), sudo (for
# `cargo pgrx test --runas`), OpenSSL's headers and command (queenctl's TLS, and its test's
# certificates), cargo-pgrx 0.18.1, and pgrx's config for Debian's pg_config.
set -euo pipefail
PG_CONFIG=/usr/lib/postgresql/15/bin/pg_config
PKGS=(postgresql-15 postgresql-server-dev-15 postgresql-15-pgq3 libclang-dev clang pkg-config sudo pgbouncer
      prometheus-postgres-exporter curl chromium nodejs libssl-dev openssl)

missing=()
for p in "${PKGS[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "deps: installing ${missing[*]}"
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null
fi

if ! cargo pgrx --version 2>/dev/null | grep -q "0.18.1"; then
  echo "deps: installing cargo-pgrx 0.18.1 (takes ~13 minutes)"
  cargo install cargo-pgrx --version 0.18.1 --locked
fi

if ! grep -qs "pg15" "${PGRX_HOME:-$HOME/.pgrx}/config.toml"; then
  cargo pgrx init --pg15 "$PG_CONFIG"
fi
