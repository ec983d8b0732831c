#!/usr/bin/env bash
# Builds and installs Citus 13.2.2 into Debian's PostgreSQL 15, from the vendored source
# archive (a `git archive` of upstream tag v13.2.2; no package registry serves it here).
# Does nothing when Citus 13.2.2 is installed already. Only the targets that need Citus
# call this (make citus-test), never `make run`.
#
# The archive: $CITUS_TARBALL, else citus-13.2.2.tar.gz in a `shared/vendor` folder next to
# the repository (../shared/vendor) or at /work/shared/vendor. Its sha256 is checked.
set -euo pipefail
PG_CONFIG=/usr/lib/postgresql/15/bin/pg_config
VERSION=13.2.2
SHA256=c8fc76dc8294636a52b1a0dd75a20d8b4a36937df6443e30ca84d8d0464a6bb9
root=$(cd "$(dirname "$0")/.." && pwd)

if grep -qs "default_version = '${VERSION%.*}" "$($PG_CONFIG --sharedir)/extension/citus.control" \
   && [ -f "$($PG_CONFIG --pkglibdir)/citus.so" ] \
   && grep -qs "$VERSION" "$($PG_CONFIG --pkglibdir)/citus.so"; then
  exit 0
fi

tarball=${CITUS_TARBALL:-}
if [ -z "$tarball" ]; then
  for c in "$root/../shared/vendor/citus-$VERSION.tar.gz" "/work/shared/vendor/citus-$VERSION.tar.gz"; do
    if [ -f "$c" ]; then tarball=$c; break; fi
  done
fi
if [ -z "$tarball" ] || [ ! -f "$tarball" ]; then
  echo "citus: citus-$VERSION.tar.gz not found (set CITUS_TARBALL)" >&2
  exit 1
fi
echo "$SHA256  $tarball" | sha256sum -c --quiet - || { echo "citus: $tarball: wrong sha256" >&2; exit 1; }

# Build dependencies, from Debian, only the missing ones.
PKGS=(liblz4-dev libzstd-dev libcurl4-openssl-dev libkrb5-dev libssl-dev postgresql-server-dev-15 make gcc)
missing=()
for p in "${PKGS[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "citus: installing ${missing[*]}"
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null
fi

build=/var/tmp/queen-citus-build
rm -rf "$build"
mkdir -p "$build"
tar -xzf "$tarball" -C "$build"
src="$build/citus-$VERSION"
# Debian's PostgreSQL 15 headers (15.20 and later) declare have_createdb_privilege(),
# which Citus 13.2.2 still defines as a static function for servers before 16: the
# declarations clash. Rename Citus's copy (unused then), only when the header declares it.
if grep -q 'have_createdb_privilege' "$($PG_CONFIG --includedir-server)/commands/dbcommands.h"; then
  sed -i 's/^have_createdb_privilege(void)$/citus_unused_have_createdb_privilege(void)/' \
    "$src/src/include/pg_version_compat.h"
  grep -q '^citus_unused_have_createdb_privilege(void)$' "$src/src/include/pg_version_compat.h" \
    || { echo "citus: the have_createdb_privilege patch did not apply" >&2; exit 1; }
fi
echo "citus: building $VERSION (about a minute on two cores)"
(cd "$src" && ./configure -q PG_CONFIG="$PG_CONFIG" >/dev/null && make -s -j2 >/dev/null && make -s install >/dev/null)
rm -rf "$build"
echo "citus: installed $VERSION"
