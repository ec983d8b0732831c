"""What the sync and asyncio APIs share: the SQL, the message type, the handler's
decisions and the ack a claim ends with (docs/concepts.md, "Acks")."""
from __future__ import annotations

import dataclasses
import datetime as _dt
import math
import uuid
from typing import Any, Callable, Dict, List, Optional, Sequence

POP = ("SELECT lease_id, lease_expires_at, partition_id, partition, msg_offset, message_id,"
       " transaction_id, payload, attempt, headers, created_at,"
       " extract(epoch FROM lease_expires_at - clock_timestamp())::float8"
       " FROM queen.pop(%(queue)s, %(group)s, batch => %(batch)s, partition => %(partition)s,"
       " lease_seconds => %(lease_seconds)s, wait_ms => %(wait_ms)s,"
       " max_partitions => %(max_partitions)s)")
ACK = "SELECT queen.ack(%s, %s)"
EXTEND = "SELECT queen.extend_lease(%s, %s)"
MAY_START = "SELECT queen.may_start(%s, %s)"
PUSH = ("SELECT idx, status, message_id, transaction_id, partition_id, msg_offset"
        " FROM queen.push(%s, %s, partition => %s, transaction_id => %s, headers => %s, deliver_at => %s)")
PUSH_BATCH = "SELECT idx, status, message_id, transaction_id, partition_id, msg_offset FROM queen.push_batch(%s)"

#: The queue's shared default consumer group.
QUEUE_MODE = "__QUEUE_MODE__"
#: The SQLSTATE and message prefix of may_start's warning.
SQL0105 = "SQL0105"


@dataclasses.dataclass(frozen=True)
class Message:
    """One claimed message (a row of ``queen.pop``)."""
    lease_id: Optional[uuid.UUID]
    lease_expires_at: Optional[_dt.datetime]
    partition_id: uuid.UUID
    partition: str
    offset: int
    message_id: uuid.UUID
    transaction_id: str
    payload: Any
    attempt: int
    headers: Optional[Dict[str, Any]]
    created_at: _dt.datetime
    #: Seconds the lease had left when the pop returned, by the server's clock.
    lease_seconds_left: Optional[float] = None

    @classmethod
    def from_row(cls, r: Sequence[Any]) -> "Message":
        return cls(*r[:12])

    @property
    def traceparent(self) -> Optional[str]:
        """The producer's W3C ``traceparent`` header, when the message carries one."""
        t = (self.headers or {}).get("traceparent")
        return t if isinstance(t, str) else None


@dataclasses.dataclass(frozen=True)
class PushResult:
    """A row of ``queen.push`` / ``queen.push_batch``."""
    idx: int
    status: str
    message_id: uuid.UUID
    transaction_id: str
    partition_id: uuid.UUID
    offset: int


# ---- what a handler decided ------------------------------------------------------------

class RetryLater(Exception):
    """Raise from a handler: deliver this message again (``retry``: no retry budget is
    charged), after ``after`` seconds or at once."""

    def __init__(self, after: Optional[float] = None):
        super().__init__(f"retry later ({after} s)" if after else "retry later")
        self.after = after


class Poison(Exception):
    """Raise from a handler: never try this message again; file it as a dead letter now
    (``dlq``) with this error."""


@dataclasses.dataclass(frozen=True)
class Decision:
    """How a message that did not complete is acked: ``status`` is ``failed``, ``retry``
    or ``dlq``; ``retry_after`` in seconds (None: the queue's backoff for ``failed``, none
    for ``retry``)."""
    status: str
    error: Optional[str] = None
    retry_after: Optional[float] = None


#: An error policy: what to do with a message whose handler raised this exception.
ErrorPolicy = Callable[[BaseException, Message], Decision]


#: The longest pause an ack takes (7 days, in seconds).
MAX_RETRY_AFTER = 604_800.0


