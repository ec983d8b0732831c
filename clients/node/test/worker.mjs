// A consumer in a process of its own, for the stop and crash tests:
// worker.mjs URL QUEUE GROUP LOG LEASE_SECONDS SLEEP_SECONDS [WAIT_MS]. Its handler appends
// "start <offset>" to LOG, sleeps, then appends "done <offset>".
import { appendFileSync } from "node:fs";
import queen from "../dist/index.js";

const [url, queue, group, log, lease, sleep, waitMs = "1000"] = process.argv.slice(2);
const consumer = new queen.Consumer({
  connection: url, queue, group, batch: 10, waitMs: Number(waitMs), leaseSeconds: Number(lease),
  handler: async (m) => {
    appendFileSync(log, `start ${m.offset}\n`);
    await new Promise((r) => setTimeout(r, Number(sleep) * 1000));
    appendFileSync(log, `done ${m.offset}\n`);
  },
});
await consumer.run();
console.log("stopped");
