/**
 * OpenTelemetry spans when `@opentelemetry/api` is installed (an optional peer): a push
 * runs in a PRODUCER span `send <queue>` whose W3C `traceparent` goes into the message
 * headers (an explicit one is kept); a handler runs in a CONSUMER span `process <queue>`
 * linked to it. Without the package both are no-ops.
 */
import type { Message } from "./common";
export declare function sendSpan<T>(queue: string, headers: Record<string, unknown> | null | undefined, f: (headers: Record<string, unknown> | null) => Promise<T>): Promise<T>;
export declare function processSpan<T>(queue: string, group: string, m: Message, f: () => Promise<T>): Promise<T>;
