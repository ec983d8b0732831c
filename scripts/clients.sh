#!/usr/bin/env bash
# Runs the README's client examples (clients/) against a real cluster: Python with
# psycopg 3 and with SQLAlchemy text(), Node.js with node-postgres. Installs the clients
# from PyPI and npm into clients/.venv and clients/node/node_modules once (idempotent).
# Then the Python package (clients/python: a wheel built with the standard tools, the
# package installed from it, its pytest suite) and the Node.js package (clients/node:
# built with tsc, node's test runner), each directly and through PgBouncer when a pooler
# URL is given (QUEEN_POOLER_DSN for Python, QUEEN_POOLER_URL for Node: the same URL).
# Usage: clients.sh POSTGRES_URL [POOLER_URL]
set -euo pipefail
cd "$(dirname "$0")/.."
url=$1
pooler=${2:-}
python3 scripts/readme_clients.py   # the README shows these files verbatim
if [ ! -x clients/.venv/bin/python ]; then python3 -m venv clients/.venv; fi
clients/.venv/bin/pip install -q --disable-pip-version-check -r clients/python/requirements.txt
(cd clients/node && npm install --no-audit --no-fund --loglevel=error >/dev/null && npm run -s build)
export QUEEN_DSN="$url"
clients/.venv/bin/python clients/python/core_loop.py
clients/.venv/bin/python clients/python/sqlalchemy_loop.py
node clients/node/core_loop.js

# The Python package: build the wheel (pip's standard PEP 517 build), install it, test it.
clients/.venv/bin/pip install -q --disable-pip-version-check -r clients/python/requirements-test.txt
rm -rf clients/python/dist
clients/.venv/bin/pip wheel -q --disable-pip-version-check --no-deps -w clients/python/dist ./clients/python
clients/.venv/bin/pip install -q --disable-pip-version-check --force-reinstall --no-deps clients/python/dist/queen_pg-*.whl
(cd clients/python && QUEEN_DSN="$url" QUEEN_POOLER_DSN="$pooler" ../.venv/bin/python -m pytest -q -p no:cacheprovider)

# The Node.js package (clients/node): built above (tsc: JavaScript plus .d.ts); node's
# test runner against the cluster, directly and through PgBouncer.
(cd clients/node && QUEEN_DSN="$url" QUEEN_POOLER_URL="$pooler" node --test --test-concurrency=1 test/*.test.mjs)
