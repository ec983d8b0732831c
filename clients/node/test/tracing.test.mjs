// OpenTelemetry: a producer span and a consumer span linked through `traceparent`.
import assert from "node:assert/strict";
import { test } from "node:test";
import { trace, SpanKind } from "@opentelemetry/api";
import { BasicTracerProvider, InMemorySpanExporter, SimpleSpanProcessor } from "@opentelemetry/sdk-trace-base";
import queen from "../dist/index.js";
import { DSN, queueName } from "./helpers.mjs";

const exporter = new InMemorySpanExporter();
trace.setGlobalTracerProvider(new BasicTracerProvider({ spanProcessors: [new SimpleSpanProcessor(exporter)] }));

test("the consumer span links to the producer span", async () => {
  const q = queueName();
  const p = new queen.Producer(DSN);
  await p.push(q, { n: 1 });
  await p.close();
  const got = [];
  assert.equal(await new queen.Consumer({ connection: DSN, queue: q, group: "g", waitMs: 1000, handler: (m) => got.push(m) }).runOnce(), 1);
  const spans = Object.fromEntries(exporter.getFinishedSpans().map((s) => [s.name, s]));
  const send = spans[`send ${q}`];
  const proc = spans[`process ${q}`];
  assert.equal(send.kind, SpanKind.PRODUCER);
  assert.equal(proc.kind, SpanKind.CONSUMER);
  const [, traceId, spanId] = got[0].headers.traceparent.split("-");
  assert.deepEqual([traceId, spanId], [send.spanContext().traceId, send.spanContext().spanId]);
  assert.deepEqual(proc.links.map((l) => [l.context.traceId, l.context.spanId]), [[traceId, spanId]]);
  assert.equal(proc.attributes["messaging.consumer.group.name"], "g");
});

test("an explicit traceparent is kept", async () => {
  const q = queueName();
  const mine = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01";
  const p = new queen.Producer(DSN);
  await p.push(q, 1, { headers: { traceparent: mine } });
  await p.close();
  const got = [];
  await new queen.Consumer({ connection: DSN, queue: q, group: "g", waitMs: 1000, handler: (m) => got.push(m) }).runOnce();
  assert.equal(got[0].headers.traceparent, mine);
});
