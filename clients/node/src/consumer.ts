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
 * - While a handler runs, a heartbeat extends the lease: a third of the lease after the
 *   handler started, then every third, and at once when less than a third of the lease is
 *   left (`LeaseClock`), so a handler that started late in the lease keeps it too. Waiting
 *   messages do not extend it.
 * - A batch handler that throws is run again one message at a time, within the same claim,
 *   so that only the message that fails is charged (`failed`, `dlq`); a `retry` decision
 *   applies to the whole claim.
 * - `stop()` (and SIGTERM / SIGINT while `run()` runs, unless `signals: false`): no new
 *   pops (a long-poll in progress is cancelled), running handlers finish, what was not
 *   started is released.
 */
import { Client, ClientConfig } from "pg";
import {
  ACK, checked, Decision, defaultErrorPolicy, ErrorPolicy, EXTEND, LaneResult, lanesOf, LeaseClock, MAY_START, Message,
  messageOf, POP, QUEUE_MODE, RELEASE, SQL0105,
} from "./common";
import { isRetryable, isTransient, typed } from "./errors";
import { processSpan } from "./tracing";

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

interface Worker { client: Client; warning?: string }

/** A client for a connection string or a `pg` config. */
function clientFor(c: string | ClientConfig): Client {
  return new Client(typeof c === "string" ? { connectionString: c } : c);
}

export class Consumer {
  readonly queue: string;
  readonly group: string;
  private readonly o: ConsumerOptions;
  private stopping = false;
  private readonly polling = new Set<Client>();
  private hb: Client | undefined;
  private hbChain: Promise<unknown> = Promise.resolve();

  constructor(opts: ConsumerOptions) {
    if (!opts.handler === !opts.batchHandler) throw new TypeError("give exactly one of handler and batchHandler");
    if ((opts.concurrency ?? 1) < 1) throw new RangeError("concurrency must be at least 1");
    this.o = opts;
    this.queue = opts.queue;
    this.group = opts.group ?? QUEUE_MODE;
  }

  /** Runs the workers until `stop()` (or SIGTERM / SIGINT with `signals`); resolves once
   * every worker acked its last claim. */
  async run(opts: { signals?: boolean } = {}): Promise<void> {
    const onSignal = () => this.stop();
    if (opts.signals !== false) {
      process.once("SIGTERM", onSignal);
      process.once("SIGINT", onSignal);
    }
    try {
      const workers = Array.from({ length: this.o.concurrency ?? 1 }, () => this.work());
      const results = await Promise.allSettled(workers);
      const failed = results.find((r) => r.status === "rejected") as PromiseRejectedResult | undefined;
      if (failed) throw failed.reason;
    } finally {
      process.removeListener("SIGTERM", onSignal);
      process.removeListener("SIGINT", onSignal);
      await this.closeHeartbeat();
    }
  }

  /** Ends the heartbeat's client once its last extension is done. */
  private async closeHeartbeat(): Promise<void> {
    await this.hbChain.catch(() => undefined);
    const hb = this.hb;
    this.hb = undefined;
    if (hb) await hb.end().catch(() => undefined);
  }

  /** Stops gracefully: no new pops; running handlers finish; what was not started is released. */
  stop(): void {
    this.stopping = true;
    for (const c of this.polling) {
      const canceller = new Client((c as any).connectionParameters);
      (canceller as any).cancel(c, (c as any).activeQuery);
    }
  }

  /** One pop and its claim on a client of its own; resolves to how many messages came. */
  async runOnce(): Promise<number> {
    const w = await this.connect();
    try {
      const rows = await this.pop(w);
      if (rows.length) await this.claim(w, rows.map(messageOf));
      return rows.length;
    } finally {
      await w.client.end();
      await this.closeHeartbeat();
    }
  }

  private async connect(): Promise<Worker> {
    const client = clientFor(this.o.connection);
    const w: Worker = { client };
    client.on("notice", (n: { message?: string; detail?: string }) => {
      if ((n.message ?? "").startsWith(SQL0105)) w.warning = n.message + (n.detail ? ` (${n.detail})` : "");
    });
    client.on("error", () => undefined); // a lost connection surfaces on the next query
    await client.connect();
    return w;
  }

