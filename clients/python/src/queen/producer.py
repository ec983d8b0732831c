"""Producer: ``push`` and ``push_batch``, on a connection of its own or on the caller's.

On the caller's connection a push is part of the caller's transaction: it commits with the
application's own writes or not at all (the outbox pattern)::

    with conn.transaction():
        conn.execute("INSERT INTO orders ...")
        Producer(conn).push("orders", {"id": 7})
"""
from __future__ import annotations

import datetime as _dt
from typing import Any, Dict, Iterable, List, Optional, Union

import psycopg
from psycopg.types.json import Jsonb

from . import errors, tracing
from ._common import PUSH, PUSH_BATCH, PushResult


def _result(r) -> PushResult:
    return PushResult(r[0], r[1], r[2], r[3], r[4], r[5])


class Producer:
    """Pushes messages. Give it a ``psycopg.Connection`` (its transactions are yours) or a
    conninfo string (it opens an autocommit connection of its own; ``close()`` it)."""

    def __init__(self, conn: Union[str, psycopg.Connection], **connect_kwargs: Any):
        if isinstance(conn, str):
            connect_kwargs.setdefault("autocommit", True)
            connect_kwargs.setdefault("prepare_threshold", None)  # PgBouncer-safe
            self.conn = psycopg.connect(conn, **connect_kwargs)
            self._owned = True
        else:
            self.conn = conn
            self._owned = False

    def push(self, queue: str, payload: Any, *, partition: str = "Default",
             transaction_id: Optional[str] = None, headers: Optional[Dict[str, Any]] = None,
             deliver_at: Optional[_dt.datetime] = None) -> PushResult:
        """Pushes one message; returns its row (``status`` ``queued`` or ``duplicate``)."""
        with tracing.send_span(queue, headers) as h:
            try:
                row = self.conn.execute(PUSH, (queue, Jsonb(payload), partition, transaction_id,
                                               None if h is None else Jsonb(h), deliver_at)).fetchone()
            except psycopg.Error as e:
                errors.raise_typed(e)
        return _result(row)

    def push_batch(self, items: Iterable[Dict[str, Any]], *, queue: Optional[str] = None) -> List[PushResult]:
        """Pushes several messages atomically. Each item is a dict with ``payload`` and,
        optionally, ``queue`` (or the ``queue`` argument for all), ``partition``,
        ``transactionId``, ``headers``, ``deliverAt``."""
        out = []
        for it in items:
            it = dict(it)
            if queue is not None:
                it.setdefault("queue", queue)
            if isinstance(it.get("deliverAt"), _dt.datetime):
                it["deliverAt"] = it["deliverAt"].isoformat()
            out.append(it)
        name = queue or (out[0].get("queue") if out else "batch")
        with tracing.send_span(str(name), None) as h:
            if h and "traceparent" in h:
                for it in out:
                    hs = dict(it.get("headers") or {})
                    hs.setdefault("traceparent", h["traceparent"])
                    it["headers"] = hs
            try:
                rows = self.conn.execute(PUSH_BATCH, (Jsonb(out),)).fetchall()
            except psycopg.Error as e:
                errors.raise_typed(e)
        return [_result(r) for r in rows]

    def close(self) -> None:
        if self._owned:
            self.conn.close()

    def __enter__(self) -> "Producer":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()
