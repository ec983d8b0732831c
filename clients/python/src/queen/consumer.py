"""Consumer: the loop a team would otherwise write (docs/concepts.md, "Leases" and "Acks").

Each of ``concurrency`` workers has a connection of its own and repeats: a long-poll
``queen.pop`` (autocommit: the claim is the lease, not a transaction), the handler on each
message of the claim in partition order, then one ``queen.ack`` for the whole claim.

- A message whose handler returns completes. One that raises is acked as the error
  policy decides (``failed`` by default, with an optional ``retry_after``; ``retry`` for
  ``RetryLater``; ``dlq`` for ``Poison``), and the rest of its lane is not run: the ack's
  lowest explicit signal decides the lane, and what follows is delivered again.
- Before each message the worker asks ``queen.may_start`` whether the lease still has time
  for a handler (the group's lease budget, or ``handler_timeout``). When it says no, the
  server's ``SQL0105`` warning is surfaced (an event and a log record, as the server sent
  it) and the message and the rest of the claim are released with ``retry``: they come
  back at once, to this worker or another.
- While a handler runs, a heartbeat extends the lease (``queen.extend_lease``): a third of
  the lease after the handler started, then every third, and at once when less than a
  third of the lease is left, so a slow handler keeps its messages, also one that started
  late in the lease. Waiting messages do not extend it. A batch handler that
  raises is run again one message at a time, within the same claim, so that only the
  message that fails is charged (``failed``, ``dlq``); a ``retry`` decision applies to the
  whole claim.
- ``stop()`` (and SIGTERM or SIGINT while ``run()`` runs in the main thread) stops
  gracefully: no new pops (a long-poll in progress is cancelled), running handlers
  finish, and the messages of a claim that were not started are released with ``retry``.
- A worker that dies (kill -9, a crash) leaves its lease to expire: its messages are then
  delivered again, with ``attempt`` counting it.
"""
from __future__ import annotations

import contextlib
import dataclasses
import logging
import signal
import threading
import time
import uuid
from typing import Any, Callable, Dict, List, Optional

import psycopg
from psycopg.types.json import Jsonb

from . import errors, tracing
from ._common import (ACK, EXTEND, MAY_START, POP, QUEUE_MODE, Decision, ErrorPolicy, LaneResult, LoopSettings,
                      LeaseClock, Message, ack_items, checked, default_error_policy, interval, lanes_of, lease_lost,
                      release_unstarted, retryable, sql0105)

log = logging.getLogger("queen")


@dataclasses.dataclass(frozen=True)
class Event:
    """Something the loop reports to ``on_event``.

    - ``may_not_start``: ``queen.may_start`` said no; ``warning`` is the server's SQL0105
      text (message and DETAIL) when the session saw it.
    - ``handler_failed``: a handler raised; ``error`` is the exception, ``decision`` the ack.
    - ``lease_lost``: the ack found the lease expired or replaced; its messages will be
      (or were) delivered again.
    """
    kind: str
    message: Optional[Message] = None
    warning: Optional[str] = None
    error: Optional[BaseException] = None
    decision: Optional[Decision] = None


class _Heartbeat:
    """Extends the leases whose handlers are running (``LeaseClock``), on a connection of
    its own."""

    def __init__(self, connect: Callable[[], psycopg.Connection]):
        self._connect = connect
        self._leases: Dict[uuid.UUID, tuple] = {}  # lease -> (its clock, next extension due)
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._stop = False
        self._thread: Optional[threading.Thread] = None

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="queen-heartbeat", daemon=True)
        self._thread.start()

    def watch(self, lease: uuid.UUID, clock: LeaseClock) -> None:
        """Extends ``lease`` while a handler runs, as ``clock`` says, until ``unwatch``."""
        with self._lock:
            self._leases[lease] = (clock, clock.due(time.monotonic()))
            if self._thread is None:
                self.start()
        self._wake.set()

    def unwatch(self, lease: uuid.UUID) -> None:
        with self._lock:
            self._leases.pop(lease, None)

    def close(self) -> None:
        self._stop = True
        self._wake.set()
        if self._thread:
            self._thread.join()
        self._thread, self._stop = None, False

    def _run(self) -> None:
        conn = None
        while not self._stop:
            with self._lock:
                now = time.monotonic()
                due = [(l, c) for l, (c, t) in self._leases.items() if t <= now]
                for l, c in due:
                    self._leases[l] = (c, c.extended(now))
                nxt = min((t for _, t in self._leases.values()), default=now + 1.0)
            for lease, clock in due:
                try:
                    conn = conn or self._connect()
                    conn.execute(EXTEND, (lease, clock.seconds))
                except psycopg.Error as e:  # the ack or the expiry decides; say so and go on
                    log.warning("queen: heartbeat of lease %s failed: %s", lease, e)
                    if conn is not None and conn.broken:
                        conn = None
            self._wake.wait(max(0.05, nxt - time.monotonic()))
            self._wake.clear()
        if conn is not None:
            conn.close()


