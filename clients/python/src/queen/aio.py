"""The asyncio API: ``AsyncProducer`` and ``AsyncConsumer``, the same surface and the same
semantics as ``Producer`` and ``Consumer`` (see their docs), on psycopg's
``AsyncConnection``. Handlers are coroutines; ``concurrency`` workers are tasks."""
from __future__ import annotations

import asyncio
import contextlib
import datetime as _dt
import logging
import signal
import time
import uuid
from typing import Any, Awaitable, Callable, Dict, Iterable, List, Optional

import psycopg
from psycopg.types.json import Jsonb

from . import errors, tracing
from ._common import (ACK, EXTEND, MAY_START, POP, PUSH, PUSH_BATCH, QUEUE_MODE, RELEASE, Decision, ErrorPolicy,
                      LaneResult, LoopSettings, Message, PushResult, ack_items, checked, default_error_policy,
                      LeaseClock, interval, lanes_of, lease_lost, release_unstarted, retryable, sql0105)
from .consumer import Event

log = logging.getLogger("queen")


class AsyncProducer:
    """Pushes messages on an ``AsyncConnection`` (yours: its transactions are yours), or on
    one of its own made by ``await AsyncProducer.connect(conninfo)``."""

    def __init__(self, conn: psycopg.AsyncConnection):
        self.conn = conn
        self._owned = False

    @classmethod
    async def connect(cls, conninfo: str, **kwargs: Any) -> "AsyncProducer":
        kwargs.setdefault("autocommit", True)
        kwargs.setdefault("prepare_threshold", None)
        p = cls(await psycopg.AsyncConnection.connect(conninfo, **kwargs))
        p._owned = True
        return p

    async def push(self, queue: str, payload: Any, *, partition: str = "Default",
                   transaction_id: Optional[str] = None, headers: Optional[Dict[str, Any]] = None,
                   deliver_at: Optional[_dt.datetime] = None) -> PushResult:
        with tracing.send_span(queue, headers) as h:
            try:
                cur = await self.conn.execute(PUSH, (queue, Jsonb(payload), partition, transaction_id,
                                                     None if h is None else Jsonb(h), deliver_at))
                r = await cur.fetchone()
            except psycopg.Error as e:
                errors.raise_typed(e)
        return PushResult(*r)

    async def push_batch(self, items: Iterable[Dict[str, Any]], *, queue: Optional[str] = None) -> List[PushResult]:
        out = [dict(it, **({"queue": it.get("queue", queue)} if queue else {})) for it in items]
        for it in out:
            if isinstance(it.get("deliverAt"), _dt.datetime):
                it["deliverAt"] = it["deliverAt"].isoformat()
        with tracing.send_span(str(queue or (out[0].get("queue") if out else "batch")), None) as h:
            if h and "traceparent" in h:
                for it in out:
                    it["headers"] = {"traceparent": h["traceparent"], **(it.get("headers") or {})}
            try:
                cur = await self.conn.execute(PUSH_BATCH, (Jsonb(out),))
                rows = await cur.fetchall()
            except psycopg.Error as e:
                errors.raise_typed(e)
        return [PushResult(*r) for r in rows]

    async def close(self) -> None:
        if self._owned:
            await self.conn.close()

    async def __aenter__(self) -> "AsyncProducer":
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self.close()


