/**
 * Producer: `push` and `pushBatch`, on a client of its own or on the caller's. On the
 * caller's client a push is part of the caller's transaction: it commits with the
 * application's own writes or not at all (the outbox pattern).
 */
import { ClientBase, ClientConfig } from "pg";
import { PushResult } from "./common";
export interface PushOptions {
    partition?: string;
    transactionId?: string;
    headers?: Record<string, unknown>;
    deliverAt?: Date;
}
export interface BatchItem {
    payload: unknown;
    queue?: string;
    partition?: string;
    transactionId?: string;
    headers?: Record<string, unknown>;
    deliverAt?: Date | string;
}
export declare class Producer {
    private readonly client;
    private readonly owned;
    private connected;
    /** A `pg` client or pool client (its transactions are yours), or a connection string /
     * config (a client of its own; `close()` it). */
    constructor(target: ClientBase | string | ClientConfig);
    private ready;
    /** Pushes one message; `status` is `queued`, or `duplicate` for a repeated transactionId. */
    push(queue: string, payload: unknown, opts?: PushOptions): Promise<PushResult>;
    /** Pushes several messages atomically (`queue` for items that name none). */
    pushBatch(items: BatchItem[], opts?: {
        queue?: string;
    }): Promise<PushResult[]>;
    close(): Promise<void>;
}
