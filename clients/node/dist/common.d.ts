/** What the producer and the consumer share: the SQL, the message type, the handler's
 * decisions and the ack a claim ends with (docs/concepts.md, "Acks"). */
export declare const POP: string;
export declare const ACK = "SELECT queen.ack($1, $2::jsonb) AS report";
export declare const EXTEND = "SELECT queen.extend_lease($1, $2)";
export declare const MAY_START = "SELECT queen.may_start($1, $2::interval) AS ok";
export declare const PUSH: string;
export declare const PUSH_BATCH = "SELECT idx, status, message_id, transaction_id, partition_id, msg_offset FROM queen.push_batch($1::jsonb)";
/** The queue's shared default consumer group. */
export declare const QUEUE_MODE = "__QUEUE_MODE__";
export declare const SQL0105 = "SQL0105";
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
}
export declare function messageOf(r: Record<string, any>): Message;
/** The producer's W3C `traceparent` header, when the message carries one. */
export declare function traceparentOf(m: Message): string | undefined;
/** A row of `queen.push` / `queen.push_batch`. */
export interface PushResult {
    idx: number;
    status: "queued" | "duplicate";
    messageId: string;
    transactionId: string;
    partitionId: string;
    offset: number;
}
export declare function pushResultOf(r: Record<string, any>): PushResult;
/** Throw from a handler: deliver this message again (`retry`: no retry budget charged),
 * after `after` seconds or at once. */
export declare class RetryLater extends Error {
    readonly after?: number | undefined;
    constructor(after?: number | undefined);
}
/** Throw from a handler: never again; file it as a dead letter now (`dlq`). */
export declare class Poison extends Error {
}
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
export declare const defaultErrorPolicy: ErrorPolicy;
/** The default, with an exponential `retryAfter` for `failed`: base * 2^attempt, at most cap. */
export declare function backoffPolicy(base?: number, cap?: number): ErrorPolicy;
/** How a message that was not started is acked (a stop, or `may_start` said no). */
export declare const RELEASE: Decision;
/** What became of one lane of a claim: the last offset completed and the first that did
 * not complete. The ack needs no more: completions are cumulative and the lowest
 * explicit signal decides the lane. */
export declare class LaneResult {
    readonly partitionId: string;
    completed: number | undefined;
    stopped: [number, Decision] | undefined;
    constructor(partitionId: string);
    complete(offset: number): void;
    stop(offset: number, d: Decision): void;
    items(): Record<string, unknown>[];
}
/** A claim's messages by lane (partition), each in offset order. */
export declare function lanesOf(messages: Message[]): Message[][];