class AsyncConsumer(LoopSettings):
    """``Consumer`` for asyncio: ``handler`` / ``batch_handler`` are coroutine functions."""

    def __init__(self, conninfo: str, queue: str, group: str = QUEUE_MODE, *,
                 handler: Optional[Callable[[Message], Awaitable[Any]]] = None,
                 batch_handler: Optional[Callable[[List[Message]], Awaitable[Any]]] = None,
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
        self._stop = asyncio.Event()
        self._polling: set = set()
        self._hb_conn: Optional[psycopg.AsyncConnection] = None
        self._hb_lock = asyncio.Lock()
        self._warnings: Dict[int, Optional[str]] = {}  # per connection: the last SQL0105

    async def run(self, install_signal_handlers: bool = True) -> None:
        """Runs the workers until ``stop()`` (or SIGTERM / SIGINT with
        ``install_signal_handlers``)."""
        loop = asyncio.get_running_loop()
        installed = []
        if install_signal_handlers:
            for s in (signal.SIGTERM, signal.SIGINT):
                with contextlib.suppress(NotImplementedError, RuntimeError):
                    loop.add_signal_handler(s, self.stop)
                    installed.append(s)
        try:
            # Every worker finishes its claim before run() returns, even when one failed.
            results = await asyncio.gather(*(self._work() for _ in range(self.concurrency)),
                                           return_exceptions=True)
            failed = [r for r in results if isinstance(r, BaseException)]
            if failed:
                raise failed[0]
        finally:
            self.stop()
            for s in installed:
                loop.remove_signal_handler(s)
            if self._hb_conn is not None:
                await self._hb_conn.close()

    def stop(self) -> None:
        """Stops gracefully (see ``Consumer.stop``)."""
        self._stop.set()
        for conn in list(self._polling):
            with contextlib.suppress(Exception):
                conn.cancel()

    async def run_once(self) -> int:
        conn = await self._connect()
        try:
            rows = await self._pop(conn)
            if rows:
                await self._claim(conn, [Message.from_row(r) for r in rows])
            return len(rows)
        finally:
            await conn.close()

    async def _connect(self) -> psycopg.AsyncConnection:
        conn = await psycopg.AsyncConnection.connect(self.conninfo, **self.connect_kwargs)

        def notice(diag: psycopg.errors.Diagnostic) -> None:
            # Per connection: each worker task has its own.
            text = sql0105(diag)
            if text is not None:
                self._warnings[id(conn)] = text
        conn.add_notice_handler(notice)
        return conn

    async def _work(self) -> None:
        conn = None
        try:
            while not self._stop.is_set():
                try:
                    if conn is None or conn.broken:
                        conn = await self._connect()
                    rows = await self._pop(conn)
                    if rows:
                        await self._claim(conn, [Message.from_row(r) for r in rows])
                except (psycopg.Error, errors.QueenError) as e:
                    if not retryable(e):
                        raise
                    log.warning("queen: %s; going on", e)
                    if conn is not None and conn.broken:
                        await conn.close()
                        conn = None
                    with contextlib.suppress(asyncio.TimeoutError):
                        await asyncio.wait_for(self._stop.wait(), 1.0)
        finally:
            self.stop()  # one worker's error stops the others
            if conn is not None:
                await conn.close()

    async def _pop(self, conn) -> list:
        if self._stop.is_set():
            return []
        self._polling.add(conn)
        try:
            cur = await conn.execute(POP, self.params)
            return await cur.fetchall()
        except psycopg.errors.QueryCanceled:
            if self._stop.is_set():
                return []
            raise
        except psycopg.Error as e:
            errors.raise_typed(e)
        finally:
            self._polling.discard(conn)

    async def _claim(self, conn, messages: List[Message]) -> None:
        popped = time.monotonic()
        lease = messages[0].lease_id
        lanes = lanes_of(messages)
        results = [LaneResult(lane[0].partition_id) for lane in lanes]
        clock = LeaseClock.of(self.lease_seconds, messages[0], popped)
        try:
            if self.batch_handler is not None:
                await self._run_batch(conn, lanes, results, clock)
            else:
                await self._run_each(conn, lanes, results, clock)
        finally:
            release_unstarted(lanes, results)
            if lease is not None:
                await self._ack(conn, lease, results, messages)

    async def _run_each(self, conn, lanes, results, clock: LeaseClock,
                        run: Optional[Callable[[Message], Awaitable[Any]]] = None) -> None:
        run = run or self.handler
        for lane, r in zip(lanes, results):
            for m in lane:
                if self._stop.is_set() or not await self._may_start(conn, m):
                    return
                try:
                    async with self._handling(m, clock):
                        with tracing.process_span(self.queue, self.group, m):
                            await run(m)  # type: ignore[misc]
                except asyncio.CancelledError:
                    # Cancelled from outside (run() itself was): the message did not fail.
                    r.stop(m.offset, RELEASE)
                    raise
                except BaseException as exc:
                    # Started and did not finish: the policy decides (never a free retry).
                    r.stop(m.offset, self._failed(exc, m))
                    if not isinstance(exc, Exception):
                        raise
                    break
                r.complete(m.offset)

    async def _run_batch(self, conn, lanes, results, clock: LeaseClock) -> None:
        messages = [m for lane in lanes for m in lane]
        if self._stop.is_set() or not await self._may_start(conn, messages[0]):
            return
        try:
            async with self._handling(messages[0], clock):
                with tracing.process_span(self.queue, self.group, messages[0]):
                    await self.batch_handler(messages)  # type: ignore[misc]
        except asyncio.CancelledError:
            for lane, r in zip(lanes, results):
                r.stop(lane[0].offset, RELEASE)
            raise
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
                await self._extend_now(conn, messages[0], clock)
                await self._run_each(conn, lanes, results, clock,
                                     run=lambda m: self.batch_handler([m]))  # type: ignore[misc]
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

    async def _extend_now(self, conn, m: Message, clock: LeaseClock) -> None:
        """Extends the claim's lease by its length now (when the heartbeat is on)."""
        if not self.heartbeat or m.lease_id is None:
            return
        try:
            await conn.execute(EXTEND, (m.lease_id, clock.seconds))
        except psycopg.Error as e:
            errors.raise_typed(e)
        clock.extended(time.monotonic())

    @contextlib.asynccontextmanager
    async def _handling(self, m: Message, clock: LeaseClock):
        """A heartbeat task extends the lease while the handler runs (``LeaseClock``)."""
        if not self.heartbeat or m.lease_id is None:
            yield
            return

        async def beat() -> None:
            due = clock.due(time.monotonic())
            while True:
                await asyncio.sleep(max(0.0, due - time.monotonic()))
                due = clock.extended(time.monotonic())
                try:
                    async with self._hb_lock:
                        if self._hb_conn is None or self._hb_conn.broken or self._hb_conn.closed:
                            self._hb_conn = await psycopg.AsyncConnection.connect(self.conninfo, **self.connect_kwargs)
                        await self._hb_conn.execute(EXTEND, (m.lease_id, clock.seconds))
                except psycopg.Error as e:
                    log.warning("queen: heartbeat of lease %s failed: %s", m.lease_id, e)

        task = asyncio.create_task(beat())
        try:
            yield
        finally:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

    async def _may_start(self, conn, m: Message) -> bool:
        if not self.check_may_start or m.lease_id is None:
            return True
        self._warnings[id(conn)] = None
        try:
            cur = await conn.execute(MAY_START, (m.lease_id, interval(self.handler_timeout)))
            ok = (await cur.fetchone())[0]
        except psycopg.Error as e:
            errors.raise_typed(e)
        if not ok:
            warning = self._warnings.get(id(conn))
            log.warning("queen: message %s/%s may not start: %s", m.partition, m.offset,
                        warning or "may_start returned false")
            self._emit(Event("may_not_start", message=m, warning=warning))
        return bool(ok)

    def _failed(self, exc: BaseException, m: Message) -> Decision:
        return self._report(exc, m, checked(self.error_policy(exc, m)))

    def _report(self, exc: BaseException, m: Message, decision: Decision) -> Decision:
        self._emit(Event("handler_failed", message=m, error=exc, decision=decision))
        return decision

    async def _ack(self, conn, lease: uuid.UUID, results: List[LaneResult], messages: List[Message]) -> None:
        items = ack_items(results)
        if not items:
            return
        for attempt in range(3):
            try:
                cur = await conn.execute(ACK, (lease, Jsonb(items)))
                report = (await cur.fetchone())[0]
                break
            except psycopg.errors.QueryCanceled:
                if attempt == 2:
                    raise
            except psycopg.Error as e:
                errors.raise_typed(e)
        if lease_lost(report):
            self._emit(Event("lease_lost", message=messages[0]))

    def _emit(self, event: Event) -> None:
        if self.on_event is not None:
            self.on_event(event)
