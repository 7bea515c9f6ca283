/**
 * The TypeScript SDK's benchmark (`make bench`), beside the Python SDK's on
 * the same machine in the same run:
 *
 * 1. Throughput: the same agent (N no-op tool steps per execution) on each
 *    SDK, in its own process, against one `rebuno dev` kernel: 200
 *    executions × 10 steps one after the other, then 200 at once, as tool
 *    steps per second end to end (create to completed), the two SDKs in
 *    alternating rounds.
 *    Also the agent process's CPU time per step, which is what the SDK
 *    spends (the kernel's time is not in it).
 * 2. The TypeScript SDK's own cost per step: inside one handler, no-op
 *    `defineTool` steps against raw signed steps through the same client,
 *    one submit per step carrying the previous step's outcome
 *    (docs/protocol/steps.md §13), as the SDK's own steps do; the difference
 *    of the p50s is the SDK's overhead.
 *
 *     npx tsx bench/run.ts --kernel ../../bin/rebuno --python ../python/.venv/bin/python
 */

import { spawn, type ChildProcess } from "node:child_process";
import { readFileSync } from "node:fs";
import net from "node:net";
import { performance } from "node:perf_hooks";
import { fileURLToPath } from "node:url";
import { parseArgs } from "node:util";
import { Agent, Client, defineTool, execution } from "../src/index.js";
import { canonicalJson } from "../src/identity.js";
import { Outcome } from "../src/kernel.js";
import { freePort, Kernel } from "../test/support/kernel.js";

const { values: opts } = parseArgs({
  options: {
    kernel: { type: "string" },
    python: { type: "string" },
    executions: { type: "string", default: "200" },
    steps: { type: "string", default: "10" },
    overhead: { type: "string", default: "500" },
    rounds: { type: "string", default: "2" },
    json: { type: "boolean", default: false },
  },
});
if (opts.kernel) process.env.REBUNO_BIN = opts.kernel;
const EXECUTIONS = Number(opts.executions);
const STEPS = Number(opts.steps);
const SECRET = "bench-secret-0123456789";
const here = (name: string): string => fileURLToPath(new URL(name, import.meta.url));

const pct = (values: number[], p: number): number => {
  const sorted = [...values].sort((a, b) => a - b);
  return sorted[Math.min(sorted.length - 1, Math.round((p / 100) * (sorted.length - 1)))]!;
};


/** Start an agent process and wait until it listens. */
async function startAgent(command: string[], env: Record<string, string>): Promise<ChildProcess> {
  const proc = spawn(command[0]!, command.slice(1), { env: { ...process.env, ...env }, stdio: ["ignore", "pipe", "inherit"] });
  await new Promise<void>((resolve, reject) => {
    proc.once("exit", (code) => reject(new Error(`${command.join(" ")} exited (${code})`)));
    proc.stdout!.on("data", (c: Buffer) => { if (c.toString().includes("PORT ")) resolve(); });
  });
  const port = Number(env.PORT);
  for (let i = 0; i < 600; i++) {
    const up = await new Promise<boolean>((r) => {
      const s = net.connect(port, "127.0.0.1");
      s.once("connect", () => (s.destroy(), r(true)));
      s.once("error", () => r(false));
    });
    if (up) return proc;
    await new Promise((r) => setTimeout(r, 50));
  }
  throw new Error(`${command.join(" ")} did not listen on ${port}`);
}

/** Tool steps per second: `count` executions, one after the other or all at once. */
async function throughput(client: Client, agentId: string, count: number, concurrent: boolean): Promise<number> {
  const runOne = async (): Promise<void> => {
    const ex = await client.create(agentId, { n: STEPS });
    for await (const e of client.streamEvents(ex.id)) if (e.type === "execution.failed") throw new Error(`failed: ${JSON.stringify(e.payload)}`);
  };
  const started = performance.now();
  if (concurrent) {
    const ids = await Promise.all(Array.from({ length: count }, async () => (await client.create(agentId, { n: STEPS })).id));
    const pending = new Set(ids);
    while (pending.size) {
      for await (const ex of client.iterExecutions({ agentId, status: "completed", pageSize: 500 })) pending.delete(ex.id);
      if (pending.size) await new Promise((r) => setTimeout(r, 20));
    }
  } else {
    for (let i = 0; i < count; i++) await runOne();
  }
  return (count * STEPS) / ((performance.now() - started) / 1000);
}

/** CPU time a process has used, in milliseconds (user + system, from /proc). */
function cpuMs(pid: number): number {
  const fields = readFileSync(`/proc/${pid}/stat`, "utf8").split(") ")[1]!.split(" ");
  return ((Number(fields[11]) + Number(fields[12])) * 1000) / CLOCK_TICKS;
}
const CLOCK_TICKS = 100; // USER_HZ on Linux

interface Row { sequential: number; concurrent: number; cpuPerStepMs: number }

interface Running { name: string; agentId: string; proc: ChildProcess; row: Row; cpu: number }

/**
 * Both SDKs' agents, measured in alternation (TypeScript, Python,
 * TypeScript, ...), so that other load on the machine weighs on both alike;
 * each row keeps its best round.
 */
