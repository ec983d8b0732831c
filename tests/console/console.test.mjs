// The web console (`queenctl serve`) in a real headless browser, Debian's Chromium driven by
// puppeteer-core: each page loads and shows what the database holds; a dead letter is
// replayed and a group paused from the page; a read-only console shows no form and refuses
// a POST. A screenshot of each page is kept in $QUEEN_CONSOLE_SHOTS.
import assert from "node:assert/strict";
import http from "node:http";
import { spawn } from "node:child_process";
import { mkdirSync } from "node:fs";
import { after, before, test } from "node:test";
import pg from "pg";
import puppeteer from "puppeteer-core";

const DSN = process.env.QUEEN_DSN; // a URL
const QUEENCTL = process.env.QUEENCTL;
const SHOTS = process.env.QUEEN_CONSOLE_SHOTS ?? "/tmp/queen-console-shots";
const Q = `console-${Date.now()}`;
mkdirSync(SHOTS, { recursive: true });

const db = new pg.Client({ connectionString: DSN });
let browser;
const servers = [];

async function serve(port, writes) {
  const args = ["--dsn", DSN, "serve", "--listen", `127.0.0.1:${port}`, "--sample", "0.3", ...(writes ? ["--allow-writes"] : [])];
  const child = spawn(QUEENCTL, args, { stdio: ["ignore", "ignore", "pipe"] });
  servers.push(child);
  await new Promise((resolve, reject) => {
    child.stderr.on("data", (d) => { if (String(d).includes("http://")) resolve(); });
    child.on("exit", (code) => reject(new Error(`queenctl serve exited ${code}`)));
  });
  return `http://127.0.0.1:${port}`;
}

before(async () => {
  await db.connect();
  // Two partitions, group g: 6 messages, 2 consumed; 2 more dead-lettered.
  await db.query("SELECT count(*) FROM queen.push_batch($1)", [JSON.stringify(
    [1, 2, 3, 4, 5, 6].map((i) => ({ queue: Q, partition: i % 2 ? "odd" : "even", payload: { i } })))]);
  await db.query("SELECT count(*) FROM queen.pop($1, 'g', batch => 1, partition => 'odd', auto_ack => true)", [Q]);
  await db.query("SELECT count(*) FROM queen.pop($1, 'g', batch => 1, partition => 'even', auto_ack => true)", [Q]);
  for (const [p, n] of [["odd", 1], ["even", 2]]) {
    const { rows: [m] } = await db.query("SELECT lease_id, partition_id, msg_offset FROM queen.pop($1, 'g', partition => $2)", [Q, p]);
    await db.query("SELECT queen.ack($1, $2, $3, 'dlq', $4)", [m.lease_id, m.partition_id, m.msg_offset, `broken-${n}`]);
  }
  browser = await puppeteer.launch({ executablePath: "/usr/bin/chromium", headless: true,
    args: ["--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage"] });
});

after(async () => {
  await browser?.close();
  for (const s of servers) s.kill();
  await db.end();
});

const cellTexts = (page, selector) => page.$$eval(selector, (rows) => rows.map((r) => [...r.querySelectorAll("td")].map((td) => td.textContent.trim())));

