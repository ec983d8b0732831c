/** What the producer and the consumer share: the SQL, the message type, the handler's
 * decisions and the ack a claim ends with (docs/concepts.md, "Acks"). */

export const POP =
  "SELECT lease_id, lease_expires_at, partition_id, partition, msg_offset, message_id, transaction_id," +
  " payload, attempt, headers, created_at, extract(epoch FROM lease_expires_at - clock_timestamp())::float8 AS lease_left" +
  " FROM queen.pop($1, $2, batch => $3, partition => $4," +
  " lease_seconds => $5, wait_ms => $6, max_partitions => $7)";
export const ACK = "SELECT queen.ack($1, $2::jsonb) AS report";
export const EXTEND = "SELECT queen.extend_lease($1, $2)";
export const MAY_START = "SELECT queen.may_start($1, $2::interval) AS ok";
export const PUSH =
  "SELECT idx, status, message_id, transaction_id, partition_id, msg_offset" +
  " FROM queen.push($1, $2::jsonb, partition => $3, transaction_id => $4, headers => $5::jsonb, deliver_at => $6)";
export const PUSH_BATCH =
  "SELECT idx, status, message_id, transaction_id, partition_id, msg_offset FROM queen.push_batch($1::jsonb)";

/** The queue's shared default consumer group. */
export const QUEUE_MODE = "__QUEUE_MODE__";
export const SQL0105 = "SQL0105";

/** One claimed message (a row of `queen.pop`). */
export interface Message {
  leaseId: string | null;
  leaseExpiresAt: Date | null;
  partitionId: string;
  partition: string;
  offset: number;
  messageId: string;
  transactionId: string;
  payload: unknown;
  attempt: number;
  headers: Record<string, unknown> | null;
  createdAt: Date;
  /** Seconds the lease had left when the pop returned, by the server's clock. */
  leaseSecondsLeft: number | null;
}

export function messageOf(r: Record<string, any>): Message {
  return {
    leaseId: r.lease_id, leaseExpiresAt: r.lease_expires_at, partitionId: r.partition_id, partition: r.partition,
    offset: Number(r.msg_offset), messageId: r.message_id, transactionId: r.transaction_id, payload: r.payload,
    attempt: r.attempt, headers: r.headers, createdAt: r.created_at, leaseSecondsLeft: r.lease_left,
  };
}

/** The producer's W3C `traceparent` header, when the message carries one. */
export function traceparentOf(m: Message): string | undefined {
  const t = m.headers?.["traceparent"];
  return typeof t === "string" ? t : undefined;
}

/** A row of `queen.push` / `queen.push_batch`. */
export interface PushResult {
  idx: number;
  status: "queued" | "duplicate";
  messageId: string;
  transactionId: string;
  partitionId: string;
  offset: number;
}

export function pushResultOf(r: Record<string, any>): PushResult {
  return { idx: r.idx, status: r.status, messageId: r.message_id, transactionId: r.transaction_id,
    partitionId: r.partition_id, offset: Number(r.msg_offset) };
}

/** Throw from a handler: deliver this message again (`retry`: no retry budget charged),
 * after `after` seconds or at once. */
export class RetryLater extends Error {
  constructor(readonly after?: number) { super(after ? `retry later (${after} s)` : "retry later"); }
}

/** Throw from a handler: never again; file it as a dead letter now (`dlq`). */
export class Poison extends Error {}

/** How a message that did not complete is acked. */
export interface Decision {
  status: "failed" | "retry" | "dlq";
  error?: string;
  /** Seconds; undefined: the queue's backoff for `failed`, none for `retry`. */
  retryAfter?: number;
}

export type ErrorPolicy = (error: unknown, message: Message) => Decision;

/** `RetryLater` -> `retry`; `Poison` -> `dlq`; anything else -> `failed` (charges the
 * lane's retry budget; past the queue's `retry_limit` the message is dead-lettered). */
export const defaultErrorPolicy: ErrorPolicy = (error, _message) => {
  if (error instanceof RetryLater) return { status: "retry", retryAfter: error.after };
  if (error instanceof Poison) return { status: "dlq", error: error.message || "poison" };
  const e = error as Error;
  return { status: "failed", error: `${e?.name ?? "Error"}: ${e?.message ?? String(error)}` };
};