  private async work(): Promise<void> {
    let w: Worker | undefined;
    try {
      while (!this.stopping) {
        try {
          w ??= await this.connect();
          const rows = await this.pop(w);
          if (rows.length) await this.claim(w, rows.map(messageOf));
        } catch (e) {
          if (!isRetryable(e) || this.stopping) throw e;
          // A lost connection, a deadlock, a timeout: a claim not acked comes back when its
          // lease expires. Go on after a pause, on a new client if the connection is gone.
          console.warn(`queen: ${e}; going on`);
          if (isTransient(e)) {
            await w?.client.end().catch(() => undefined);
            w = undefined;
          }
          await new Promise((r) => setTimeout(r, 1000));
        }
      }
    } catch (e) {
      this.stop(); // one worker's error stops the others
      throw e;
    } finally {
      await w?.client.end().catch(() => undefined);
    }
  }

  private async pop(w: Worker): Promise<any[]> {
    if (this.stopping) return [];
    this.polling.add(w.client);
    try {
      const o = this.o;
      const r = await w.client.query(POP, [this.queue, this.group, o.batch ?? 10, o.partition ?? null,
        o.leaseSeconds ?? 0, o.waitMs ?? 2000, o.maxPartitions ?? 1]);
      return r.rows;
    } catch (e) {
      if ((e as { code?: string }).code === "57014" && this.stopping) return []; // our cancel
      throw typed(e);
    } finally {
      this.polling.delete(w.client);
    }
  }

  private async claim(w: Worker, messages: Message[]): Promise<void> {
    const popped = performance.now();
    const lease = messages[0].leaseId;
    const lanes = lanesOf(messages);
    const results = lanes.map((l) => new LaneResult(l[0].partitionId));
    const clock = LeaseClock.of(this.o.leaseSeconds, messages[0], popped);
    try {
      if (this.o.batchHandler) await this.runBatch(w, lanes, results, clock);
      else await this.runEach(w, lanes, results, clock);
    } finally {
      // Whatever was not run (a stop, may_start, an error out of the loop) goes back at once.
      lanes.forEach((lane, i) => {
        const r = results[i];
        const rest = lane.filter((m) => r.completed === undefined || m.offset > r.completed);
        if (rest.length) r.stop(rest[0].offset, RELEASE);
      });
      if (lease) await this.ack(w, lease, results, messages);
    }
  }

  private async runEach(w: Worker, lanes: Message[][], results: LaneResult[], clock: LeaseClock,
    run: (m: Message) => Promise<unknown> | unknown = (m) => this.o.handler!(m)): Promise<void> {
    for (let i = 0; i < lanes.length; i++) {
      for (const m of lanes[i]) {
        if (this.stopping || !(await this.mayStart(w, m))) return;
        try {
          await this.handling(m, clock, () => processSpan(this.queue, this.group, m, async () => run(m)));
        } catch (e) {
          results[i].stop(m.offset, this.failed(e, m));
          break;
        }
        results[i].complete(m.offset);
      }
    }
  }

