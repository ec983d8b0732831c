"""Fixtures: a real cluster with queen (QUEEN_DSN), and PgBouncer in transaction mode in
front of it (QUEEN_POOLER_DSN). `make test` starts both (scripts/clients.sh)."""
import os
import uuid

import psycopg
import pytest

DSN = os.environ.get("QUEEN_DSN", "host=/tmp/queen-test/sock port=5487 user=postgres dbname=queen_it")
POOLER_DSN = os.environ.get("QUEEN_POOLER_DSN")


@pytest.fixture
def dsn():
    return DSN


def _dsns():
    out = [pytest.param(DSN, id="direct")]
    out.append(pytest.param(POOLER_DSN, id="pgbouncer",
                            marks=pytest.mark.skipif(not POOLER_DSN, reason="QUEEN_POOLER_DSN not set")))
    return out


@pytest.fixture(params=_dsns())
def any_dsn(request):
    """Each test using it runs directly and through PgBouncer."""
    return request.param


@pytest.fixture
def queue():
    return f"py-{uuid.uuid4().hex[:12]}"


@pytest.fixture
def conn():
    with psycopg.connect(DSN, autocommit=True) as c:
        yield c


def pop_all(conn, queue, group="__QUEUE_MODE__", wait_ms=0):
    """Every message a fresh pop can claim now (auto-ack): [(partition, offset, payload)]."""
    rows = conn.execute(
        "SELECT partition, msg_offset, payload FROM queen.pop(%s, %s, batch => 1000, max_partitions => 100,"
        " wait_ms => %s, auto_ack => true)", (queue, group, wait_ms)).fetchall()
    return [tuple(r) for r in rows]
