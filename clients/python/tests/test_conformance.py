"""The shared conformance suite (clients/conformance/scenarios.json), run by this library."""
import json
import pathlib
import threading
import time

import pytest

import queen
from conftest import pop_all

SUITE = json.loads((pathlib.Path(__file__).resolve().parents[2] / "conformance" / "scenarios.json").read_text())


@pytest.mark.parametrize("s", SUITE["scenarios"], ids=[s["name"] for s in SUITE["scenarios"]])
def test_conformance(dsn, conn, queue, s):
    if "retry_limit" in s.get("queue", {}):
        conn.execute("SELECT queen.configure(%s, retry_limit => %s)", (queue, s["queue"]["retry_limit"]))
    n, parts = s["push"]["messages"], s["push"]["partitions"]
    with queen.Producer(dsn) as p:
        p.push_batch([{"payload": i, "partition": f"p{i % parts}"} for i in range(n)], queue=queue)
    h, started, ended, lock = s["handler"], [], [], threading.Lock()
    failed_once = set()

    def handle(m):
        with lock:
            started.append((m.partition, m.offset))
        try:
            if h.get("sleep_ms"):
                time.sleep(h["sleep_ms"] / 1000)
            if h.get("fail_once_at") == m.offset and m.offset not in failed_once:
                failed_once.add(m.offset)
                raise RuntimeError("fails once")
            if h.get("always_fail"):
                raise RuntimeError(h["always_fail"])
        finally:
            with lock:
                ended.append(m.offset)

    def handle_batch(ms):
        with lock:
            started.extend((m.partition, m.offset) for m in ms)
        try:
            if any(m.offset == h.get("fail_when_holds") for m in ms):
                raise RuntimeError("fails while it holds %d" % h["fail_when_holds"])
        finally:
            with lock:
                ended.extend(m.offset for m in ms)

    c = s["consumer"]
    handlers = {"batch_handler": handle_batch} if c.get("batch_handler") else {"handler": handle}
    consumer = queen.Consumer(dsn, queue, "conformance", **handlers, batch=c.get("batch", 10),
                              concurrency=c.get("workers", 1), lease_seconds=c.get("lease_seconds"), wait_ms=200,
                              check_may_start=c.get("check_may_start", True))
    t = threading.Thread(target=consumer.run, kwargs={"install_signal_handlers": False})
    t.start()
    stop, probes = s["stop"], []
    deadline = time.monotonic() + 60
    try:
        if "probe_ms" in s:
            while not started and time.monotonic() < deadline:
                time.sleep(0.01)
            t0 = time.monotonic()
            for at in s["probe_ms"]:
                time.sleep(max(0.0, t0 + at / 1000 - time.monotonic()))
                probes.append(pop_all(conn, queue, "conformance"))

        def done():
            if "handled" in stop:
                return len(ended) >= stop["handled"]
            if "started" in stop:
                return len(started) >= stop["started"]
            return conn.execute("SELECT count(*) FROM queen.dlq(%s)", (queue,)).fetchone()[0] >= stop["dead_letters"]
        while not done() and time.monotonic() < deadline:
            time.sleep(0.02)
        assert done(), f"stop condition {stop} not reached"
    finally:
        consumer.stop()
        t.join(60)
    e = s["expect"]
    if "handled" in e:
        assert [o for _, o in started] == e["handled"]
    for part, offsets in e.get("handled_per_partition", {}).items():
        assert [o for p_, o in started if p_ == part] == offsets
    if e.get("probes_empty"):
        assert probes and all(p_ == [] for p_ in probes)
    if "dlq_error_contains" in e:
        errors = [r[0] for r in conn.execute("SELECT error_message FROM queen.dlq(%s)", (queue,)).fetchall()]
        assert errors and all(e["dlq_error_contains"] in x for x in errors)
    if "dlq_payloads" in e:
        payloads = [r[0] for r in conn.execute("SELECT data FROM queen.dlq(%s) ORDER BY failed_at", (queue,))]
        assert payloads == e["dlq_payloads"]
    assert sorted(o for _, o, _ in pop_all(conn, queue, "conformance")) == e["left"]
