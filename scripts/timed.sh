#!/usr/bin/env bash
# Runs make targets in order, stopping at the first failure, and prints how long each
# took: `make test` runs its layers through this, so the time of each layer shows.
# Once install-debug has run, later targets that depend on it do not build it again.
set -uo pipefail
cd "$(dirname "$0")/.."
make=${MAKE:-make}
extra=()
times=()
total=0
for target in "$@"; do
  start=$(date +%s)
  if ! "$make" --no-print-directory "${extra[@]}" "$target"; then
    echo "make $target: FAILED after $(( $(date +%s) - start )) s" >&2
    exit 1
  fi
  took=$(( $(date +%s) - start ))
  total=$(( total + took ))
  times+=("$(printf '%-16s %5d s' "$target" "$took")")
  [ "$target" = install-debug ] && extra=(-o install-debug)
done
echo "time per layer:"
printf '  %s\n' "${times[@]}"
printf '  %-16s %5d s\n' total "$total"