test("the pages show what the database holds; a dead letter is replayed and a group paused from the page", async () => {
  const base = await serve(18181, true);
  const page = await browser.newPage();
  await page.setViewport({ width: 1280, height: 900 });

  // Queues: the row of our queue has the totals' figures.
  await page.goto(`${base}/`);
  const { rows: [t] } = await db.query("SELECT partitions, messages, lag, dead_letters FROM queen.totals($1) WHERE consumer_group = 'g'", [Q]);
  const rows = await cellTexts(page, "tr");
  const mine = rows.find((r) => r[0] === Q);
  assert.ok(mine, `no row for ${Q}`);
  assert.deepEqual(mine.slice(1, 5), ["g", String(t.partitions), String(t.messages), String(t.lag)]);
  assert.equal(mine[6], String(t.dead_letters));
  await new Promise((r) => setTimeout(r, 1000)); // a few readings for the sparklines
  await page.reload();
  const drawn = await page.$$eval("tr", (trs, q) => trs.some((tr) => tr.querySelector("td a")?.textContent === q && tr.querySelector("svg.spark polyline")), Q);
  assert.ok(drawn, "our queue's row has a sparkline");
  await page.screenshot({ path: `${SHOTS}/queues.png`, fullPage: true });

  // One queue: a row per lane, as queen.status has them, and the charts.
  await page.goto(`${base}/queue/${encodeURIComponent(Q)}`);
  const { rows: lanes } = await db.query("SELECT partition, consumer_group, head, committed FROM queen.status($1) ORDER BY partition", [Q]);
  const shown = (await cellTexts(page, "h2 + table tr, h2 ~ table tr")).filter((r) => r.length && (r[0] === "odd" || r[0] === "even"));
  assert.deepEqual(shown.map((r) => r.slice(0, 4)), lanes.map((l) => [l.partition, l.consumer_group, String(l.head), String(l.committed)]));
  assert.equal((await page.$$("figure svg")).length, 3, "pushed/s, acked/s and lag charts");
  await page.screenshot({ path: `${SHOTS}/queue.png`, fullPage: true });

  // Pause group g from the page: the database says so.
  await Promise.all([page.waitForNavigation(), page.click("td form[action='/pause'] button")]);
  const { rows: [p] } = await db.query("SELECT paused FROM queen.totals($1) WHERE consumer_group = 'g'", [Q]);
  assert.equal(p.paused, true);
  await Promise.all([page.waitForNavigation(), page.click("td form[action='/resume'] button")]);

  // The DLQ, filtered by our queue: both letters; replay broken-1 from its row.
  await page.goto(`${base}/dlq?queue=${encodeURIComponent(Q)}`);
  const letters = await cellTexts(page, "tr");
  const errors = letters.filter((r) => r[1] === Q).map((r) => r[5]).sort();
  assert.deepEqual(errors, ["broken-1", "broken-2"]);
  await page.screenshot({ path: `${SHOTS}/dlq.png`, fullPage: true });
  const { rows: [letter] } = await db.query("SELECT data FROM queen.dlq($1) WHERE error_message = 'broken-1'", [Q]);
  const buttons = await page.$$("tr");
  let clicked = false;
  for (const tr of buttons) {
    const text = await tr.evaluate((e) => e.textContent);
    if (text.includes("broken-1")) {
      await Promise.all([page.waitForNavigation(), tr.$eval("form[action='/dlq/replay'] button", (b) => b.click())]);
      clicked = true;
      break;
    }
  }
  assert.ok(clicked);
  const { rows: left } = await db.query("SELECT error_message FROM queen.dlq($1)", [Q]);
  assert.deepEqual(left.map((r) => r.error_message), ["broken-2"]);
  const after = await cellTexts(page, "tr");
  assert.deepEqual(after.filter((r) => r[1] === Q).map((r) => r[5]), ["broken-2"], "the page shows the DLQ after the replay");
  // The replayed message is delivered again.
  const { rows: again } = await db.query("SELECT payload FROM queen.pop($1, 'g', batch => 10, max_partitions => 2, auto_ack => true)", [Q]);
  assert.ok(again.some((r) => r.payload.i === letter.data.i), JSON.stringify([letter, again]));
  await page.screenshot({ path: `${SHOTS}/dlq-after-replay.png`, fullPage: true });
});

test("a POST without the console's token is refused", async () => {
  const base = "http://127.0.0.1:18181"; // the console of the first test, writes allowed
  const r = await fetch(`${base}/pause`, { method: "POST", body: `queue=${Q}&back=/`, headers: { "content-type": "application/x-www-form-urlencoded" }, redirect: "manual" });
  assert.equal(r.status, 403);
  const { rows: [p] } = await db.query("SELECT bool_or(paused) AS paused FROM queen.totals($1)", [Q]);
  assert.equal(p.paused, false);
});

test("a request that names the console by another host name is refused (DNS rebinding)", async () => {
  const get = (host) => new Promise((resolve, reject) => {
    http.get({ host: "127.0.0.1", port: 18181, path: "/dlq", headers: { Host: host } }, (res) => {
      let body = "";
      res.on("data", (d) => { body += d; });
      res.on("end", () => resolve({ status: res.statusCode, body }));
    }).on("error", reject);
  });
  const evil = await get("rebound.example:18181");
  assert.equal(evil.status, 421);
  assert.ok(!evil.body.includes("name=token"), "no form token in the refusal");
  assert.equal((await get("127.0.0.1:18181")).status, 200);
  assert.equal((await get("localhost:18181")).status, 200);
});

test("a read-only console shows no form and refuses a POST", async () => {
  const base = await serve(18182, false);
  const page = await browser.newPage();
  await page.goto(`${base}/dlq?queue=${encodeURIComponent(Q)}`);
  assert.equal((await page.$$("form[method=post]")).length, 0);
  await page.screenshot({ path: `${SHOTS}/dlq-read-only.png`, fullPage: true });
  const r = await fetch(`${base}/pause`, { method: "POST", body: `queue=${Q}`, headers: { "content-type": "application/x-www-form-urlencoded" } });
  assert.equal(r.status, 403);
  const { rows: [p] } = await db.query("SELECT bool_or(paused) AS paused FROM queen.totals($1)", [Q]);
  assert.equal(p.paused, false);
});
