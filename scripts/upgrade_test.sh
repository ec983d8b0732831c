#!/usr/bin/env bash
# The upgrade test, as an operator upgrades: the previous release's library and install
# script (0.3.0) write data; then the current library replaces it, the server restarts,
# and pg_test/upgrade/sql/upgrade_after.sql runs ALTER EXTENSION queen UPDATE and checks
# data, behaviour and catalog. The previous library is built from its source, kept in
# sql/previous/queen-0.3.0-src.tar.gz (git archive of the commit in sql/previous/COMMIT:
# the extension crate and its core, no history needed). Needs the current one installed.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
PG_CONFIG=${PG_CONFIG:-/usr/lib/postgresql/15/bin/pg_config}
libdir=$("$PG_CONFIG" --pkglibdir)
REGRESS=$("$PG_CONFIG" --pkglibdir)/pgxs/src/test/regress/pg_regress
dir=/tmp/queen-upgrade port=5489
test -f "$libdir/queen.so" || { echo "upgrade test: install the current queen first" >&2; exit 1; }

# The previous library, built from its source.
src=target/previous-src
rm -rf "$src" && mkdir -p "$src"
tar -xzf sql/previous/queen-0.3.0-src.tar.gz -C "$src"
# Only the extension and its core were archived: drop the other workspace members.
sed -i 's/^members = .*/members = [".", "core"]/' "$src/Cargo.toml"
(cd "$src" && CARGO_TARGET_DIR="$root/target/previous" cargo build -q --lib -p queen)

current=$(mktemp /tmp/queen-current.XXXXXX.so)
cp "$libdir/queen.so" "$current"
swap_in() { rm -f "$libdir/queen.so"; install -m 755 "$1" "$libdir/queen.so"; }
# Whatever happens, the current library is what stays installed.
trap 'bash scripts/cluster.sh stop $dir $port || true; swap_in "$current"; rm -f "$current"' EXIT

bash scripts/cluster.sh stop $dir $port; rm -rf $dir
swap_in target/previous/debug/libqueen.so
bash scripts/cluster.sh start $dir $port
mkdir -p /tmp/queen-upgrade-out
run() { "$REGRESS" --host=$dir/sock --port=$port --user=postgres --inputdir=pg_test/upgrade \
          --outputdir=/tmp/queen-upgrade-out --dbname=queen_upgrade "$@" \
        || { cat /tmp/queen-upgrade-out/regression.diffs; exit 1; }; }
run upgrade_before
bash scripts/cluster.sh stop $dir $port
swap_in "$current"
bash scripts/cluster.sh start $dir $port
run --use-existing upgrade_after
