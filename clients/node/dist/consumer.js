"use strict";
Object.defineProperty(exports, "__esModule", { value: true });
exports.Consumer = void 0;
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
const pg_1 = require("pg");
const common_1 = require("./common");
const errors_1 = require("./errors");
const tracing_1 = require("./tracing");
class Consumer {
    queue;
    group;
    o;
    stopping = false;
    polling = new Set();
    hb;
    hbChain = Promise.resolve();
    constructor(opts) {
        if (!opts.handler === !opts.batchHandler)
            throw new TypeError("give exactly one of handler and batchHandler");
        if ((opts.concurrency ?? 1) < 1)
            throw new RangeError("concurrency must be at least 1");
        this.o = opts;
        this.queue = opts.queue;
        this.group = opts.group ?? common_1.QUEUE_MODE;
    }
    /** Runs the workers until `stop()` (or SIGTERM / SIGINT with `signals`); resolves once
     * every worker acked its last claim. */
    async run(opts = {}) {
        const onSignal = () => this.stop();
        if (opts.signals !== false) {
            process.once("SIGTERM", onSignal);
            process.once("SIGINT", onSignal);
        }
        try {
            const workers = Array.from({ length: this.o.concurrency ?? 1 }, () => this.work());
            const results = await Promise.allSettled(workers);
            const failed = results.find((r) => r.status === "rejected");
            if (failed)
                throw failed.reason;
        }
        finally {
            process.removeListener("SIGTERM", onSignal);
            process.removeListener("SIGINT", onSignal);
            const hb = this.hb;
            this.hb = undefined;
            await this.hbChain.catch(() => undefined);
            if (hb)
                await hb.end().catch(() => undefined);
        }
    }
    /** Stops gracefully: no new pops; running handlers finish; what was not started is released. */
    stop() {
        this.stopping = true;
        for (const c of this.polling) {
            const canceller = new pg_1.Client(c.connectionParameters);
            canceller.cancel(c, c.activeQuery);
        }
    }
    /** One pop and its claim on a client of its own; resolves to how many messages came. */
    async runOnce() {
        const w = await this.connect();
        try {
            const rows = await this.pop(w);
            if (rows.length)
                await this.claim(w, rows.map(common_1.messageOf));
            return rows.length;
        }
        finally {
            await w.client.end();
        }
    }
    async connect() {
        const c = this.o.connection;
        const client = new pg_1.Client(typeof c === "string" ? { connectionString: c } : c);
        const w = { client };
        client.on("notice", (n) => {
            if ((n.message ?? "").startsWith(common_1.SQL0105))
                w.warning = n.message + (n.detail ? ` (${n.detail})` : "");
        });
        client.on("error", () => undefined); // a lost connection surfaces on the next query
        await client.connect();
        return w;
    }
    async work() {
        let w;
        try {
            while (!this.stopping) {
                try {
                    w ??= await this.connect();
                    const rows = await this.pop(w);
                    if (rows.length)
                        await this.claim(w, rows.map(common_1.messageOf));
                }
                catch (e) {
                    if (!(0, errors_1.isTransient)(e) || this.stopping)
                        throw e;
                    // The connection is gone: a claim not acked comes back when its lease expires.
                    await w?.client.end().catch(() => undefined);
                    w = undefined;
                    await new Promise((r) => setTimeout(r, 1000));
                }
            }
        }
        catch (e) {
            this.stop(); // one worker's error stops the others
            throw e;
        }
        finally {
            await w?.client.end().catch(() => undefined);
        }
    }
    async pop(w) {
        if (this.stopping)
            return [];
        this.polling.add(w.client);
        try {
            const o = this.o;
            const r = await w.client.query(common_1.POP, [this.queue, this.group, o.batch ?? 10, o.partition ?? null,
                o.leaseSeconds ?? 0, o.waitMs ?? 2000, o.maxPartitions ?? 1]);
            return r.rows;
        }
        catch (e) {
            if (e.code === "57014" && this.stopping)
                return []; // our cancel
            throw (0, errors_1.typed)(e);
        }
        finally {
            this.polling.delete(w.client);
        }
    }
    async claim(w, messages) {
        const lease = messages[0].leaseId;
        const lanes = (0, common_1.lanesOf)(messages);
        const results = lanes.map((l) => new common_1.LaneResult(l[0].partitionId));
        try {
            if (this.o.batchHandler)
                await this.runBatch(w, lanes, results);
            else
                await this.runEach(w, lanes, results);
        }
        finally {
            // Whatever was not run (a stop, may_start, an error out of the loop) goes back at once.
            lanes.forEach((lane, i) => {
                const r = results[i];
                const rest = lane.filter((m) => r.completed === undefined || m.offset > r.completed);
                if (rest.length)
                    r.stop(rest[0].offset, common_1.RELEASE);
            });
            if (lease)
                await this.ack(w, lease, results, messages);
        }
    }
    async runEach(w, lanes, results) {
        for (let i = 0; i < lanes.length; i++) {
            for (const m of lanes[i]) {
                if (this.stopping || !(await this.mayStart(w, m)))
                    return;
                try {
                    await this.handling(m, () => (0, tracing_1.processSpan)(this.queue, this.group, m, async () => this.o.handler(m)));
                }
                catch (e) {
                    results[i].stop(m.offset, this.failed(e, m));
                    break;
                }
                results[i].complete(m.offset);
            }
        }
    }
    async runBatch(w, lanes, results) {
        const all = lanes.flat();
        if (this.stopping || !(await this.mayStart(w, all[0])))
            return;
        try {
            await this.handling(all[0], () => (0, tracing_1.processSpan)(this.queue, this.group, all[0], async () => this.o.batchHandler(all)));
        }
        catch (e) {
            lanes.forEach((lane, i) => results[i].stop(lane[0].offset, this.failed(e, lane[0])));
            return;
        }
        lanes.forEach((lane, i) => results[i].complete(lane[lane.length - 1].offset));
    }
    /** Runs `f` with a heartbeat extending the lease every third of its length. */
    async handling(m, f) {
        if (this.o.heartbeat === false || !m.leaseId)
            return f();
        const seconds = this.leaseLength(m);
        const timer = setInterval(() => {
            this.hbChain = this.hbChain.then(async () => {
                try {
                    if (!this.hb) {
                        const c = this.o.connection;
                        const hb = new pg_1.Client(typeof c === "string" ? { connectionString: c } : c);
                        hb.on("error", () => undefined);
                        await hb.connect();
                        this.hb = hb;
                    }
                    await this.hb.query(common_1.EXTEND, [m.leaseId, seconds]);
                }
                catch (e) {
                    console.warn(`queen: heartbeat of lease ${m.leaseId} failed: ${e}`);
                    this.hb = undefined;
                }
            });
        }, (seconds * 1000) / 3);
        try {
            return await f();
        }
        finally {
            clearInterval(timer);
        }
    }
    leaseLength(m) {
        if (this.o.leaseSeconds)
            return this.o.leaseSeconds;
        if (m.leaseExpiresAt) {
            const left = (m.leaseExpiresAt.getTime() - Date.now()) / 1000;
            if (left >= 1)
                return Math.ceil(left);
        }
        return 60;
    }
    async mayStart(w, m) {
        if (this.o.checkMayStart === false || !m.leaseId)
            return true;
        w.warning = undefined;
        let ok;
        try {
            const t = this.o.handlerTimeout;
            const r = await w.client.query(common_1.MAY_START, [m.leaseId, t === undefined ? null : `${t} seconds`]);
            ok = r.rows[0].ok;
        }
        catch (e) {
            throw (0, errors_1.typed)(e);
        }
        if (!ok)
            this.emit({ kind: "may_not_start", message: m, warning: w.warning });
        return ok;
    }
    failed(e, m) {
        const decision = (this.o.errorPolicy ?? common_1.defaultErrorPolicy)(e, m);
        this.emit({ kind: "handler_failed", message: m, error: e, decision });
        return decision;
    }
    async ack(w, lease, results, messages) {
        const items = results.flatMap((r) => r.items());
        if (!items.length)
            return;
        let report;
        for (let attempt = 0;; attempt++) {
            try {
                report = (await w.client.query(common_1.ACK, [lease, JSON.stringify(items)])).rows[0].report;
                break;
            }
            catch (e) {
                // A stop's cancel that arrived late: try again.
                if (e.code !== "57014" || attempt === 2)
                    throw (0, errors_1.typed)(e);
            }
        }
        if ((report.items ?? []).some((i) => !i.success))
            this.emit({ kind: "lease_lost", message: messages[0] });
    }
    emit(e) {
        this.o.onEvent?.(e);
    }
}
exports.Consumer = Consumer;
