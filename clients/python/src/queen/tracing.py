"""OpenTelemetry spans, when ``opentelemetry-api`` is installed (no hard dependency).

- A push runs in a PRODUCER span ``send <queue>``, and the message's headers carry that
  span's W3C ``traceparent`` (an explicit ``traceparent`` header is left as it is).
- Each handler runs in a CONSUMER span ``process <queue>`` linked to the producer's span
  through the message's ``traceparent`` header.

Without the package both are no-ops and headers are passed through unchanged.
"""
from __future__ import annotations

import contextlib
from typing import Any, Dict, Iterator, Optional

try:  # pragma: no cover - exercised by the tests with the package installed
    from opentelemetry import propagate, trace
    from opentelemetry.trace import Link, SpanKind
except ImportError:  # pragma: no cover
    trace = None  # type: ignore[assignment]

SYSTEM = "queen"


def enabled() -> bool:
    return trace is not None


def _tracer():
    return trace.get_tracer("queen")  # type: ignore[union-attr]


@contextlib.contextmanager
def send_span(queue: str, headers: Optional[Dict[str, Any]]) -> Iterator[Optional[Dict[str, Any]]]:
    """Yields the headers to push: with the current span's ``traceparent`` added."""
    if trace is None:
        yield headers
        return
    with _tracer().start_as_current_span(
        f"send {queue}", kind=SpanKind.PRODUCER,
        attributes={"messaging.system": SYSTEM, "messaging.destination.name": queue,
                    "messaging.operation.type": "send"},
    ):
        carrier: Dict[str, str] = {}
        propagate.inject(carrier)
        out = dict(headers or {})
        if "traceparent" in carrier and "traceparent" not in out:
            out["traceparent"] = carrier["traceparent"]
            if "tracestate" in carrier:
                out.setdefault("tracestate", carrier["tracestate"])
        yield out or headers


@contextlib.contextmanager
def process_span(queue: str, group: str, message: Any) -> Iterator[Any]:
    """Runs a handler in a CONSUMER span linked to the message's producer span."""
    if trace is None:
        yield None
        return
    links = []
    tp = message.traceparent
    if tp:
        ctx = propagate.extract({"traceparent": tp})
        sc = trace.get_current_span(ctx).get_span_context()
        if sc.is_valid:
            links.append(Link(sc))
    attributes = {"messaging.system": SYSTEM, "messaging.destination.name": queue,
                  "messaging.consumer.group.name": group, "messaging.operation.type": "process",
                  "messaging.message.id": str(message.message_id),
                  "queen.partition": message.partition, "queen.offset": message.offset}
    with _tracer().start_as_current_span(f"process {queue}", kind=SpanKind.CONSUMER, links=links,
                                         attributes=attributes) as span:
        yield span
