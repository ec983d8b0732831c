/**
 * Consumer: the loop a team would otherwise write (docs/concepts.md, "Leases" and "Acks").
 *
 * Each of `concurrency` workers has a client of its own and repeats: a long-poll
 * `queen.pop` (autocommit: the claim is the lease), the handler on each message of the
 * claim in partition order, then one `queen.ack` for the whole claim.
 *
 * - A handler that resolves completes its message. One that throws is acked as the error
 *   policy decides (`failed` by default, with an optional `retryAfter`; `retry` for
 *   `RetryLater`; `dlq` for `Poison`), and the rest of its lane is not run.
 * - Before each message the worker asks `queen.may_start`; when it says no, the server's
 *   `SQL0105` warning is surfaced (an event) and the rest of the claim is released with
 *   `retry`, so it comes back at once.
 * - While a handler runs, a heartbeat extends the lease every third of its length.
 * - `stop()` (and SIGTERM / SIGINT while `run()` runs, unless `signals: false`): no new
 *   pops (a long-poll in progress is cancelled), running handlers finish, what was not
 *   started is released.
 */
import { ClientConfig } from "pg";
import { Decision, ErrorPolicy, Message } from "./common";
/** What the loop reports to `onEvent`: `may_not_start` (with the server's SQL0105 text as
 * `warning`), `handler_failed` (with `error` and the `decision`), `lease_lost` (an ack
 * found its lease expired or replaced: those messages are delivered again). */
export interface ConsumerEvent {
    kind: "may_not_start" | "handler_failed" | "lease_lost";
    message?: Message;
    warning?: string;
    error?: unknown;
    decision?: Decision;
}
export interface ConsumerOptions {
    /** A connection string or a `pg` client config. */
    connection: string | ClientConfig;
    queue: string;
    group?: string;
    handler?: (m: Message) => Promise<unknown> | unknown;
    batchHandler?: (ms: Message[]) => Promise<unknown> | unknown;
    batch?: number;
    concurrency?: number;
    waitMs?: number;
    leaseSeconds?: number;
    partition?: string;
    maxPartitions?: number;
    /** Seconds; asked of `may_start` (the group's stored one when undefined). */
    handlerTimeout?: number;
    checkMayStart?: boolean;
    heartbeat?: boolean;
    errorPolicy?: ErrorPolicy;
    onEvent?: (e: ConsumerEvent) => void;
}
export declare class Consumer {
    readonly queue: string;
    readonly group: string;
    private readonly o;
    private stopping;
    private readonly polling;
    private hb;
    private hbChain;
    constructor(opts: ConsumerOptions);
    /** Runs the workers until `stop()` (or SIGTERM / SIGINT with `signals`); resolves once
     * every worker acked its last claim. */
    run(opts?: {
        signals?: boolean;
    }): Promise<void>;
    /** Stops gracefully: no new pops; running handlers finish; what was not started is released. */
    stop(): void;
    /** One pop and its claim on a client of its own; resolves to how many messages came. */
    runOnce(): Promise<number>;
    private connect;
    private work;
    private pop;
    private claim;
    private runEach;
    private runBatch;
    /** Runs `f` with a heartbeat extending the lease every third of its length. */
    private handling;
    private leaseLength;
    private mayStart;
    private failed;
    private ack;
    private emit;
}
