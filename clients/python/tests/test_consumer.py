"""The consumer loop against a real server: order, failures, budgets, heartbeats,
concurrency, stops and crashes (docs/concepts.md, "Leases" and "Acks")."""
import os
import pathlib
import signal
import subprocess
import sys
import threading
import time

import pytest

import queen
from conftest import pop_all

WORKER = str(pathlib.Path(__file__).with_name("worker.py"))


def push(dsn, queue, n, partitions=1):
    with queen.Producer(dsn) as p:
        p.push_batch([{"payload": i, "partition": f"p{i % partitions}"} for i in range(n)], queue=queue)


def run_until(consumer, done, timeout=30):
    """Runs the consumer in a thread until done() or the timeout; then stops it."""
    t = threading.Thread(target=consumer.run, kwargs={"install_signal_handlers": False})
    t.start()
    deadline = time.monotonic() + timeout
    while not done() and time.monotonic() < deadline:
        time.sleep(0.05)
    consumer.stop()
    t.join(30)
    assert not t.is_alive()
    assert done(), "the consumer did not get there in time"


def test_order_per_partition_each_once(any_dsn, conn, queue):
    push(any_dsn, queue, 60, partitions=3)
    seen, lock = [], threading.Lock()

    def handle(m):
        with lock:
            seen.append((m.partition, m.offset, m.payload))

    c = queen.Consumer(any_dsn, queue, "g", handler=handle, batch=7, concurrency=3, wait_ms=200)
    run_until(c, lambda: len(seen) >= 60)
    assert len(seen) == 60 and len(set(seen)) == 60
    for p in ("p0", "p1", "p2"):
        offsets = [o for (q, o, _) in seen if q == p]
        assert offsets == list(range(1, 21)), (p, offsets)
    assert pop_all(conn, queue, "g") == []  # all acked


def test_failure_is_redelivered_then_completes(any_dsn, conn, queue):
    push(any_dsn, queue, 3)
    attempts, failed = [], set()

    def handle(m):
        attempts.append((m.offset, m.attempt))
        if m.offset == 2 and not failed:
            failed.add(2)
            raise ValueError("first try fails")

    events = []
    c = queen.Consumer(any_dsn, queue, "g", handler=handle, batch=10, wait_ms=200, on_event=events.append)
    run_until(c, lambda: (3, 0) in attempts)
    # 1 completes; 2 fails and is delivered again with 3 behind it, which the failed claim
    # never ran. (`attempt` counts claims that started at the same offset: the first
    # claim started at 1, the second at 2.)
    assert attempts == [(1, 0), (2, 0), (2, 0), (3, 0)]
    assert [e.kind for e in events] == ["handler_failed"]
    assert events[0].decision.status == "failed" and "first try fails" in events[0].decision.error
    assert pop_all(conn, queue, "g") == []


def test_retry_after_and_signals(dsn, conn, queue):
    push(dsn, queue, 3, partitions=3)  # p0: 0, p1: 1, p2: 2
    times = {}

    def handle(m):
        times.setdefault(m.payload, []).append(time.monotonic())
        if m.payload == 0 and m.attempt == 0:
            raise queen.RetryLater(after=1.5)
        if m.payload == 1:
            raise queen.Poison("never")

    c = queen.Consumer(dsn, queue, "g", handler=handle, max_partitions=3, wait_ms=200)
    run_until(c, lambda: len(times.get(0, [])) == 2 and 2 in times)
    assert times[0][1] - times[0][0] >= 1.4  # retry_after held the lane back
    dead = conn.execute("SELECT data, error_message FROM queen.dlq(%s)", (queue,)).fetchall()
    assert dead == [(1, "never")]


def test_dead_letter_after_the_retry_budget(dsn, conn, queue):
    conn.execute("SELECT queen.configure(%s, retry_limit => 2)", (queue,))
    push(dsn, queue, 1)
    tries = []

    def handle(m):
        tries.append(m.attempt)
        raise RuntimeError("always")

    c = queen.Consumer(dsn, queue, "g", handler=handle, wait_ms=200)
    run_until(c, lambda: conn.execute("SELECT count(*) FROM queen.dlq(%s)", (queue,)).fetchone()[0] == 1)
    assert tries == [0, 1, 2]  # two retries, then the third failure dead-letters it
    err = conn.execute("SELECT error_message FROM queen.dlq(%s)", (queue,)).fetchone()[0]
    assert "RuntimeError: always" in err


