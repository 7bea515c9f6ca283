/**
 * The console's performance (make bench-console), in the system Chromium
 * against `rebuno dev` on a database seeded by bench/console/seed:
 *
 * 1. The execution list over 10,000 executions: the server time of the first
 *    page (GET /v0/execution-summaries, keyset paging; p50 of sequential
 *    requests over loopback, which adds well under a millisecond), beside
 *    the plain list route, and the time the page takes to show its rows.
 * 2. A 10,000-step execution's timeline: what opening it reads (the newest
 *    window of events, never the whole log) and how long it takes.
 * 3. Live events: an agent takes paced steps while the timeline is open;
 *    for each event, the time it appears in the page minus its occurred_at,
 *    which the kernel stamps in the transaction before the commit, so each
 *    figure is an upper bound of commit-to-screen.
 *
 *     go run ./bench/console/seed -db /tmp/seed.db > /tmp/seed.json
 *     cd tests/console && npx tsx ../../bench/console/run.mts --seed /tmp/seed.db --info /tmp/seed.json
 */

import fs from "node:fs";
import path from "node:path";
import { performance } from "node:perf_hooks";
import { parseArgs } from "node:util";
import { World } from "../../tests/console/support/world.ts";

const { values: opts } = parseArgs({
  options: {
    seed: { type: "string" },
    info: { type: "string" },
    requests: { type: "string", default: "50" },
    live: { type: "string", default: "200" },
    json: { type: "boolean", default: false },
  },
});
if (!opts.seed || !opts.info) throw new Error("--seed DB and --info JSON (what bench/console/seed printed) are required");
const seeded: { long_execution_id: string; executions: number; steps: number } = JSON.parse(fs.readFileSync(opts.info, "utf8"));
const long = seeded.long_execution_id;

const quantile = (xs: number[], q: number): number => {
  const s = [...xs].sort((a, b) => a - b);
  return s[Math.min(s.length - 1, Math.floor(q * s.length))] ?? NaN;
};
const ms = (x: number): string => `${x.toFixed(1)} ms`;