async function compare(kernel: Kernel, agents: [string, string[]][], rounds: number): Promise<Row[]> {
  const client = kernel.client();
  const running: Running[] = [];
  try {
    for (const [name, command] of agents) {
      const port = await freePort();
      const agentId = `bench-${name}`;
      const proc = await startAgent(command, { AGENT_ID: agentId, PORT: String(port), REBUNO_URL: kernel.url, REBUNO_AGENT_SECRET: SECRET });
      running.push({ name, agentId, proc, row: { sequential: 0, concurrent: 0, cpuPerStepMs: 0 }, cpu: 0 });
      await client.registerAgent(agentId, `http://127.0.0.1:${port}/webhook`, SECRET);
      await throughput(client, agentId, 10, false); // warm-up
    }
    for (let round = 0; round < rounds; round++) {
      for (const r of running) {
        const cpu0 = cpuMs(r.proc.pid!);
        r.row.sequential = Math.max(r.row.sequential, await throughput(client, r.agentId, EXECUTIONS, false));
        r.row.concurrent = Math.max(r.row.concurrent, await throughput(client, r.agentId, EXECUTIONS, true));
        r.cpu += cpuMs(r.proc.pid!) - cpu0;
      }
    }
    // The agent process's own CPU per tool step, over every workload it ran.
    for (const r of running) r.row.cpuPerStepMs = r.cpu / (rounds * 2 * EXECUTIONS * STEPS);
    return running.map((r) => r.row);
  } finally {
    for (const r of running) r.proc.kill("SIGTERM");
  }
}

/** The SDK's own cost per step, as the Python SDK's bench measures it. */
async function overhead(kernel: Kernel, n: number): Promise<Record<string, number>> {
  const sdk: number[] = [];
  const raw: number[] = [];
  const noop = defineTool({ name: "noop", execute: ({ i }: { i: number }) => i });
  const agent = new Agent("bench-overhead", { secret: SECRET, baseUrl: kernel.url });
  await agent.serve({ port: 0, handleSignals: false }, async (input: { n: number }) => {
    const ctx = execution();
    for (let i = 0; i < input.n; i++) {
      const t0 = performance.now();
      await noop({ i });
      sdk.push(performance.now() - t0);
    }
    await ctx.flush();
    let previous: Outcome | undefined;
    for (let i = 0; i < input.n; i++) {
      const t0 = performance.now();
      const body = `{"kind":"tool_call","target":"raw","args":${canonicalJson({ i })},"idempotency":"safe_to_retry","resources":[]${previous ? previous.carried() : ""}}`;
      const d = await ctx.kernel.submit(ctx.executionId, ctx.lease, body, 0);
      if (d.decision !== "proceed" || !d.stepId) throw new Error(`unexpected ${d.decision}`);
      previous = new Outcome(d.stepId, true, String(i));
      raw.push(performance.now() - t0);
    }
    if (previous) await ctx.kernel.stepOutcome(ctx.executionId, ctx.lease, previous);
    return input.n;
  });
  const client = kernel.client();
  try {
    await client.registerAgent("bench-overhead", `http://127.0.0.1:${agent.address!.port}/webhook`, SECRET);
    const ex = await client.create("bench-overhead", { n });
    const done = await client.wait(ex.id, { timeout: 600_000 });
    if (done.status !== "completed") throw new Error(`overhead run ${done.status}: ${done.failureReason}`);
  } finally {
    await agent.close();
  }
  return {
    steps: n, sdk_p50_ms: pct(sdk, 50), sdk_p99_ms: pct(sdk, 99), raw_p50_ms: pct(raw, 50), raw_p99_ms: pct(raw, 99),
    overhead_p50_ms: pct(sdk, 50) - pct(raw, 50),
  };
}

const kernel = await new Kernel(["--log-level", "warn"], false).start();
try {
  const tsx = fileURLToPath(new URL("../node_modules/tsx/dist/loader.mjs", import.meta.url));
  const agents: [string, string[]][] = [["ts", [process.execPath, "--import", tsx, here("./noop-agent.ts")]]];
  if (opts.python) agents.push(["py", [opts.python, here("./noop_agent.py")]]);
  const [ts, py] = (await compare(kernel, agents, Number(opts.rounds))) as [Row, Row | undefined];
  const cost = await overhead(kernel, Number(opts.overhead));
  if (opts.json) {
    console.log(JSON.stringify({ executions: EXECUTIONS, steps: STEPS, typescript: ts, python: py, overhead: cost }));
  } else {
    const f = (x: number | undefined): string => (x === undefined ? "-" : x.toFixed(0)).padStart(10);
    const r = (a: number, b: number | undefined): string => (b ? `${(a / b).toFixed(2)}×` : "-").padStart(8);
    console.log(`SDK throughput: ${EXECUTIONS} executions × ${STEPS} no-op tool steps, each agent in its own process (tool steps/s, create to completed; best of ${opts.rounds} alternating rounds)`);
    console.log(`  workload              TypeScript    Python   TS/Py`);
    console.log(`  sequential            ${f(ts.sequential)}${f(py?.sequential)}${r(ts.sequential, py?.sequential)}`);
    console.log(`  ${String(EXECUTIONS).padEnd(3)} concurrent        ${f(ts.concurrent)}${f(py?.concurrent)}${r(ts.concurrent, py?.concurrent)}`);
    const ms = (x: number | undefined): string => (x === undefined ? "-" : x.toFixed(3)).padStart(10);
    console.log(`  agent CPU ms/step     ${ms(ts.cpuPerStepMs)}${ms(py?.cpuPerStepMs)}${r(py?.cpuPerStepMs ?? 0, ts.cpuPerStepMs).replace("-", " ")}  (Py/TS)`);
    console.log(`TypeScript SDK overhead, ${cost.steps} no-op tool steps over loopback (one submit per step, carrying the previous outcome)`);
    console.log(`  defineTool step  p50 ${cost.sdk_p50_ms!.toFixed(3)} ms   p99 ${cost.sdk_p99_ms!.toFixed(3)} ms`);
    console.log(`  raw step         p50 ${cost.raw_p50_ms!.toFixed(3)} ms   p99 ${cost.raw_p99_ms!.toFixed(3)} ms`);
    console.log(`  SDK's own cost   p50 ${cost.overhead_p50_ms!.toFixed(3)} ms`);
  }
} finally {
  await kernel.destroy();
}
