// Fixtures: a real cluster with queen (QUEEN_DSN, a URL) and PgBouncer in transaction
// mode in front of it (QUEEN_POOLER_URL). `make test` starts both (scripts/clients.sh).
import { randomUUID } from "node:crypto";
import pg from "pg";
import queen from "../dist/index.js";

export const DSN = process.env.QUEEN_DSN ?? "postgresql://postgres@127.0.0.1:5487/queen_it";
export const POOLER = process.env.QUEEN_POOLER_URL || undefined;
/** Each test using it runs directly and through PgBouncer (when configured). */
export const DSNS = [["direct", DSN], ...(POOLER ? [["pgbouncer", POOLER]] : [])];

export const queueName = () => `js-${randomUUID().slice(0, 12)}`;
export const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

export async function sql(text, params = []) {
  const c = new pg.Client({ connectionString: DSN });
  await c.connect();
  try {
    return (await c.query(text, params)).rows;
  } finally {
    await c.end();
  }
}

/** Every message a fresh pop can claim now (auto-ack): [[partition, offset, payload]]. */
export async function popAll(queue, group = "__QUEUE_MODE__") {
  const rows = await sql(
    "SELECT partition, msg_offset, payload FROM queen.pop($1, $2, batch => 1000, max_partitions => 100, auto_ack => true)",
    [queue, group]);
  return rows.map((r) => [r.partition, Number(r.msg_offset), r.payload]);
}

export async function push(dsn, queue, n, partitions = 1) {
  const p = new queen.Producer(dsn);
  await p.pushBatch(Array.from({ length: n }, (_, i) => ({ payload: i, partition: `p${i % partitions}` })), { queue });
  await p.close();
}

/** Runs the consumer until done() or the timeout, then stops it. */
export async function runUntil(consumer, done, timeoutMs = 30000) {
  const running = consumer.run({ signals: false });
  const deadline = Date.now() + timeoutMs;
  while (!done() && Date.now() < deadline) await sleep(50);
  consumer.stop();
  await running;
  if (!done()) throw new Error("the consumer did not get there in time");
}
