// queen's core loop from Node.js with node-postgres: push, pop with a wait, ack, and the
// dead-letter queue, with a W3C traceparent header carried from producer to consumer. Run by `make clients` against a real cluster (QUEEN_DSN).
const assert = require("node:assert/strict");
const crypto = require("node:crypto");
const { Client } = require("pg");

async function main() {
  const db = new Client({ connectionString: process.env.QUEEN_DSN });
  await db.connect();
  const queue = `node-orders-${crypto.randomUUID().slice(0, 8)}`;

  // The producer's trace context (W3C Trace Context): version-trace id-parent id-flags.
  const hex = (n) => crypto.randomBytes(n).toString("hex");
  const trace = { traceparent: `00-${hex(16)}-${hex(8)}-01` };

  // Push: one message with the trace context in its headers, then a batch.
  await db.query("SELECT * FROM queen.push($1, $2, headers => $3)", [queue, { id: 1 }, trace]);
  await db.query("SELECT * FROM queen.push_batch($1)", [
    JSON.stringify([{ queue, payload: { id: 2 } }, { queue, payload: { id: 3 }, headers: trace }]),
  ]);

  // Pop: wait up to 2 s for up to 10 messages, under one lease. The consumer continues
  // the producer's trace from the headers.
  const { rows } = await db.query(
    "SELECT lease_id, partition_id, msg_offset, payload, headers FROM queen.pop($1, batch => 10, wait_ms => 2000)",
    [queue],
  );
  assert.deepEqual(rows.map((r) => r.payload), [{ id: 1 }, { id: 2 }, { id: 3 }]);
  assert.deepEqual(rows.map((r) => r.headers), [trace, null, trace]);

  // Ack: 1 and 2 completed; 3 goes to the dead-letter queue.
  const [{ lease_id: lease, partition_id: partition }] = rows;
  const ack = await db.query("SELECT queen.ack($1, $2) AS r", [
    lease,
    JSON.stringify([
      { partitionId: partition, offset: 2, status: "completed" },
      { partitionId: partition, offset: 3, status: "dlq", error: "bad order" },
    ]),
  ]);
  assert.equal(ack.rows[0].r.lanes[0].committed, 3);
  assert.equal(ack.rows[0].r.items[1].dlq, true);

  // The dead-letter queue: list, then replay one row by its address and id (pushes the payload again).
  const dead = await db.query(
    "SELECT partition_id, transaction_id, data, error_message, headers, id FROM queen.dlq($1)",
    [queue],
  );
  assert.deepEqual(dead.rows.map((d) => [d.data, d.error_message, d.headers]), [[{ id: 3 }, "bad order", trace]]);
  await db.query("SELECT queen.dlq_replay($1, $2, $3)", [dead.rows[0].partition_id, dead.rows[0].transaction_id, dead.rows[0].id]);
  const again = await db.query("SELECT payload, headers FROM queen.pop($1, auto_ack => true)", [queue]);
  assert.deepEqual(again.rows, [{ payload: { id: 3 }, headers: trace }]);

  await db.end();
  console.log("node (node-postgres): ok");
}

main().catch((e) => {
  console.error(e);
  process.exit(1);
});