  private async runBatch(w: Worker, lanes: Message[][], results: LaneResult[], clock: LeaseClock): Promise<void> {
    const all = lanes.flat();
    if (this.stopping || !(await this.mayStart(w, all[0]))) return;
    try {
      await this.handling(all[0], clock, () => processSpan(this.queue, this.group, all[0], async () => this.o.batchHandler!(all)));
    } catch (e) {
      const decision = checked((this.o.errorPolicy ?? defaultErrorPolicy)(e, all[0]));
      if (decision.status === "retry") {
        // A free retry: every lane from its first, with the one decision.
        this.emit({ kind: "handler_failed", message: all[0], error: e, decision });
        lanes.forEach((lane, i) => results[i].stop(lane[0].offset, decision));
        return;
      }
      if (all.length > 1) {
        // Which message failed is not known, and charging each lane's first would
        // dead-letter (or drop) messages that may be sound: run the claim again one message
        // at a time, on a lease extended for it, so that only a message that fails is
        // charged.
        await this.extendNow(w, all[0], clock);
        await this.runEach(w, lanes, results, clock, (m) => this.o.batchHandler!([m]));
        if (results.some((r) => r.completed !== undefined || r.stopped !== undefined)) return;
        // Not one could start (may_start, a stop): charge the first lane's first message,
        // so that a batch that always fails is not handed back free for ever.
      }
      results[0].stop(lanes[0][0].offset, this.failed(e, lanes[0][0]));
      return;
    }
    lanes.forEach((lane, i) => results[i].complete(lane[lane.length - 1].offset));
  }

  /** Extends the claim's lease by its length now (when the heartbeat is on). */
  private async extendNow(w: Worker, m: Message, clock: LeaseClock): Promise<void> {
    if (this.o.heartbeat === false || !m.leaseId) return;
    try {
      await w.client.query(EXTEND, [m.leaseId, clock.seconds]);
    } catch (e) {
      throw typed(e);
    }
    clock.extended(performance.now());
  }

  /** Runs `f` (a handler) with a heartbeat extending the lease as `clock` says. */
  private async handling<T>(m: Message, clock: LeaseClock, f: () => Promise<T>): Promise<T> {
    if (this.o.heartbeat === false || !m.leaseId) return f();
    const seconds = clock.seconds;
    let timer: ReturnType<typeof setTimeout> | undefined;
    const schedule = (due: number) => {
      timer = setTimeout(() => {
        schedule(clock.extended(performance.now()));
        beat();
      }, Math.max(0, due - performance.now()));
    };
    const beat = () => {
      this.hbChain = this.hbChain.then(async () => {
        try {
          if (!this.hb) {
            const hb = clientFor(this.o.connection);
            hb.on("error", () => undefined);
            await hb.connect();
            this.hb = hb;
          }
          await this.hb.query(EXTEND, [m.leaseId, seconds]);
        } catch (e) {
          console.warn(`queen: heartbeat of lease ${m.leaseId} failed: ${e}`);
          this.hb = undefined;
        }
      });
    };
    schedule(clock.due(performance.now()));
    try {
      return await f();
    } finally {
      clearTimeout(timer);
    }
  }

  private async mayStart(w: Worker, m: Message): Promise<boolean> {
    if (this.o.checkMayStart === false || !m.leaseId) return true;
    w.warning = undefined;
    let ok: boolean;
    try {
      const t = this.o.handlerTimeout;
      const r = await w.client.query(MAY_START, [m.leaseId, t === undefined ? null : `${t} seconds`]);
      ok = r.rows[0].ok;
    } catch (e) {
      throw typed(e);
    }
    if (!ok) this.emit({ kind: "may_not_start", message: m, warning: w.warning });
    return ok;
  }

  private failed(e: unknown, m: Message): Decision {
    const decision = checked((this.o.errorPolicy ?? defaultErrorPolicy)(e, m));
    this.emit({ kind: "handler_failed", message: m, error: e, decision });
    return decision;
  }

  private async ack(w: Worker, lease: string, results: LaneResult[], messages: Message[]): Promise<void> {
    const items = results.flatMap((r) => r.items());
    if (!items.length) return;
    let report: any;
    for (let attempt = 0; ; attempt++) {
      try {
        report = (await w.client.query(ACK, [lease, JSON.stringify(items)])).rows[0].report;
        break;
      } catch (e) {
        // A stop's cancel that arrived late: try again.
        if ((e as { code?: string }).code !== "57014" || attempt === 2) throw typed(e);
      }
    }
    if ((report.items ?? []).some((i: { success?: boolean }) => !i.success)) this.emit({ kind: "lease_lost", message: messages[0] });
  }

  private emit(e: ConsumerEvent): void {
    this.o.onEvent?.(e);
  }
}
