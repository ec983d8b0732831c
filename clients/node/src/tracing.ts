/**
 * OpenTelemetry spans when `@opentelemetry/api` is installed (an optional peer): a push
 * runs in a PRODUCER span `send <queue>` whose W3C `traceparent` goes into the message
 * headers (an explicit one is kept); a handler runs in a CONSUMER span `process <queue>`
 * linked to it. Without the package both are no-ops.
 */
import type { Message } from "./common";
import { traceparentOf } from "./common";

let api: any;
try {
  // eslint-disable-next-line @typescript-eslint/no-var-requires
  api = require("@opentelemetry/api");
} catch {
  api = undefined;
}

const TRACEPARENT = /^00-([0-9a-f]{32})-([0-9a-f]{16})-([0-9a-f]{2})$/;

export async function sendSpan<T>(
  queue: string, headers: Record<string, unknown> | null | undefined,
  f: (headers: Record<string, unknown> | null) => Promise<T>,
): Promise<T> {
  if (!api) return f(headers ?? null);
  const span = api.trace.getTracer("queen").startSpan(`send ${queue}`, {
    kind: api.SpanKind.PRODUCER,
    attributes: { "messaging.system": "queen", "messaging.destination.name": queue, "messaging.operation.type": "send" },
  });
  try {
    const sc = span.spanContext();
    const out: Record<string, unknown> = { ...(headers ?? {}) };
    if (api.isSpanContextValid(sc) && out.traceparent === undefined) {
      out.traceparent = `00-${sc.traceId}-${sc.spanId}-${(sc.traceFlags & 0xff).toString(16).padStart(2, "0")}`;
    }
    return await f(Object.keys(out).length ? out : headers ?? null);
  } catch (e) {
    span.setStatus({ code: api.SpanStatusCode.ERROR });
    throw e;
  } finally {
    span.end();
  }
}

export async function processSpan<T>(queue: string, group: string, m: Message, f: () => Promise<T>): Promise<T> {
  if (!api) return f();
  const links = [];
  const tp = TRACEPARENT.exec(traceparentOf(m) ?? "");
  if (tp) links.push({ context: { traceId: tp[1], spanId: tp[2], traceFlags: parseInt(tp[3], 16), isRemote: true } });
  const span = api.trace.getTracer("queen").startSpan(`process ${queue}`, {
    kind: api.SpanKind.CONSUMER, links,
    attributes: { "messaging.system": "queen", "messaging.destination.name": queue,
      "messaging.consumer.group.name": group, "messaging.operation.type": "process",
      "messaging.message.id": m.messageId, "queen.partition": m.partition, "queen.offset": m.offset },
  });
  try {
    return await api.context.with(api.trace.setSpan(api.context.active(), span), f);
  } catch (e) {
    span.setStatus({ code: api.SpanStatusCode.ERROR });
    throw e;
  } finally {
    span.end();
  }
}