def checked(d: Decision) -> Decision:
    """A policy's decision as an ack can take it: ``failed`` for a status that is not
    ``failed``, ``retry`` or ``dlq``; no ``retry_after`` with ``dlq``; ``retry_after``
    within 0 to 7 days."""
    if d.status not in ("failed", "retry", "dlq"):
        return Decision("failed", error=d.error or f"error policy returned status {d.status!r}")
    if d.status == "dlq" and d.retry_after is not None:
        return dataclasses.replace(d, retry_after=None)
    if d.retry_after is not None and math.isnan(d.retry_after):
        return dataclasses.replace(d, retry_after=None)
    if d.retry_after is not None and not 0 <= d.retry_after <= MAX_RETRY_AFTER:
        # The ack refuses the whole call (22023) for a pause out of range, and every
        # consumer that met this message would stop on it: clamp instead.
        return dataclasses.replace(d, retry_after=min(max(d.retry_after, 0.0), MAX_RETRY_AFTER))
    return d


def lease_length(lease_seconds: Optional[int], m: Message) -> int:
    """The lease a heartbeat keeps renewing: the pop's ``lease_seconds``, else what the
    lease had left when the pop returned (server clock), else 60."""
    if lease_seconds:
        return lease_seconds
    if m.lease_seconds_left is not None and m.lease_seconds_left > 0:
        return max(1, math.ceil(m.lease_seconds_left))
    return 60


class LeaseClock:
    """When a claim's lease expires, by this process's clock (``time.monotonic()``), and
    when a heartbeat extends it. The heartbeat runs only while a handler runs: messages
    waiting their turn use up the lease (``may_start`` then decides whether the next one may
    start). A running handler's lease is extended a third of the lease after the handler
    started, then every third; and at once when less than a third of the lease is left, so
    that a handler that started late in the lease does not lose it while it runs."""

    def __init__(self, seconds: int, expires: float):
        self.seconds = seconds
        self.expires = expires

    @classmethod
    def of(cls, lease_seconds: Optional[int], m: Message, popped: float) -> "LeaseClock":
        """The clock of the lease ``m`` came with, from a pop that returned at ``popped``."""
        seconds = lease_length(lease_seconds, m)
        left = m.lease_seconds_left if m.lease_seconds_left is not None else seconds
        return cls(seconds, popped + left)

    def due(self, started: float) -> float:
        """The first extension for a handler that started at ``started``."""
        return min(started + self.seconds / 3, self.expires - self.seconds / 3)

    def extended(self, at: float) -> float:
        """Records an extension sent at ``at``; returns when the next one is due."""
        self.expires = at + self.seconds
        return at + self.seconds / 3


def retryable(e: BaseException) -> bool:
    """Worth another round rather than stopping the consumer: a lost connection or a
    server going down, a serialization failure or deadlock (class 40), a statement
    timeout (57014), a full shared-memory table (53400: "retry later", docs/errors.md), a
    lock wait past the session's ``lock_timeout`` (55P03)."""
    from . import errors
    if errors.transient(e):
        return True
    state = getattr(e, "sqlstate", None) or ""
    return state[:2] == "40" or state in ("57014", "53400", "55P03")


def default_error_policy(exc: BaseException, message: Message) -> Decision:
    """``RetryLater`` -> ``retry``; ``Poison`` -> ``dlq``; anything else -> ``failed``,
    which charges the lane's retry budget (the queue's ``retry_limit``; past it the
    message is dead-lettered) and waits the queue's ``retry_backoff``."""
    if isinstance(exc, RetryLater):
        return Decision("retry", retry_after=exc.after)
    if isinstance(exc, Poison):
        return Decision("dlq", error=str(exc) or "poison")
    return Decision("failed", error=f"{type(exc).__name__}: {exc}")


def backoff_policy(base: float = 1.0, cap: float = 300.0) -> ErrorPolicy:
    """Like the default, with an exponential ``retry_after`` for ``failed``:
    ``base * 2**attempt`` seconds, at most ``cap``."""
    def policy(exc: BaseException, message: Message) -> Decision:
        d = default_error_policy(exc, message)
        if d.status == "failed":
            return dataclasses.replace(d, retry_after=min(cap, base * 2.0 ** min(message.attempt, 64)))
        return d
    return policy


