"use strict";
Object.defineProperty(exports, "__esModule", { value: true });
exports.Producer = void 0;
/**
 * Producer: `push` and `pushBatch`, on a client of its own or on the caller's. On the
 * caller's client a push is part of the caller's transaction: it commits with the
 * application's own writes or not at all (the outbox pattern).
 */
const pg_1 = require("pg");
const common_1 = require("./common");
const errors_1 = require("./errors");
const tracing_1 = require("./tracing");
class Producer {
    client;
    owned;
    connected;
    /** A `pg` client or pool client (its transactions are yours), or a connection string /
     * config (a client of its own; `close()` it). */
    constructor(target) {
        if (typeof target === "string" || typeof target.query !== "function") {
            this.client = new pg_1.Client(typeof target === "string" ? { connectionString: target } : target);
            this.owned = true;
        }
        else {
            this.client = target;
            this.owned = false;
        }
    }
    async ready() {
        if (this.owned)
            this.connected ??= this.client.connect();
        await this.connected;
        return this.client;
    }
    /** Pushes one message; `status` is `queued`, or `duplicate` for a repeated transactionId. */
    async push(queue, payload, opts = {}) {
        const c = await this.ready();
        return (0, tracing_1.sendSpan)(queue, opts.headers, async (headers) => {
            try {
                const r = await c.query(common_1.PUSH, [queue, JSON.stringify(payload), opts.partition ?? "Default",
                    opts.transactionId ?? null, headers === null ? null : JSON.stringify(headers), opts.deliverAt ?? null]);
                return (0, common_1.pushResultOf)(r.rows[0]);
            }
            catch (e) {
                throw (0, errors_1.typed)(e);
            }
        });
    }
    /** Pushes several messages atomically (`queue` for items that name none). */
    async pushBatch(items, opts = {}) {
        const c = await this.ready();
        const out = items.map((it) => {
            const o = { ...it, queue: it.queue ?? opts.queue };
            if (it.deliverAt instanceof Date)
                o.deliverAt = it.deliverAt.toISOString();
            return o;
        });
        return (0, tracing_1.sendSpan)(opts.queue ?? String(out[0]?.queue ?? "batch"), null, async (h) => {
            if (h?.traceparent)
                for (const it of out)
                    it.headers = { traceparent: h.traceparent, ...(it.headers ?? {}) };
            try {
                const r = await c.query(common_1.PUSH_BATCH, [JSON.stringify(out)]);
                return r.rows.map(common_1.pushResultOf);
            }
            catch (e) {
                throw (0, errors_1.typed)(e);
            }
        });
    }
    async close() {
        if (this.owned && this.connected)
            await this.client.end();
    }
}
exports.Producer = Producer;
