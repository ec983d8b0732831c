/**
 * Producer: `push` and `pushBatch`, on a client of its own or on the caller's. On the
 * caller's client a push is part of the caller's transaction: it commits with the
 * application's own writes or not at all (the outbox pattern).
 */
import { Client, ClientBase, ClientConfig } from "pg";
import { PUSH, PUSH_BATCH, PushResult, pushResultOf } from "./common";
import { typed } from "./errors";
import { sendSpan } from "./tracing";

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

export class Producer {
  private readonly client: ClientBase;
  private readonly owned: boolean;
  private connected: Promise<void> | undefined;

  /** A `pg` client or pool client (its transactions are yours), or a connection string /
   * config (a client of its own; `close()` it). */
  constructor(target: ClientBase | string | ClientConfig) {
    if (typeof target === "string" || typeof (target as ClientBase).query !== "function") {
      this.client = new Client(typeof target === "string" ? { connectionString: target } : (target as ClientConfig));
      this.owned = true;
    } else {
      this.client = target as ClientBase;
      this.owned = false;
    }
  }

  private async ready(): Promise<ClientBase> {
    if (this.owned) this.connected ??= (this.client as Client).connect();
    await this.connected;
    return this.client;
  }

  /** Pushes one message; `status` is `queued`, or `duplicate` for a repeated transactionId. */
  async push(queue: string, payload: unknown, opts: PushOptions = {}): Promise<PushResult> {
    const c = await this.ready();
    return sendSpan(queue, opts.headers, async (headers) => {
      try {
        const r = await c.query(PUSH, [queue, JSON.stringify(payload), opts.partition ?? "Default",
          opts.transactionId ?? null, headers === null ? null : JSON.stringify(headers), opts.deliverAt ?? null]);
        return pushResultOf(r.rows[0]);
      } catch (e) {
        throw typed(e);
      }
    });
  }

  /** Pushes several messages atomically (`queue` for items that name none). */
  async pushBatch(items: BatchItem[], opts: { queue?: string } = {}): Promise<PushResult[]> {
    const c = await this.ready();
    const out = items.map((it) => {
      const o: Record<string, unknown> = { ...it, queue: it.queue ?? opts.queue };
      if (it.deliverAt instanceof Date) o.deliverAt = it.deliverAt.toISOString();
      return o;
    });
    return sendSpan(opts.queue ?? String(out[0]?.queue ?? "batch"), null, async (h) => {
      if (h?.traceparent) for (const it of out) it.headers = { traceparent: h.traceparent, ...(it.headers as object ?? {}) };
      try {
        const r = await c.query(PUSH_BATCH, [JSON.stringify(out)]);
        return r.rows.map(pushResultOf);
      } catch (e) {
        throw typed(e);
      }
    });
  }

  async close(): Promise<void> {
    if (this.owned && this.connected) await (this.client as Client).end();
  }
}