class LaneResult:
    """What became of one lane of a claim: the last offset completed, and the first one
    that did not complete (its decision), if any. The ack needs no more: completions are
    cumulative, and the lowest explicit signal decides the lane."""

    def __init__(self, partition_id: uuid.UUID):
        self.partition_id = partition_id
        self.completed: Optional[int] = None
        self.stopped: Optional[tuple] = None  # (offset, Decision)

    def complete(self, offset: int) -> None:
        self.completed = offset

    def stop(self, offset: int, decision: Decision) -> None:
        if self.stopped is None:
            self.stopped = (offset, decision)

    def items(self) -> List[Dict[str, Any]]:
        pid = str(self.partition_id)
        if self.stopped is not None:
            offset, d = self.stopped
            item: Dict[str, Any] = {"partitionId": pid, "offset": offset, "status": d.status}
            if d.error is not None:
                item["error"] = d.error
            if d.retry_after is not None:
                item["retryAfter"] = d.retry_after
            return [item]
        if self.completed is not None:
            return [{"partitionId": pid, "offset": self.completed, "status": "completed"}]
        return []


def lanes_of(messages: Sequence[Message]) -> List[List[Message]]:
    """A claim's messages by lane (partition), each in offset order, lanes in the order
    the pop returned them."""
    by: Dict[uuid.UUID, List[Message]] = {}
    for m in messages:
        by.setdefault(m.partition_id, []).append(m)
    return [sorted(v, key=lambda m: m.offset) for v in by.values()]


#: How a message that was not started is acked (a stop, or ``may_start`` said no): given
#: back at once, charging nothing.
RELEASE = Decision("retry")


def interval(seconds: Optional[float]) -> Optional[_dt.timedelta]:
    return None if seconds is None else _dt.timedelta(seconds=seconds)


# ---- what both consumer loops do without I/O -----------------------------------------

class LoopSettings:
    """The consumer settings the sync and asyncio loops share (see ``Consumer``)."""

    def _settle_settings(self, conninfo: str, queue: str, group: str, handler: Any, batch_handler: Any,
                         batch: int, concurrency: int, wait_ms: int, lease_seconds: Optional[int],
                         partition: Optional[str], max_partitions: int, handler_timeout: Optional[float],
                         check_may_start: bool, heartbeat: bool, error_policy: "ErrorPolicy",
                         on_event: Any, connect_kwargs: Dict[str, Any]) -> None:
        if (handler is None) == (batch_handler is None):
            raise TypeError("give exactly one of handler and batch_handler")
        if concurrency < 1:
            raise ValueError("concurrency must be at least 1")
        self.conninfo, self.queue, self.group = conninfo, queue, group
        self.handler, self.batch_handler = handler, batch_handler
        self.params = {"queue": queue, "group": group, "batch": batch, "partition": partition,
                       "lease_seconds": lease_seconds or 0, "wait_ms": wait_ms, "max_partitions": max_partitions}
        self.concurrency, self.lease_seconds = concurrency, lease_seconds
        self.handler_timeout, self.check_may_start = handler_timeout, check_may_start
        self.heartbeat, self.error_policy, self.on_event = heartbeat, error_policy, on_event
        # PgBouncer-safe by default: no prepared statements.
        connect_kwargs.setdefault("autocommit", True)
        connect_kwargs.setdefault("prepare_threshold", None)
        self.connect_kwargs = connect_kwargs


def release_unstarted(lanes: Sequence[Sequence[Message]], results: Sequence[LaneResult]) -> None:
    """Whatever of a claim was not run (a stop, ``may_start``, an exception out of the
    loop) is given back at once."""
    for lane, r in zip(lanes, results):
        rest = [m for m in lane if r.completed is None or m.offset > r.completed]
        if rest:
            r.stop(rest[0].offset, RELEASE)


def ack_items(results: Sequence[LaneResult]) -> List[Dict[str, Any]]:
    return [i for r in results for i in r.items()]


def lease_lost(report: Dict[str, Any]) -> bool:
    """An ack report with an item not applied: the lease had expired or was replaced."""
    return any(not i.get("success") for i in report.get("items", []))


def sql0105(diag: Any) -> Optional[str]:
    """The server's ``may_start`` warning (message and DETAIL), or None for another notice."""
    if not (diag.message_primary or "").startswith(SQL0105):
        return None
    return diag.message_primary + (f" ({diag.message_detail})" if diag.message_detail else "")
