#!/usr/bin/env bash
# Builds a release package of the extension for the PostgreSQL that PG_CONFIG names:
#   dist/queen-<version>-pg<major>-<arch>.tar.gz  (files rooted at /, extract with tar -C /)
#   dist/postgresql-<major>-queen_<version>_<arch>.deb
# `cargo pgrx package` lays the files out; this script wraps them.
set -euo pipefail
cd "$(dirname "$0")/.."
PG_CONFIG=${PG_CONFIG:-/usr/lib/postgresql/15/bin/pg_config}
major=$("$PG_CONFIG" --version | sed -E 's/^PostgreSQL ([0-9]+).*/\1/')
version=$(sed -nE 's/^version = "([^"]+)"/\1/p' Cargo.toml | head -1)
arch=$(dpkg --print-architecture 2>/dev/null || uname -m)

cargo pgrx package --pg-config "$PG_CONFIG"
root="target/release/queen-pg${major}"
test -f "$root$("$PG_CONFIG" --pkglibdir)/queen.so" || { echo "package: no queen.so under $root" >&2; exit 1; }
# The upgrade to this version: generated from its install script and the hand-written part.
ext="$root$("$PG_CONFIG" --sharedir)/extension"
for hand in sql/upgrade/queen--*--*.sql; do
  python3 scripts/upgrade_sql.py "$ext/queen--${hand##*--}" "$hand" > "$ext/.upgrade.tmp"
  mv "$ext/.upgrade.tmp" "$ext/$(basename "$hand")"
done

mkdir -p dist
tarball="dist/queen-${version}-pg${major}-${arch}.tar.gz"
tar -C "$root" -czf "$tarball" .

# A .deb of the same files.
stage=$(mktemp -d)
trap 'rm -rf "$stage"' EXIT
cp -a "$root/." "$stage/"
mkdir -p "$stage/DEBIAN"
cat > "$stage/DEBIAN/control" <<CONTROL
Package: postgresql-${major}-queen
Version: ${version}
Architecture: ${arch}
Maintainer: queen developers <queen@localhost>
Depends: postgresql-${major}
Section: database
Priority: optional
Description: queen, a message queue inside PostgreSQL
 Push, pop with leases, acks, retries and a dead-letter queue, as SQL functions.
 Add shared_preload_libraries = 'queen' for long-poll wake-ups, then
 CREATE EXTENSION queen.
CONTROL
deb="dist/postgresql-${major}-queen_${version}_${arch}.deb"
dpkg-deb --root-owner-group --build "$stage" "$deb" >/dev/null
echo "built $tarball"
echo "built $deb"
