// The shared conformance suite (clients/conformance/scenarios.json), run by this library.
import assert from "node:assert/strict";
import { readFileSync } from "node:fs";
import { test } from "node:test";
import queen from "../dist/index.js";
import { DSN, popAll, queueName, sleep, sql } from "./helpers.mjs";

const suite = JSON.parse(readFileSync(new URL("../../conformance/scenarios.json", import.meta.url), "utf8"));

for (const s of suite.scenarios) {
  test(`conformance: ${s.name}`, async () => {
    const q = queueName();
    if (s.queue?.retry_limit !== undefined) await sql("SELECT queen.configure($1, retry_limit => $2)", [q, s.queue.retry_limit]);
    const p = new queen.Producer(DSN);
    await p.pushBatch(Array.from({ length: s.push.messages }, (_, i) => ({ payload: i, partition: `p${i % s.push.partitions}` })), { queue: q });
    await p.close();
    const h = s.handler;
    const started = [];
    const ended = [];
    const failedOnce = new Set();
    const handleBatch = async (ms) => {
      started.push(...ms.map((m) => [m.partition, m.offset]));
      try {
        if (ms.some((m) => m.offset === h.fail_when_holds)) throw new Error(`fails while it holds ${h.fail_when_holds}`);
      } finally {
        ended.push(...ms.map((m) => m.offset));
      }
    };
    const consumer = new queen.Consumer({
      connection: DSN, queue: q, group: "conformance", batch: s.consumer.batch ?? 10, concurrency: s.consumer.workers ?? 1,
      leaseSeconds: s.consumer.lease_seconds, waitMs: 200, checkMayStart: s.consumer.check_may_start ?? true,
      ...(s.consumer.batch_handler ? { batchHandler: handleBatch } : {}),
      handler: s.consumer.batch_handler ? undefined : async (m) => {
        started.push([m.partition, m.offset]);
        try {
          if (h.sleep_ms) await sleep(h.sleep_ms);
          if (h.fail_once_at === m.offset && !failedOnce.has(m.offset)) {
            failedOnce.add(m.offset);
            throw new Error("fails once");
          }
          if (h.always_fail) throw new Error(h.always_fail);
        } finally {
          ended.push(m.offset);
        }
      },
    });
    const running = consumer.run({ signals: false });
    const probes = [];
    const deadline = Date.now() + 60000;
    try {
      if (s.probe_ms) {
        while (!started.length && Date.now() < deadline) await sleep(10);
        const t0 = Date.now();
        for (const at of s.probe_ms) {
          await sleep(Math.max(0, t0 + at - Date.now()));
          probes.push(await popAll(q, "conformance"));
        }
      }
      const done = async () => {
        if (s.stop.handled !== undefined) return ended.length >= s.stop.handled;
        if (s.stop.started !== undefined) return started.length >= s.stop.started;
        return Number((await sql("SELECT count(*) AS n FROM queen.dlq($1)", [q]))[0].n) >= s.stop.dead_letters;
      };
      while (!(await done()) && Date.now() < deadline) await sleep(20);
      assert.ok(await done(), `stop condition ${JSON.stringify(s.stop)} not reached`);
    } finally {
      consumer.stop();
      await running;
    }
    const e = s.expect;
    if (e.handled) assert.deepEqual(started.map(([, o]) => o), e.handled);
    for (const [part, offsets] of Object.entries(e.handled_per_partition ?? {})) {
      assert.deepEqual(started.filter(([x]) => x === part).map(([, o]) => o), offsets);
    }
    if (e.probes_empty) assert.ok(probes.length && probes.every((x) => x.length === 0));
    if (e.dlq_error_contains) {
      const errors = (await sql("SELECT error_message FROM queen.dlq($1)", [q])).map((r) => r.error_message);
      assert.ok(errors.length && errors.every((x) => x.includes(e.dlq_error_contains)), JSON.stringify(errors));
    }
    if (e.dlq_payloads) {
      const payloads = (await sql("SELECT data FROM queen.dlq($1) ORDER BY failed_at", [q])).map((r) => r.data);
      assert.deepEqual(payloads, e.dlq_payloads);
    }
    assert.deepEqual((await popAll(q, "conformance")).map(([, o]) => o).sort((a, b) => a - b), e.left);
  });
}