def test_heartbeat_keeps_a_slow_handlers_lease(any_dsn, conn, queue):
    push(any_dsn, queue, 1)
    runs = []

    def slow(m):
        runs.append(m.attempt)
        time.sleep(4.5)  # more than twice the 2-second lease

    c = queen.Consumer(any_dsn, queue, "g", handler=slow, lease_seconds=2, wait_ms=200)
    t = threading.Thread(target=c.run, kwargs={"install_signal_handlers": False})
    t.start()
    try:
        deadline = time.monotonic() + 30
        while not runs and time.monotonic() < deadline:
            time.sleep(0.05)
        assert runs, "the handler never started"
        # While it runs, past its first lease, nobody else may claim the message.
        for _ in range(4):
            time.sleep(1)
            assert pop_all(conn, queue, "g") == []
        time.sleep(1)  # the handler ends (4.5 s) and its claim is acked
    finally:
        c.stop()
        t.join(30)
    assert runs == [0]
    assert pop_all(conn, queue, "g") == []  # it was acked, never delivered again


@pytest.mark.parametrize("heartbeat", [True, False])
def test_run_once_heartbeat_or_expiry(dsn, conn, queue, heartbeat):
    push(dsn, queue, 1)
    started = threading.Event()

    def slow(m):
        started.set()
        time.sleep(3)

    c = queen.Consumer(dsn, queue, "g", handler=slow, lease_seconds=1, wait_ms=200, heartbeat=heartbeat)
    t = threading.Thread(target=c.run_once)
    t.start()
    assert started.wait(10)
    time.sleep(1.5)
    # Past its 1-second lease: with the heartbeat nobody else gets the message; without
    # it, the lease expired under the handler and another consumer gets it (attempt 1).
    rows = conn.execute("SELECT attempt FROM queen.pop(%s, 'g', auto_ack => true)", (queue,)).fetchall()
    t.join(30)
    assert rows == ([] if heartbeat else [(1,)])


def test_run_once_in_the_callers_transaction(dsn, conn, queue):
    """Pop, handler and ack in the caller's transaction: no heartbeat runs (its extension,
    on another connection, would wait for the lanes this transaction holds, while
    run_once waited for it), and the ack commits with the transaction."""
    push(dsn, queue, 1)
    import psycopg
    tx = psycopg.connect(dsn, prepare_threshold=None)  # not autocommit: one transaction
    c = queen.Consumer(dsn, queue, "g", handler=lambda m: time.sleep(1.5), lease_seconds=3, wait_ms=200)
    t = threading.Thread(target=c.run_once, args=(tx,))
    t.start()
    t.join(20)
    try:
        assert not t.is_alive(), "run_once waited for its own transaction"
        tx.commit()
    finally:
        tx.close()
    assert pop_all(conn, queue, "g") == []  # acked with the commit


def test_may_start_no_releases_the_claim_with_the_servers_warning(dsn, conn, queue):
    push(dsn, queue, 3)
    events, ran = [], []
    c = queen.Consumer(dsn, queue, "g", handler=ran.append, batch=3, lease_seconds=2, handler_timeout=5,
                       wait_ms=1000, on_event=events.append)
    assert c.run_once() == 3
    assert ran == []
    assert [e.kind for e in events] == ["may_not_start"]
    assert events[0].warning.startswith("SQL0105: queued message has insufficient lease time")
    # Released at once with `retry`, not left to expire: all three are claimable now.
    assert [r[1] for r in pop_all(conn, queue, "g")] == [1, 2, 3]


def test_lease_budget_lets_a_handler_start(dsn, conn, queue):
    conn.execute("SELECT queen.configure_group(%s, 'g', queue_margin => '1 s', handler_timeout => '3 s',"
                 " timeout_grace => '0 s', record_margin => '1 s')", (queue,))
    push(dsn, queue, 2)
    ran, events = [], []
    c = queen.Consumer(dsn, queue, "g", handler=lambda m: (ran.append(m.offset), time.sleep(1.2)), batch=2,
                       heartbeat=False, wait_ms=1000, on_event=events.append)
    # The budget: a 5-s lease; a start needs 4 s. The first starts; the second, 1.2 s
    # later, may not, and goes back.
    assert c.run_once() == 2
    assert ran == [1] and [e.kind for e in events] == ["may_not_start"]
    assert [r[1] for r in pop_all(conn, queue, "g")] == [2]


def test_concurrency_runs_handlers_at_once(dsn, conn, queue):
    push(dsn, queue, 4, partitions=4)
    barrier = threading.Barrier(4, timeout=20)
    done = []

    def handle(m):
        barrier.wait()  # passes only when four handlers run at the same time
        done.append(m.payload)

    c = queen.Consumer(dsn, queue, "g", handler=handle, concurrency=4, wait_ms=200)
    run_until(c, lambda: len(done) == 4)
    assert sorted(done) == [0, 1, 2, 3]


