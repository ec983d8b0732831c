"""OpenTelemetry: a producer span and a consumer span linked through `traceparent`."""
import pytest

trace = pytest.importorskip("opentelemetry.trace")
from opentelemetry.sdk.trace import TracerProvider  # noqa: E402
from opentelemetry.sdk.trace.export import SimpleSpanProcessor  # noqa: E402
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter  # noqa: E402

import queen  # noqa: E402

EXPORTER = InMemorySpanExporter()


@pytest.fixture(scope="module", autouse=True)
def provider():
    p = TracerProvider()
    p.add_span_processor(SimpleSpanProcessor(EXPORTER))
    trace.set_tracer_provider(p)
    yield


def test_consumer_span_links_to_the_producer_span(dsn, queue):
    EXPORTER.clear()
    with queen.Producer(dsn) as p:
        p.push(queue, {"n": 1})
    got = []
    c = queen.Consumer(dsn, queue, "g", handler=got.append, wait_ms=1000)
    assert c.run_once() == 1
    spans = {s.name: s for s in EXPORTER.get_finished_spans()}
    send, process = spans[f"send {queue}"], spans[f"process {queue}"]
    assert send.kind == trace.SpanKind.PRODUCER and process.kind == trace.SpanKind.CONSUMER
    # The message carried the producer span's context, and the consumer span links to it.
    tp = got[0].headers["traceparent"]
    assert tp.split("-")[1] == format(send.context.trace_id, "032x")
    assert tp.split("-")[2] == format(send.context.span_id, "016x")
    assert [(l.context.trace_id, l.context.span_id) for l in process.links] == [
        (send.context.trace_id, send.context.span_id)]
    assert process.attributes["messaging.consumer.group.name"] == "g"


def test_an_explicit_traceparent_is_kept(dsn, queue):
    mine = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
    with queen.Producer(dsn) as p:
        p.push(queue, 1, headers={"traceparent": mine})
    got = []
    queen.Consumer(dsn, queue, "g", handler=got.append, wait_ms=1000).run_once()
    assert got[0].headers["traceparent"] == mine
