"use strict";
/** What the producer and the consumer share: the SQL, the message type, the handler's
 * decisions and the ack a claim ends with (docs/concepts.md, "Acks"). */
Object.defineProperty(exports, "__esModule", { value: true });
exports.LaneResult = exports.RELEASE = exports.defaultErrorPolicy = exports.Poison = exports.RetryLater = exports.SQL0105 = exports.QUEUE_MODE = exports.PUSH_BATCH = exports.PUSH = exports.MAY_START = exports.EXTEND = exports.ACK = exports.POP = void 0;
exports.messageOf = messageOf;
exports.traceparentOf = traceparentOf;
exports.pushResultOf = pushResultOf;
exports.backoffPolicy = backoffPolicy;
exports.lanesOf = lanesOf;
exports.POP = "SELECT lease_id, lease_expires_at, partition_id, partition, msg_offset, message_id, transaction_id," +
    " payload, attempt, headers, created_at FROM queen.pop($1, $2, batch => $3, partition => $4," +
    " lease_seconds => $5, wait_ms => $6, max_partitions => $7)";
exports.ACK = "SELECT queen.ack($1, $2::jsonb) AS report";
exports.EXTEND = "SELECT queen.extend_lease($1, $2)";
exports.MAY_START = "SELECT queen.may_start($1, $2::interval) AS ok";
exports.PUSH = "SELECT idx, status, message_id, transaction_id, partition_id, msg_offset" +
    " FROM queen.push($1, $2::jsonb, partition => $3, transaction_id => $4, headers => $5::jsonb, deliver_at => $6)";
exports.PUSH_BATCH = "SELECT idx, status, message_id, transaction_id, partition_id, msg_offset FROM queen.push_batch($1::jsonb)";
/** The queue's shared default consumer group. */
exports.QUEUE_MODE = "__QUEUE_MODE__";
exports.SQL0105 = "SQL0105";
function messageOf(r) {
    return {
        leaseId: r.lease_id, leaseExpiresAt: r.lease_expires_at, partitionId: r.partition_id, partition: r.partition,
        offset: Number(r.msg_offset), messageId: r.message_id, transactionId: r.transaction_id, payload: r.payload,
        attempt: r.attempt, headers: r.headers, createdAt: r.created_at,
    };
}
/** The producer's W3C `traceparent` header, when the message carries one. */
function traceparentOf(m) {
    const t = m.headers?.["traceparent"];
    return typeof t === "string" ? t : undefined;
}
function pushResultOf(r) {
    return { idx: r.idx, status: r.status, messageId: r.message_id, transactionId: r.transaction_id,
        partitionId: r.partition_id, offset: Number(r.msg_offset) };
}
/** Throw from a handler: deliver this message again (`retry`: no retry budget charged),
 * after `after` seconds or at once. */
class RetryLater extends Error {
    after;
    constructor(after) {
        super(after ? `retry later (${after} s)` : "retry later");
        this.after = after;
    }
}
exports.RetryLater = RetryLater;
/** Throw from a handler: never again; file it as a dead letter now (`dlq`). */
class Poison extends Error {
}
exports.Poison = Poison;
/** `RetryLater` -> `retry`; `Poison` -> `dlq`; anything else -> `failed` (charges the
 * lane's retry budget; past the queue's `retry_limit` the message is dead-lettered). */
const defaultErrorPolicy = (error, _message) => {
    if (error instanceof RetryLater)
        return { status: "retry", retryAfter: error.after };
    if (error instanceof Poison)
        return { status: "dlq", error: error.message || "poison" };
    const e = error;
    return { status: "failed", error: `${e?.name ?? "Error"}: ${e?.message ?? String(error)}` };
};
exports.defaultErrorPolicy = defaultErrorPolicy;
/** The default, with an exponential `retryAfter` for `failed`: base * 2^attempt, at most cap. */
function backoffPolicy(base = 1, cap = 300) {
    return (error, message) => {
        const d = (0, exports.defaultErrorPolicy)(error, message);
        return d.status === "failed" ? { ...d, retryAfter: Math.min(cap, base * 2 ** message.attempt) } : d;
    };
}
/** How a message that was not started is acked (a stop, or `may_start` said no). */
exports.RELEASE = { status: "retry" };
/** What became of one lane of a claim: the last offset completed and the first that did
 * not complete. The ack needs no more: completions are cumulative and the lowest
 * explicit signal decides the lane. */
class LaneResult {
    partitionId;
    completed;
    stopped;
    constructor(partitionId) {
        this.partitionId = partitionId;
    }
    complete(offset) { this.completed = offset; }
    stop(offset, d) { if (!this.stopped)
        this.stopped = [offset, d]; }
    items() {
        if (this.stopped) {
            const [offset, d] = this.stopped;
            const item = { partitionId: this.partitionId, offset, status: d.status };
            if (d.error !== undefined)
                item.error = d.error;
            if (d.retryAfter !== undefined)
                item.retryAfter = d.retryAfter;
            return [item];
        }
        return this.completed === undefined ? [] : [{ partitionId: this.partitionId, offset: this.completed, status: "completed" }];
    }
}
exports.LaneResult = LaneResult;
/** A claim's messages by lane (partition), each in offset order. */
function lanesOf(messages) {
    const by = new Map();
    for (const m of messages) {
        if (!by.has(m.partitionId))
            by.set(m.partitionId, []);
        by.get(m.partitionId).push(m);
    }
    return [...by.values()].map((l) => l.sort((a, b) => a.offset - b.offset));
}
