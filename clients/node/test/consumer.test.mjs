// The consumer loop against a real server: order, failures, budgets, heartbeats,
// concurrency, stops and crashes (docs/concepts.md, "Leases" and "Acks").
import assert from "node:assert/strict";
import { spawn } from "node:child_process";
import { existsSync, mkdtempSync, readFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { test } from "node:test";
import queen from "../dist/index.js";
import { DSN, DSNS, popAll, push, queueName, runUntil, sleep, sql } from "./helpers.mjs";

const WORKER = new URL("./worker.mjs", import.meta.url).pathname;

for (const [via, dsn] of DSNS) {
  test(`order per partition, each once (${via})`, async () => {
    const q = queueName();
    await push(dsn, q, 60, 3);
    const seen = [];
    const c = new queen.Consumer({ connection: dsn, queue: q, group: "g", batch: 7, concurrency: 3, waitMs: 200,
      handler: async (m) => { seen.push([m.partition, m.offset]); await sleep(1); } });
    await runUntil(c, () => seen.length >= 60);
    assert.equal(new Set(seen.map(String)).size, 60);
    for (const p of ["p0", "p1", "p2"]) {
      assert.deepEqual(seen.filter(([x]) => x === p).map(([, o]) => o), Array.from({ length: 20 }, (_, i) => i + 1));
    }
    assert.deepEqual(await popAll(q, "g"), []);
  });

  test(`a failure is delivered again, then completes (${via})`, async () => {
    const q = queueName();
    await push(dsn, q, 3);
    const attempts = [];
    const events = [];
    let failed = false;
    const c = new queen.Consumer({ connection: dsn, queue: q, group: "g", waitMs: 200, onEvent: (e) => events.push(e),
      handler: (m) => {
        attempts.push([m.offset, m.attempt]);
        if (m.offset === 2 && !failed) { failed = true; throw new Error("first try fails"); }
      } });
    await runUntil(c, () => attempts.some(([o]) => o === 3));
    // 1 completes; 2 fails and comes back with 3 behind it, which the failed claim never ran.
    assert.deepEqual(attempts, [[1, 0], [2, 0], [2, 0], [3, 0]]);
    assert.deepEqual(events.map((e) => e.kind), ["handler_failed"]);
    assert.equal(events[0].decision.status, "failed");
    assert.match(events[0].decision.error, /first try fails/);
    assert.deepEqual(await popAll(q, "g"), []);
  });

  test(`the heartbeat keeps a slow handler's lease (${via})`, async () => {
    const q = queueName();
    await push(dsn, q, 1);
    const runs = [];
    let finished = false;
    const c = new queen.Consumer({ connection: dsn, queue: q, group: "g", leaseSeconds: 2, waitMs: 200,
      handler: async (m) => { runs.push(m.attempt); await sleep(4500); finished = true; } });
    const running = c.run({ signals: false });
    for (let i = 0; i < 600 && !runs.length; i++) await sleep(50);
    assert.ok(runs.length, "the handler never started");
    for (let i = 0; i < 4; i++) {
      await sleep(1000);
      assert.deepEqual(await popAll(q, "g"), []); // past its first lease, nobody else gets it
    }
    for (let i = 0; i < 600 && !finished; i++) await sleep(50);
    await sleep(300);
    c.stop();
    await running;
    assert.deepEqual(runs, [0]);
    assert.deepEqual(await popAll(q, "g"), []);
  });
}


test("retryAfter, RetryLater and Poison", async () => {
  const q = queueName();
  await push(DSN, q, 3, 3);
  const times = new Map();
  const c = new queen.Consumer({ connection: DSN, queue: q, group: "g", maxPartitions: 3, waitMs: 200,
    handler: (m) => {
      times.set(m.payload, [...(times.get(m.payload) ?? []), Date.now()]);
      if (m.payload === 0 && m.attempt === 0) throw new queen.RetryLater(1.5);
      if (m.payload === 1) throw new queen.Poison("never");
    } });
  await runUntil(c, () => (times.get(0) ?? []).length === 2 && times.has(2));
  const [a, b] = times.get(0);
  assert.ok(b - a >= 1400, `retryAfter held the lane back (${b - a} ms)`);
  const dead = await sql("SELECT data, error_message FROM queen.dlq($1)", [q]);
  assert.deepEqual(dead, [{ data: 1, error_message: "never" }]);
});

test("dead-lettered after the retry budget", async () => {
  const q = queueName();
  await sql("SELECT queen.configure($1, retry_limit => 2)", [q]);
  await push(DSN, q, 1);
  const tries = [];
  const c = new queen.Consumer({ connection: DSN, queue: q, group: "g", waitMs: 200,
    handler: (m) => { tries.push(m.attempt); throw new Error("always"); } });
  let dead = 0;
  const poll = setInterval(async () => { dead = Number((await sql("SELECT count(*) AS n FROM queen.dlq($1)", [q]))[0].n); }, 100);
  await runUntil(c, () => dead === 1);
  clearInterval(poll);
  assert.deepEqual(tries, [0, 1, 2]);
  const [{ error_message }] = await sql("SELECT error_message FROM queen.dlq($1)", [q]);
  assert.match(error_message, /Error: always/);
});

test("may_start says no: the claim goes back with the server's SQL0105", async () => {
  const q = queueName();
  await push(DSN, q, 3);
  const events = [];
  const ran = [];
  const c = new queen.Consumer({ connection: DSN, queue: q, group: "g", batch: 3, leaseSeconds: 2, handlerTimeout: 5,
    waitMs: 1000, onEvent: (e) => events.push(e), handler: (m) => ran.push(m) });
  assert.equal(await c.runOnce(), 3);
  assert.deepEqual(ran, []);
  assert.deepEqual(events.map((e) => e.kind), ["may_not_start"]);
  assert.match(events[0].warning, /^SQL0105: queued message has insufficient lease time/);
  assert.deepEqual((await popAll(q, "g")).map(([, o]) => o), [1, 2, 3]);
});

test("concurrency runs handlers at once", async () => {
  const q = queueName();
  await push(DSN, q, 4, 4);
  let running = 0;
  let most = 0;
  const done = [];
  const c = new queen.Consumer({ connection: DSN, queue: q, group: "g", concurrency: 4, waitMs: 200,
    handler: async (m) => {
      running++;
      most = Math.max(most, running);
      // Waits until four handlers run at once (or 10 s: the assertion below then fails).
      for (let i = 0; i < 200 && most < 4; i++) await sleep(50);
      running--;
      done.push(m.payload);
    } });
  await runUntil(c, () => done.length === 4);
  assert.equal(most, 4);
});

test("batchHandler", async () => {
  const q = queueName();
  await push(DSN, q, 6, 2);
  const batches = [];
  const c = new queen.Consumer({ connection: DSN, queue: q, group: "g", batch: 6, maxPartitions: 2, waitMs: 200,
    batchHandler: (ms) => {
      batches.push(ms.map((m) => `${m.partition}/${m.offset}`).sort());
      if (batches.length === 1) throw new Error("the whole batch fails once");
    } });
  await runUntil(c, () => batches.flat().length >= 12);
  const all = ["p0/1", "p0/2", "p0/3", "p1/1", "p1/2", "p1/3"];
  assert.deepEqual(batches[0], all);
  // The failed batch runs again within its claim, one message at a time; every one
  // completes, so nothing is left.
  assert.ok(batches.slice(1).every((b) => b.length === 1));
  assert.deepEqual(batches.slice(1).flat().sort(), all);
  assert.deepEqual(await popAll(q, "g"), []);
});

const log = (path) => (existsSync(path) ? readFileSync(path, "utf8").split("\n").filter(Boolean) : []);

function spawnWorker(dsn, q, lease, sleepS, logPath, waitMs = 1000) {
  const child = spawn(process.execPath, [WORKER, dsn, q, "g", logPath, String(lease), String(sleepS), String(waitMs)],
    { stdio: ["ignore", "pipe", "inherit"] });
  let out = "";
  child.stdout.on("data", (d) => { out += d; });
  const exited = new Promise((r) => child.on("exit", (code, signal) => r({ code, signal, out: () => out })));
  return { child, exited };
}

for (const [via, dsn] of DSNS) {
  test(`SIGTERM stops gracefully (${via})`, async () => {
    const q = queueName();
    await push(dsn, q, 5);
    const path = join(mkdtempSync(join(tmpdir(), "queen-")), "log");
    const { child, exited } = spawnWorker(dsn, q, 600, 1.5, path);
    for (let i = 0; i < 600 && !log(path).includes("start 1"); i++) await sleep(50);
    assert.ok(log(path).includes("start 1"));
    child.kill("SIGTERM");
    const { code, out } = await exited;
    assert.equal(code, 0);
    assert.match(out(), /stopped/);
    // The running handler finished and was acked; the rest was released, not left under
    // its 600-second lease.
    assert.deepEqual(log(path), ["start 1", "done 1"]);
    assert.deepEqual((await popAll(q, "g")).map(([, o]) => o), [2, 3, 4, 5]);
  });

  test(`a killed worker's message comes back after its lease (${via})`, async () => {
    const q = queueName();
    await push(dsn, q, 1);
    const path = join(mkdtempSync(join(tmpdir(), "queen-")), "log");
    const { child, exited } = spawnWorker(dsn, q, 2, 60, path);
    for (let i = 0; i < 600 && !log(path).includes("start 1"); i++) await sleep(50);
    assert.ok(log(path).includes("start 1"));
    child.kill("SIGKILL"); // kill -9 mid-handler
    await exited;
    const got = [];
    const c = new queen.Consumer({ connection: dsn, queue: q, group: "g", waitMs: 8000, handler: (m) => got.push(m) });
    assert.equal(await c.runOnce(), 1);
    assert.deepEqual(got.map((m) => [m.offset, m.attempt]), [[1, 1]]);
  });
}

test("SIGTERM cancels a long-poll", async () => {
  const q = queueName();
  const path = join(mkdtempSync(join(tmpdir(), "queen-")), "log");
  const app = `queen-${q}`;
  const url = `${DSN}${DSN.includes("?") ? "&" : "?"}application_name=${app}`;
  const { child, exited } = spawnWorker(url, q, 60, 0, path, 60000);
  // Wait until its pop is running on the server: a SIGTERM then has a long-poll to cancel.
  let polling = false;
  for (let i = 0; i < 600 && !polling; i++) {
    const [{ n }] = await sql("SELECT count(*)::int AS n FROM pg_stat_activity WHERE application_name = $1" +
      " AND state = 'active' AND query LIKE '%queen.pop%'", [app]);
    polling = n > 0;
    if (!polling) await sleep(50);
  }
  assert.ok(polling, "the worker's long-poll never showed up");
  const t0 = Date.now();
  child.kill("SIGTERM");
  const { code } = await exited;
  assert.equal(code, 0);
  assert.ok(Date.now() - t0 < 20000, `it did not wait out its 60-second long-poll (${Date.now() - t0} ms)`);
});

test("which errors the loop goes on after", () => {
  // Lost connections (a socket's system error too), class 40, 57014, and the server's
  // "retry later" states (53400, a full shared-memory table; 55P03, a lock_timeout).
  for (const code of ["08006", "40001", "40P01", "57014", "57P01", "53400", "55P03"]) {
    assert.ok(queen.isRetryable(new queen.QueenError("x", { sqlstate: code })), code);
  }
  const epipe = Object.assign(new Error("write EPIPE"), { code: "EPIPE", errno: -32, syscall: "write" });
  assert.ok(queen.isTransient(epipe));
  for (const code of ["22023", "42501", "0A000"]) {
    assert.ok(!queen.isRetryable(new queen.QueenError("x", { sqlstate: code })), code);
  }
});

test("LeaseClock: a third after the start, at once when under a third is left", async () => {
  const { LeaseClock } = await import("../dist/common.js");
  const c = new LeaseClock(30, 100_000); // a 30 s lease that ends at t = 100 s (ms)
  assert.equal(c.due(70_000), 80_000);
  assert.equal(c.due(85_000), 90_000);
  assert.equal(c.due(95_000), 90_000);
  assert.equal(c.extended(95_000), 105_000);
  assert.equal(c.expires, 125_000);
});
