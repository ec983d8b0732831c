#!/usr/bin/env bash
# Runs the README's client examples (clients/) against a real cluster: Python with
# psycopg 3 and with SQLAlchemy text(), Node.js with node-postgres. Installs the clients
# from PyPI and npm into clients/.venv and clients/node/node_modules once (idempotent).
# Usage: clients.sh POSTGRES_URL
set -euo pipefail
cd "$(dirname "$0")/.."
url=$1
python3 scripts/readme_clients.py   # the README shows these files verbatim
if [ ! -x clients/.venv/bin/python ]; then python3 -m venv clients/.venv; fi
clients/.venv/bin/pip install -q --disable-pip-version-check -r clients/python/requirements.txt
(cd clients/node && npm install --no-audit --no-fund --loglevel=error >/dev/null)
export QUEEN_DSN="$url"
clients/.venv/bin/python clients/python/core_loop.py
clients/.venv/bin/python clients/python/sqlalchemy_loop.py
node clients/node/core_loop.js