def test_batch_handler(dsn, conn, queue):
    push(dsn, queue, 6, partitions=2)
    batches = []

    def handle(ms):
        batches.append([(m.partition, m.offset) for m in ms])
        if len(batches) == 1:
            raise RuntimeError("the whole batch fails once")

    c = queen.Consumer(dsn, queue, "g", batch_handler=handle, batch=6, max_partitions=2, wait_ms=200)
    run_until(c, lambda: sum(len(b) for b in batches) >= 12)
    claim = [("p0", 1), ("p0", 2), ("p0", 3), ("p1", 1), ("p1", 2), ("p1", 3)]
    assert sorted(batches[0]) == claim
    # The failed batch runs again within its claim, one message at a time, in lane order;
    # every one completes, so nothing is left.
    assert all(len(b) == 1 for b in batches[1:]) and sorted(b[0] for b in batches[1:]) == claim
    assert [b[0] for b in batches[1:4]] in (claim[:3], claim[3:])
    assert pop_all(conn, queue, "g") == []


def _log(path):
    return path.read_text().split("\n") if path.exists() else []


def test_sigterm_stops_gracefully(any_dsn, conn, queue, tmp_path):
    push(any_dsn, queue, 5)
    log = tmp_path / "log"
    proc = subprocess.Popen([sys.executable, WORKER, any_dsn, queue, "g", str(log), "600", "1.5"],
                            stdout=subprocess.PIPE, text=True, env={**os.environ, "PYTHONPATH": str(pathlib.Path(WORKER).parent)})
    deadline = time.monotonic() + 30
    while "start 1" not in _log(log) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert "start 1" in _log(log)
    proc.send_signal(signal.SIGTERM)
    out, _ = proc.communicate(timeout=30)
    assert proc.returncode == 0 and "stopped" in out
    # The running handler finished and was acked; the rest of the claim was released,
    # not left under its 600-second lease.
    assert [l for l in _log(log) if l] == ["start 1", "done 1"]
    assert [r[1] for r in pop_all(conn, queue, "g")] == [2, 3, 4, 5]


def test_sigterm_cancels_a_long_poll(dsn, conn, queue, tmp_path):
    app = f"queen-{queue}"
    proc = subprocess.Popen([sys.executable, "-c", (
        "import queen, sys; c = queen.Consumer(sys.argv[1], sys.argv[2], handler=print, wait_ms=60000,"
        " application_name=sys.argv[3]); c.run(); print('stopped', flush=True)"), dsn, queue, app],
        stdout=subprocess.PIPE, text=True)
    # Wait until its pop is running on the server: a SIGTERM then has a long-poll to cancel.
    deadline = time.monotonic() + 30
    polling = False
    while time.monotonic() < deadline and not polling:
        polling = conn.execute(
            "SELECT count(*) > 0 FROM pg_stat_activity WHERE application_name = %s AND state = 'active'"
            " AND query LIKE '%%queen.pop%%'", (app,)).fetchone()[0]
        time.sleep(0.05)
    assert polling, "the consumer's long-poll never showed up"
    t0 = time.monotonic()
    proc.send_signal(signal.SIGTERM)
    out, _ = proc.communicate(timeout=30)
    assert proc.returncode == 0 and "stopped" in out
    assert time.monotonic() - t0 < 20  # it did not wait out the 60-second long-poll


def test_a_killed_worker_is_redelivered_after_its_lease(any_dsn, conn, queue, tmp_path):
    push(any_dsn, queue, 1)
    log = tmp_path / "log"
    proc = subprocess.Popen([sys.executable, WORKER, any_dsn, queue, "g", str(log), "2", "60"])
    deadline = time.monotonic() + 30
    while "start 1" not in _log(log) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert "start 1" in _log(log)
    proc.kill()  # kill -9 mid-handler
    proc.wait()
    got = []
    c = queen.Consumer(any_dsn, queue, "g", handler=got.append, wait_ms=8000)
    assert c.run_once() == 1
    assert [(m.offset, m.attempt) for m in got] == [(1, 1)]


def test_which_errors_the_loop_goes_on_after():
    """Lost connections, class 40, 57014, and the server's "retry later" states (53400, a
    full shared-memory table; 55P03, a lock_timeout) keep the loop going; a bad argument
    stops it."""
    from queen._common import retryable
    for state in ("08006", "40001", "40P01", "57014", "57P01", "53400", "55P03"):
        assert retryable(queen.QueenError("x", sqlstate=state)), state
    for state in ("22023", "42501", "0A000"):
        assert not retryable(queen.QueenError("x", sqlstate=state)), state


def test_lease_clock():
    """A running handler's lease is extended a third of the lease after it started, then
    every third; at once when less than a third is left."""
    from queen._common import LeaseClock
    c = LeaseClock(30, expires=100.0)  # a 30 s lease that ends at t = 100
    assert c.due(started=70.0) == 80.0  # 30 s left at the start: a third of it in
    assert c.due(started=85.0) == 90.0  # 15 s left: when 10 are left
    assert c.due(started=95.0) == 90.0  # 5 s left: overdue, at once
    assert c.extended(at=95.0) == 105.0 and c.expires == 125.0