/** The default, with an exponential `retryAfter` for `failed`: base * 2^attempt, at most cap. */
export function backoffPolicy(base = 1, cap = 300): ErrorPolicy {
  return (error, message) => {
    const d = defaultErrorPolicy(error, message);
    return d.status === "failed" ? { ...d, retryAfter: Math.min(cap, base * 2 ** message.attempt) } : d;
  };
}

/** The longest pause an ack takes (7 days, in seconds). */
export const MAX_RETRY_AFTER = 604_800;

/** A policy's decision as an ack can take it: `failed` for an unknown status; no
 * `retryAfter` with `dlq`; `retryAfter` within 0 to 7 days (the ack refuses the whole call,
 * 22023, for one out of range, and every consumer that met the message would stop on it). */
export function checked(d: Decision): Decision {
  if (!["failed", "retry", "dlq"].includes(d?.status)) {
    return { status: "failed", error: d?.error ?? `error policy returned status ${JSON.stringify(d?.status)}` };
  }
  if (d.status === "dlq") return { status: "dlq", error: d.error };
  const after = d.retryAfter;
  if (after !== undefined && after !== null && !(after >= 0 && after <= MAX_RETRY_AFTER)) {
    return { ...d, retryAfter: Number.isNaN(after) ? undefined : Math.min(Math.max(after, 0), MAX_RETRY_AFTER) };
  }
  return d;
}

/** The lease a heartbeat keeps renewing: the pop's leaseSeconds, else what the lease had
 * left when the pop returned (server clock), else 60. */
export function leaseLength(leaseSeconds: number | undefined, m: Message): number {
  if (leaseSeconds) return leaseSeconds;
  if (m.leaseSecondsLeft !== null && m.leaseSecondsLeft > 0) return Math.ceil(m.leaseSecondsLeft);
  return 60;
}

/** When a claim's lease expires, by this process's monotonic clock (`performance.now()`,
 * ms), and when a heartbeat extends it. The heartbeat runs only while a handler runs:
 * messages waiting their turn use up the lease (`may_start` then decides whether the next
 * may start). A running handler's lease is extended a third of the lease after the handler
 * started, then every third; and at once when less than a third of the lease is left, so
 * that a handler that started late in the lease does not lose it while it runs. */
export class LeaseClock {
  constructor(readonly seconds: number, public expires: number) {}

  /** The clock of the lease `m` came with, from a pop that returned at `popped` (ms). */
  static of(leaseSeconds: number | undefined, m: Message, popped: number): LeaseClock {
    const seconds = leaseLength(leaseSeconds, m);
    return new LeaseClock(seconds, popped + (m.leaseSecondsLeft ?? seconds) * 1000);
  }

  /** The first extension for a handler that started at `started` (ms). */
  due(started: number): number {
    return Math.min(started + (this.seconds * 1000) / 3, this.expires - (this.seconds * 1000) / 3);
  }

  /** Records an extension sent at `at` (ms); returns when the next one is due. */
  extended(at: number): number {
    this.expires = at + this.seconds * 1000;
    return at + (this.seconds * 1000) / 3;
  }
}

/** How a message that was not started is acked (a stop, or `may_start` said no). */
export const RELEASE: Decision = { status: "retry" };

/** What became of one lane of a claim: the last offset completed and the first that did
 * not complete. The ack needs no more: completions are cumulative and the lowest
 * explicit signal decides the lane. */
export class LaneResult {
  completed: number | undefined;
  stopped: [number, Decision] | undefined;
  constructor(readonly partitionId: string) {}
  complete(offset: number): void { this.completed = offset; }
  stop(offset: number, d: Decision): void { if (!this.stopped) this.stopped = [offset, d]; }
  items(): Record<string, unknown>[] {
    if (this.stopped) {
      const [offset, d] = this.stopped;
      const item: Record<string, unknown> = { partitionId: this.partitionId, offset, status: d.status };
      if (d.error !== undefined) item.error = d.error;
      if (d.retryAfter !== undefined) item.retryAfter = d.retryAfter;
      return [item];
    }
    return this.completed === undefined ? [] : [{ partitionId: this.partitionId, offset: this.completed, status: "completed" }];
  }
}

/** A claim's messages by lane (partition), each in offset order. */
export function lanesOf(messages: Message[]): Message[][] {
  const by = new Map<string, Message[]>();
  for (const m of messages) {
    if (!by.has(m.partitionId)) by.set(m.partitionId, []);
    by.get(m.partitionId)!.push(m);
  }
  return [...by.values()].map((l) => l.sort((a, b) => a.offset - b.offset));
}
