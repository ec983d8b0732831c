#!/usr/bin/env bash
# The web console (`queenctl serve`) in a real headless browser: Debian's Chromium
# (scripts/deps.sh installs it) driven by puppeteer-core from npm (installed into
# tests/console/node_modules once). Screenshots of each page go to
# target/console-screenshots. Usage: console_test.sh POSTGRES_URL
set -euo pipefail
cd "$(dirname "$0")/.."
[ -x target/debug/queenctl ] || cargo build -q -p queenctl
(cd tests/console && npm install --no-audit --no-fund --loglevel=error >/dev/null)
export QUEEN_DSN=$1 QUEENCTL=$PWD/target/debug/queenctl QUEEN_CONSOLE_SHOTS=$PWD/target/console-screenshots
(cd tests/console && node --test --test-concurrency=1 console.test.mjs)
echo "console screenshots: $QUEEN_CONSOLE_SHOTS"
