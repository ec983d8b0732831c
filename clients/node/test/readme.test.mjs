// The README's example, run as it is printed (with "queen-pg" resolved to this package).
import assert from "node:assert/strict";
import { execFileSync } from "node:child_process";
import { readFileSync } from "node:fs";
import { test } from "node:test";
import { DSN, popAll, sql } from "./helpers.mjs";

const readme = readFileSync(new URL("../README.md", import.meta.url), "utf8");
const example = /```javascript\n([\s\S]*?)```/.exec(readme)[1];

test("the README example runs", async () => {
  assert.ok(example.trim().split("\n").length <= 12);
  await sql("SELECT queen.delete_queue('emails')");
  const code = example.replace('from "queen-pg"', `from ${JSON.stringify(new URL("../dist/index.js", import.meta.url).pathname)}`);
  const out = execFileSync(process.execPath, ["--input-type=module", "-e", code], { env: { ...process.env, QUEEN_DSN: DSN } });
  assert.equal(out.toString().trim(), "sending to ada@example.com");
  assert.deepEqual(await popAll("emails", "mailer"), []);
});

test("the project's README shows the same example", () => {
  const main = readFileSync(new URL("../../../README.md", import.meta.url), "utf8");
  const section = main.slice(main.indexOf("### The Node.js package"));
  assert.equal(/```javascript\n([\s\S]*?)```/.exec(section)[1], example);
});