const w = new World(false);
fs.copyFileSync(opts.seed, path.join(w.kernel.dir, "rebuno.db"));
await w.start();
const results: Record<string, unknown> = {};
try {
  // 1. The list.
  const timeRoute = async (route: string): Promise<number[]> => {
    const xs: number[] = [];
    for (let i = 0; i < Number(opts.requests); i++) {
      const t = performance.now();
      const r = await fetch(`${w.url}${route}`);
      await r.arrayBuffer();
      if (!r.ok) throw new Error(`${route}: ${r.status}`);
      xs.push(performance.now() - t);
    }
    return xs;
  };
  const total = (await w.api("GET", "/v0/execution-summaries?agent_id=seeded&status=cancelled&limit=1")).executions.length;
  if (total !== 1) throw new Error("the seeded executions are missing");
  for (const [name, route] of [
    ["summaries, first page", "/v0/execution-summaries?limit=50"],
    ["summaries, by status and agent", "/v0/execution-summaries?status=cancelled&agent_id=seeded&limit=50"],
    ["plain list, first page", "/v0/executions?limit=50"],
  ] as const) {
    const xs = await timeRoute(route);
    results[name] = { p50_ms: quantile(xs, 0.5), p95_ms: quantile(xs, 0.95) };
  }
  const { page, context } = await w.page();
  // Each page notes, from its own clock, when a selector first matches.
  await page.addInitScript(() => {
    const marks: Record<string, number> = {};
    (window as unknown as { marks: Record<string, number> }).marks = marks;
    const watch: Array<[string, string]> = [["rows", "table.executions tbody tr[data-id]:nth-child(50)"], ["completed", 'li.event[data-type="execution.completed"]']];
    new MutationObserver(() => {
      for (const [name, selector] of watch) if (!(name in marks) && document.querySelector(selector)) marks[name] = performance.now();
    }).observe(document, { childList: true, subtree: true });
  });
  const mark = async (name: string): Promise<number> => page.evaluate((n) => (window as unknown as { marks: Record<string, number> }).marks[n]!, name);
  await page.goto(`${w.url}/ui/`);
  await page.locator("table.executions tbody tr[data-id]").nth(49).waitFor();
  results["list page, navigation to 50 rows"] = { cold_ms: await mark("rows") };
  await page.reload();
  await page.locator("table.executions tbody tr[data-id]").nth(49).waitFor();
  (results["list page, navigation to 50 rows"] as Record<string, number>).warm_ms = await mark("rows");

  // 2. The 10,000-step timeline.
  const reads: number[] = [];
  page.on("response", (r) => {
    if (r.url().includes("/events?")) void r.body().then((b) => reads.push(b.length));
  });
  const longUrl = `${w.url}/ui/executions/${long}`;
  await page.goto(longUrl);
  await page.locator('li.event[data-type="execution.completed"]').waitFor();
  const opened = await mark("completed");
  const last: number = (await w.api("GET", `/v0/executions/${long}/coverage`)).last_event_seq;
  results["10,000-step timeline"] = {
    log_events: last, events_shown: await page.locator("li.event").count(),
    event_reads: reads.length, bytes_read: reads.reduce((a, b) => a + b, 0), navigation_to_last_event_ms: opened,
  };

  // 3. Live events.
  const id = await w.run({ scenario: "paced", gate: "bench", n: Number(opts.live), pauseMs: 20 });
  await w.gates.reached("bench");
  await page.goto(`${w.url}/ui/executions/${id}`);
  await page.locator('[data-stream="events"]').filter({ hasText: /^live$/ }).waitFor();
  const before = Number(await page.locator("li.event").last().getAttribute("data-seq"));
  await page.evaluate(() => {
    const seen: Record<string, number> = {};
    (window as unknown as { seen: Record<string, number> }).seen = seen;
    new MutationObserver((records) => {
      const now = performance.timeOrigin + performance.now();
      for (const r of records) for (const n of r.addedNodes) {
        if (n instanceof HTMLElement && n.dataset.seq) seen[n.dataset.seq] = now;
      }
    }).observe(document.querySelector("ol.timeline")!, { childList: true });
  });
  // The same tail read by a plain client beside the page, to tell the
  // kernel's part from the browser's.
  const tailed: Record<string, number> = {};
  const abort = new AbortController();
  const tail = fetch(`${w.url}/v0/executions/${id}/events/stream?after_seq=${before}`, { signal: abort.signal }).then(async (r) => {
    const decoder = new TextDecoder();
    let buffered = "";
    for await (const chunk of r.body!) {
      const now = performance.timeOrigin + performance.now();
      buffered += decoder.decode(chunk as Uint8Array, { stream: true });
      for (let m; (m = /^id: (\d+)$/m.exec(buffered)); buffered = buffered.slice(m.index + m[0].length)) tailed[m[1]!] = now;
    }
  }).catch(() => undefined);
  w.gates.release("bench");
  await w.until(id, "completed");
  await page.locator('li.event[data-type="execution.completed"]').waitFor();
  const seen: Record<string, number> = await page.evaluate(() => (window as unknown as { seen: Record<string, number> }).seen);
  const events: Array<{ event_seq: number; occurred_at: string }> = [];
  for (let after = before; ;) {
    const page = await w.api("GET", `/v0/executions/${id}/events?after_seq=${after}&limit=1000`);
    if (page.length === 0) break;
    events.push(...page);
    after = page[page.length - 1].event_seq;
  }
  abort.abort();
  await tail;
  const since = (e: { event_seq: number; occurred_at: string }, at: Record<string, number>, where: string): number => {
    const t = at[String(e.event_seq)];
    if (t === undefined) throw new Error(`event ${e.event_seq} never reached ${where}`);
    // occurred_at has microseconds; Date.parse keeps milliseconds.
    const micros = Number((/\.(\d+)Z$/.exec(e.occurred_at)?.[1] ?? "0").padEnd(6, "0").slice(3, 6)) / 1000;
    return t - (Date.parse(e.occurred_at) + micros);
  };
  for (const [name, at] of [["live event, occurred_at to shown", seen], ["  the same, to a plain SSE client", tailed]] as const) {
    const lat = events.map((e) => since(e, at, name));
    results[name] = { events: lat.length, p50_ms: quantile(lat, 0.5), p95_ms: quantile(lat, 0.95), max_ms: Math.max(...lat) };
  }
  await context.close();
} finally {
  await w.stop();
}

if (opts.json) {
  console.log(JSON.stringify(results, null, 2));
} else {
  for (const [name, r] of Object.entries(results)) {
    console.log(`${name.padEnd(36)} ${Object.entries(r as Record<string, number>).map(([k, v]) => `${k} ${k.endsWith("_ms") || k === "ms" ? ms(v) : v}`).join("  ")}`);
  }
}
