import assert from "node:assert/strict";
import { test } from "node:test";
import pg from "pg";
import queen from "../dist/index.js";
import { DSN, popAll, queueName, sql } from "./helpers.mjs";

test("push, pushBatch, duplicates", async () => {
  const q = queueName();
  const p = new queen.Producer(DSN);
  const r = await p.push(q, { n: 1 }, { partition: "a", transactionId: "t-1", headers: { k: "v" } });
  assert.deepEqual([r.status, r.offset, r.transactionId], ["queued", 1, "t-1"]);
  const rows = await p.pushBatch([{ payload: { n: 2 }, partition: "a" }, { payload: { n: 3 }, partition: "b" }], { queue: q });
  assert.deepEqual(rows.map((x) => [x.idx, x.offset]), [[0, 2], [1, 1]]);
  const again = await p.push(q, { n: 1 }, { partition: "a", transactionId: "t-1" });
  assert.equal(again.status, "duplicate");
  assert.equal(again.messageId, r.messageId);
  await p.close();
  assert.deepEqual((await popAll(q)).sort(), [["a", 1, { n: 1 }], ["a", 2, { n: 2 }], ["b", 1, { n: 3 }]]);
});

test("the outbox: a push on the caller's client commits or rolls back with it", async () => {
  const q = queueName();
  const mine = new pg.Client({ connectionString: DSN });
  await mine.connect();
  await mine.query("BEGIN");
  await new queen.Producer(mine).push(q, { order: 1 });
  await mine.query("ROLLBACK");
  assert.deepEqual(await popAll(q), []);
  await mine.query("BEGIN");
  await new queen.Producer(mine).push(q, { order: 2 });
  assert.deepEqual(await popAll(q), []); // not visible before the caller commits
  await mine.query("COMMIT");
  await mine.end();
  assert.deepEqual(await popAll(q), [["Default", 1, { order: 2 }]]);
});

test("deliverAt in a batch", async () => {
  const q = queueName();
  const p = new queen.Producer(DSN);
  await p.pushBatch([{ payload: 1, deliverAt: new Date(Date.now() + 3600e3) }, { payload: 2, partition: "now" }], { queue: q });
  await p.close();
  assert.deepEqual(await popAll(q), [["now", 1, 2]]);
});

test("typed errors by SQLSTATE", async () => {
  const q = queueName();
  const p = new queen.Producer(DSN);
  await assert.rejects(p.push("bad name!", {}), (e) => e instanceof queen.InvalidArgument && e.sqlstate === "22023" && e.cause !== undefined);
  await sql("SELECT queen.configure($1, max_depth => 1)", [q]);
  await p.push(q, 1);
  await assert.rejects(p.push(q, 2), queen.CapacityExceeded);
  await assert.rejects(p.push(null, 1), queen.NullArgument);
  await p.close();
  await sql("SELECT queen.configure($1, create_groups => false)", [q]);
  const c = new queen.Consumer({ connection: DSN, queue: q, group: "nobody", handler: () => {}, waitMs: 0 });
  await assert.rejects(c.runOnce(), queen.UndefinedObject);
  for (const [state, cls] of Object.entries(queen.BY_SQLSTATE)) {
    assert.equal(cls.sqlstate, state);
    assert.ok(cls.prototype instanceof queen.QueenError);
  }
});