class Consumer(LoopSettings):
    """Consumes ``queue`` as consumer group ``group``.

    Give either ``handler(message)`` (one message at a time; return to complete it, raise to
    fail it) or ``batch_handler(messages)`` (a whole claim at once; when it raises, it is
    called again with one message at a time, so that only a message that fails is charged). ``conninfo`` is a libpq string or URL; through PgBouncer in
    transaction mode it works as it is (prepared statements are off by default).
    """

    def __init__(self, conninfo: str, queue: str, group: str = QUEUE_MODE, *,
                 handler: Optional[Callable[[Message], Any]] = None,
                 batch_handler: Optional[Callable[[List[Message]], Any]] = None,
                 batch: int = 10, concurrency: int = 1, wait_ms: int = 2000,
                 lease_seconds: Optional[int] = None, partition: Optional[str] = None,
                 max_partitions: int = 1, handler_timeout: Optional[float] = None,
                 check_may_start: bool = True, heartbeat: bool = True,
                 error_policy: ErrorPolicy = default_error_policy,
                 on_event: Optional[Callable[[Event], None]] = None,
                 **connect_kwargs: Any):
        self._settle_settings(conninfo, queue, group, handler, batch_handler, batch, concurrency, wait_ms,
                              lease_seconds, partition, max_partitions, handler_timeout, check_may_start,
                              heartbeat, error_policy, on_event, connect_kwargs)
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._polling: set = set()  # connections in a pop, cancelled by stop()
        self._heartbeat = _Heartbeat(self._connect) if heartbeat else None
        self._local = threading.local()  # per worker: the last SQL0105 warning seen

    # ---- running ------------------------------------------------------------------------

    def run(self, install_signal_handlers: bool = True) -> None:
        """Runs the workers until ``stop()`` (or SIGTERM / SIGINT, when called from the
        main thread with ``install_signal_handlers``). Returns once every worker has
        acked its last claim."""
        old = {}
        if install_signal_handlers and threading.current_thread() is threading.main_thread():
            for s in (signal.SIGTERM, signal.SIGINT):
                old[s] = signal.signal(s, lambda *_: self.stop())
        errors_seen: List[BaseException] = []
        workers = [threading.Thread(target=self._work, args=(errors_seen,), name=f"queen-worker-{i}")
                   for i in range(self.concurrency)]
        try:
            for w in workers:
                w.start()
            while any(w.is_alive() for w in workers):
                for w in workers:
                    w.join(0.1)
        finally:
            self.stop()
            for w in workers:
                w.join()
            if self._heartbeat:
                self._heartbeat.close()
            for s, h in old.items():
                signal.signal(s, h)
        if errors_seen:
            raise errors_seen[0]

    def stop(self) -> None:
        """Stops gracefully: no new pops; running handlers finish; what was not started is
        released. Safe from a signal handler and from any thread."""
        self._stop.set()
        with self._lock:
            polling = list(self._polling)
        for conn in polling:  # (not under the lock: a second signal may call stop() again)
            try:
                (getattr(conn, "cancel_safe", None) or conn.cancel)()
            except Exception:  # the pop ends by itself at its wait_ms
                pass

    @property
    def stopping(self) -> bool:
        return self._stop.is_set()

    def run_once(self, conn: Optional[psycopg.Connection] = None) -> int:
        """One pop and its claim, on ``conn`` or a connection of its own; returns how many
        messages the pop delivered (0: nothing came within ``wait_ms``). When ``conn`` is in
        a transaction (the pop, the handlers and the ack commit with it), no heartbeat runs:
        its extension, on another connection, would wait for that transaction's lanes."""
        own = conn is None
        conn = conn or self._connect()
        try:
            rows = self._pop(conn)
            if rows:
                in_tx = conn.info.transaction_status != psycopg.pq.TransactionStatus.IDLE
                self._claim(conn, [Message.from_row(r) for r in rows], heartbeat=not in_tx)
            return len(rows)
        finally:
            if own:
                conn.close()
            if self._heartbeat:
                self._heartbeat.close()

    # ---- one worker ---------------------------------------------------------------------

    def _connect(self) -> psycopg.Connection:
        conn = psycopg.connect(self.conninfo, **self.connect_kwargs)
        conn.add_notice_handler(self._notice)
        return conn

    def _notice(self, diag: psycopg.errors.Diagnostic) -> None:
        text = sql0105(diag)
        if text is not None:
            self._local.warning = text

    def _work(self, errors_seen: List[BaseException]) -> None:
        conn = None
        try:
            while not self._stop.is_set():
                try:
                    conn = conn if conn is not None and not conn.broken else self._connect()
                    rows = self._pop(conn)
                    if rows:
                        self._claim(conn, [Message.from_row(r) for r in rows])
                except (psycopg.Error, errors.QueenError) as e:
                    if not retryable(e):
                        raise
                    # A lost connection (a restart, a pooler), a deadlock, a timeout: a claim
                    # not acked comes back when its lease expires. Go on after a pause, on a
                    # new connection if this one is gone.
                    log.warning("queen: %s; going on", e)
                    if conn is not None and conn.broken:
                        conn.close()
                        conn = None
                    self._stop.wait(1.0)
        except BaseException as e:  # noqa: BLE001 - reported by run()
            errors_seen.append(e)
            self._stop.set()
        finally:
            if conn is not None:
                conn.close()

    def _pop(self, conn: psycopg.Connection) -> list:
        with self._lock:
            if self._stop.is_set():
                return []
            self._polling.add(conn)
        try:
            return conn.execute(POP, self.params).fetchall()
        except psycopg.errors.QueryCanceled:
            if self._stop.is_set():
                return []
            raise
        except psycopg.Error as e:
            errors.raise_typed(e)
        finally:
            with self._lock:
                self._polling.discard(conn)

    def _claim(self, conn: psycopg.Connection, messages: List[Message], heartbeat: bool = True) -> None:
        popped = time.monotonic()
        lease = messages[0].lease_id
        lanes = lanes_of(messages)
        results = [LaneResult(lane[0].partition_id) for lane in lanes]
        clock = LeaseClock.of(self.lease_seconds, messages[0], popped) if heartbeat else None
        try:
            if self.batch_handler is not None:
                self._run_batch(conn, lanes, results, clock)
            else:
                self._run_each(conn, lanes, results, clock)
        finally:
            release_unstarted(lanes, results)
            if lease is not None:
                self._ack(conn, lease, results, messages)

    def _run_each(self, conn, lanes, results, clock: Optional[LeaseClock],
                  run: Optional[Callable[[Message], Any]] = None) -> None:
        run = run or self.handler
        for lane, r in zip(lanes, results):
            for m in lane:
                if self._stop.is_set() or not self._may_start(conn, m):
                    return
                try:
                    with self._handling(m, clock), tracing.process_span(self.queue, self.group, m):
                        run(m)  # type: ignore[misc]
                except BaseException as exc:
                    # Started and did not finish: the policy decides (never a free retry).
                    r.stop(m.offset, self._failed(exc, m))
                    if not isinstance(exc, Exception):
                        raise
                    break
                r.complete(m.offset)

    def _run_batch(self, conn, lanes, results, clock: Optional[LeaseClock]) -> None:
        messages = [m for lane in lanes for m in lane]
        if self._stop.is_set() or not self._may_start(conn, messages[0]):
            return
        try:
            with self._handling(messages[0], clock), tracing.process_span(self.queue, self.group, messages[0]):
                self.batch_handler(messages)  # type: ignore[misc]
        except BaseException as exc:
            decision = checked(self.error_policy(exc, messages[0]))
            if decision.status == "retry" and isinstance(exc, Exception):
                # A free retry: every lane from its first, with the one decision.
                self._report(exc, messages[0], decision)
                for lane, r in zip(lanes, results):
                    r.stop(lane[0].offset, decision)
                return
            if isinstance(exc, Exception) and len(messages) > 1:
                # Which message failed is not known, and charging each lane's first would
                # dead-letter (or drop) messages that may be sound: run the claim again one
                # message at a time, on a lease extended for it, so that only a message
                # that fails is charged.
                self._extend_now(conn, messages[0], clock)
                self._run_each(conn, lanes, results, clock, run=lambda m: self.batch_handler([m]))  # type: ignore[misc]
                if any(r.completed is not None or r.stopped is not None for r in results):
                    return
                # Not one could start (may_start, a stop): charge the first lane's first
                # message, so that a batch that always fails is not handed back free for ever.
            results[0].stop(lanes[0][0].offset, self._failed(exc, lanes[0][0]))
            if not isinstance(exc, Exception):
                raise
            return
        for lane, r in zip(lanes, results):
            r.complete(lane[-1].offset)

    def _extend_now(self, conn, m: Message, clock: Optional[LeaseClock]) -> None:
        """Extends the claim's lease by its length now (when the heartbeat is on)."""
        if clock is None or m.lease_id is None or self._heartbeat is None:
            return
        try:
            conn.execute(EXTEND, (m.lease_id, clock.seconds))
        except psycopg.Error as e:
            errors.raise_typed(e)
        clock.extended(time.monotonic())

    @contextlib.contextmanager
    def _handling(self, m: Message, clock: Optional[LeaseClock]):
        """The heartbeat for the lease while a handler runs (``LeaseClock``)."""
        hb, lease = self._heartbeat, m.lease_id
        if hb is None or lease is None or clock is None:
            yield
            return
        hb.watch(lease, clock)
        try:
            yield
        finally:
            hb.unwatch(lease)

    def _may_start(self, conn: psycopg.Connection, m: Message) -> bool:
        if not self.check_may_start or m.lease_id is None:
            return True
        self._local.warning = None
        try:
            ok = conn.execute(MAY_START, (m.lease_id, interval(self.handler_timeout))).fetchone()[0]
        except psycopg.Error as e:
            errors.raise_typed(e)
        if not ok:
            warning = getattr(self._local, "warning", None)
            log.warning("queen: message %s/%s may not start: %s", m.partition, m.offset,
                        warning or "may_start returned false")
            self._emit(Event("may_not_start", message=m, warning=warning))
        return bool(ok)

    def _failed(self, exc: BaseException, m: Message) -> Decision:
        return self._report(exc, m, checked(self.error_policy(exc, m)))

    def _report(self, exc: BaseException, m: Message, decision: Decision) -> Decision:
        log.info("queen: handler failed on %s/%s: %r -> %s", m.partition, m.offset, exc, decision.status)
        self._emit(Event("handler_failed", message=m, error=exc, decision=decision))
        return decision

    def _ack(self, conn, lease: uuid.UUID, results: List[LaneResult], messages: List[Message]) -> None:
        items = ack_items(results)
        if not items:
            return
        for attempt in range(3):
            try:
                report = conn.execute(ACK, (lease, Jsonb(items))).fetchone()[0]
                break
            except psycopg.errors.QueryCanceled:
                # A stop's cancel that came late: try again (twice).
                if attempt == 2:
                    raise
            except psycopg.Error as e:
                errors.raise_typed(e)
        if lease_lost(report):
            self._emit(Event("lease_lost", message=messages[0]))

    def _emit(self, event: Event) -> None:
        if self.on_event is not None:
            self.on_event(event)
