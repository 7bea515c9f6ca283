/**
 * The end-to-end workload of docs/performance.md ("End to end, per process"):
 * N executions × S no-op durable tool steps, one execution at a time (c1) and
 * C at once (c50), against one `rebuno dev` kernel, each agent in its own
 * process. Agents given with `--agent name=command …` are measured in
 * alternating rounds, so that other load on the machine weighs on all of
 * them; each reports its best steps/s and the median CPU per step of every
 * process involved, read from /proc: the kernel, the agent, and the client
 * (this process: a lean node:http client that creates each execution and
 * follows its event tail to the `end` frame).
 *
 * With `--fsyncs`, a second kernel is started under
 * `strace --seccomp-bpf -e trace=fsync,fdatasync` (only those two calls
 * stop the kernel, so it runs at full speed) and each agent runs the workload
 * once more; the fsyncs counted inside each window are divided by its steps.
 *
 *     npx tsx bench/workload.ts --kernel ../../bin/rebuno \
 *         --agent py=../python/.venv/bin/python,bench/noop_agent.py --agent ts=node,--import,tsx,bench/noop-agent.ts
 */

import { type ChildProcess, execFileSync, spawn } from "node:child_process";
import fs from "node:fs";
import http from "node:http";
import net from "node:net";
import os from "node:os";
import path from "node:path";
import { performance } from "node:perf_hooks";
import { parseArgs } from "node:util";
import { freePort } from "../test/support/kernel.js";

const { values: opts } = parseArgs({
  options: {
    kernel: { type: "string" },
    agent: { type: "string", multiple: true, default: [] },
    executions: { type: "string", default: "200" },
    steps: { type: "string", default: "10" },
    concurrency: { type: "string", default: "1,50" },
    rounds: { type: "string", default: "3" },
    fsyncs: { type: "boolean", default: false },
    json: { type: "boolean", default: false },
  },
});
const KERNEL = path.resolve(opts.kernel ?? "../../bin/rebuno");
const EXECUTIONS = Number(opts.executions);
const STEPS = Number(opts.steps);
const LEVELS = opts.concurrency!.split(",").map(Number);
const SECRET = "bench-secret-0123456789";
const CLOCK_TICKS = 100; // USER_HZ on Linux

/** CPU time of a process so far, in milliseconds (user + system, every thread). */
function cpuMs(pid: number): number {
  const [user, sys] = cpuSplitMs(pid);
  return user + sys;
}

/** User and system CPU time of a process so far, in milliseconds. */
function cpuSplitMs(pid: number): [number, number] {
  const fields = fs.readFileSync(`/proc/${pid}/stat`, "utf8").split(") ")[1]!.split(" ");
  return [(Number(fields[11]) * 1000) / CLOCK_TICKS, (Number(fields[12]) * 1000) / CLOCK_TICKS];
}

function selfCpuMs(): number {
  const u = process.cpuUsage();
  return (u.user + u.system) / 1000;
}


async function listening(port: number): Promise<boolean> {
  return new Promise((resolve) => {
    const s = net.connect(port, "127.0.0.1");
    s.once("connect", () => (s.destroy(), resolve(true)));
    s.once("error", () => resolve(false));
  });
}

async function until(cond: () => Promise<boolean>, what: string): Promise<void> {
  for (let i = 0; i < 600; i++) {
    if (await cond()) return;
    await new Promise((r) => setTimeout(r, 50));
  }
  throw new Error(`${what} did not happen within 30 s`);
}

// ------------------------------------------------------------------ kernel

interface KernelProc { url: string; pid: number; proc: ChildProcess; dir: string; straceOut?: string }

/** `rebuno dev` on a fresh SQLite file; under strace (fsync and fdatasync only) when asked. */
async function startKernel(traced: boolean): Promise<KernelProc> {
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), "rebuno-workload-"));
  const port = await freePort();
  const args = ["dev", "--db", path.join(dir, "rebuno.db"), "--listen-addr", `127.0.0.1:${port}`, "--no-repl", "--log-level", "warn"];
  const env = { ...process.env };
  for (const k of Object.keys(env)) if (k.startsWith("REBUNO_")) delete env[k];
  const straceOut = traced ? path.join(dir, "strace.out") : undefined;
  const proc = traced
    ? spawn("strace", ["--seccomp-bpf", "-f", "-qq", "-ttt", "-e", "trace=fsync,fdatasync", "-e", "signal=none", "-o", straceOut!, KERNEL, ...args], { env, stdio: "ignore" })
    : spawn(KERNEL, args, { env, stdio: "ignore" });
  const url = `http://127.0.0.1:${port}`;
  await until(async () => (await get(`${url}/v0/ready`).catch(() => 0)) === 200, "the kernel to be ready");
  // Under strace the kernel is strace's child.
  const pid = traced ? Number(execFileSync("pgrep", ["-P", String(proc.pid)]).toString().trim()) : proc.pid!;
  return { url, pid, proc, dir, ...(straceOut ? { straceOut } : {}) };
}

async function stopKernel(k: KernelProc): Promise<void> {
  const exited = new Promise((r) => k.proc.once("exit", r));
  process.kill(k.pid, "SIGTERM");
  await exited;
}

/** fsync and fdatasync calls strace saw between two wall-clock times (seconds). */
function fsyncsBetween(file: string, from: number, to: number): number {
  let n = 0;
  for (const line of fs.readFileSync(file, "utf8").split("\n")) {
    const m = /^\d+\s+(\d+\.\d+)\s+(fsync|fdatasync)\(/.exec(line);
    if (m && Number(m[1]) >= from && Number(m[1]) <= to) n++;
  }
  return n;
}

// ------------------------------------------------------------------ client

const agentPool = new http.Agent({ keepAlive: true, maxSockets: Infinity });

function get(url: string): Promise<number> {
  return new Promise((resolve, reject) => {
    http.get(url, { agent: agentPool }, (res) => {
      res.resume();
      res.on("end", () => resolve(res.statusCode ?? 0));
    }).on("error", reject);
  });
}

function post(url: string, body: string): Promise<{ status: number; text: string }> {
  return new Promise((resolve, reject) => {
    const req = http.request(url, { method: "POST", agent: agentPool, headers: { "Content-Type": "application/json", "Content-Length": Buffer.byteLength(body) } }, (res) => {
      const chunks: Buffer[] = [];
      res.on("data", (c: Buffer) => chunks.push(c));
      res.on("end", () => resolve({ status: res.statusCode ?? 0, text: Buffer.concat(chunks).toString("utf8") }));
    });
    req.on("error", reject);
    req.end(body);
  });
}

/** Create one execution and follow its event tail to the `end` frame; returns its final status. */
async function runOne(base: string, agentId: string): Promise<string> {
  const created = await post(`${base}/v0/executions`, JSON.stringify({ agent_id: agentId, input: { n: STEPS } }));
  if (created.status !== 201) throw new Error(`create: ${created.status} ${created.text}`);
  const id = (JSON.parse(created.text) as { id: string }).id;
  return new Promise((resolve, reject) => {
    http.get(`${base}/v0/executions/${id}/events/stream`, { agent: agentPool }, (res) => {
      if (res.statusCode === 204) {
        res.resume();
        resolve("ended");
        return;
      }
      let buffered = "";
      res.setEncoding("utf8");
      res.on("data", (c: string) => {
        buffered += c;
        const at = buffered.indexOf("event: end\n");
        if (at < 0) {
          buffered = buffered.slice(Math.max(0, buffered.length - 16));
          return;
        }
        const m = /"status":"(\w+)"/.exec(buffered.slice(at));
        if (m) {
          res.destroy();
          resolve(m[1]!);
        }
      });
      res.on("error", reject);
    }).on("error", reject);
  });
}

interface Sample { stepsPerS: number; kernelUs: number; agentUs: number; agentSysUs: number; clientUs: number; fsyncs?: number }

/** `EXECUTIONS` executions with `level` in flight at once. */
async function workload(k: KernelProc, agent: Running, level: number, fsyncFile?: string): Promise<Sample> {
  let next = 0;
  const failures: string[] = [];
  const worker = async (): Promise<void> => {
    while (next < EXECUTIONS) {
      next++;
      const status = await runOne(k.url, agent.agentId);
      if (status !== "completed") failures.push(status);
    }
  };
  const k0 = cpuMs(k.pid), a0 = cpuSplitMs(agent.proc.pid!), c0 = selfCpuMs();
  const wall0 = Date.now() / 1000;
  const t0 = performance.now();
  await Promise.all(Array.from({ length: level }, worker));
  const seconds = (performance.now() - t0) / 1000;
  const wall1 = Date.now() / 1000;
  if (failures.length) throw new Error(`${agent.name}: ${failures.length} executions ended ${failures[0]}`);
  const steps = EXECUTIONS * STEPS;
  const perStep = (ms: number): number => (ms * 1000) / steps;
  const a1 = cpuSplitMs(agent.proc.pid!);
  const sample: Sample = {
    stepsPerS: steps / seconds, kernelUs: perStep(cpuMs(k.pid) - k0), agentUs: perStep(a1[0] + a1[1] - a0[0] - a0[1]),
    agentSysUs: perStep(a1[1] - a0[1]), clientUs: perStep(selfCpuMs() - c0),
  };
  if (fsyncFile) {
    await new Promise((r) => setTimeout(r, 300)); // strace writes its lines after the calls return
    sample.fsyncs = fsyncsBetween(fsyncFile, wall0, wall1) / steps;
  }
  return sample;
}

// ------------------------------------------------------------------ agents

interface Running { name: string; agentId: string; proc: ChildProcess }

/** Start every agent, registering each into `out` as soon as it runs (so that a failure stops those started). */
async function startAgents(k: KernelProc, specs: [string, string[]][], out: Running[]): Promise<void> {
  for (const [name, command] of specs) {
    const port = await freePort();
    const agentId = `bench-${name}`;
    const proc = spawn(command[0]!, command.slice(1), {
      env: { ...process.env, AGENT_ID: agentId, PORT: String(port), REBUNO_URL: k.url, REBUNO_AGENT_SECRET: SECRET }, stdio: ["ignore", "ignore", "inherit"],
    });
    out.push({ name, agentId, proc });
    await until(() => listening(port), `agent ${name} to listen`);
    const reg = await post(`${k.url}/v0/agents`, JSON.stringify({ id: agentId, webhook_url: `http://127.0.0.1:${port}/webhook`, secret: SECRET }));
    if (reg.status >= 300) throw new Error(`register ${name}: ${reg.status} ${reg.text}`);
    for (let i = 0; i < 20; i++) await runOne(k.url, agentId); // warm-up
  }
}

function stopAgents(agents: Running[]): void {
  for (const a of agents.splice(0)) a.proc.kill("SIGTERM");
}

const median = (xs: number[]): number => {
  const s = [...xs].sort((a, b) => a - b);
  return s.length % 2 ? s[(s.length - 1) / 2]! : (s[s.length / 2 - 1]! + s[s.length / 2]!) / 2;
};

// ------------------------------------------------------------------ main

const specs: [string, string[]][] = opts.agent!.map((a) => {
  const at = a.indexOf("=");
  return [a.slice(0, at), a.slice(at + 1).split(",")];
});
if (!specs.length) throw new Error("name at least one --agent name=command,arg,…");

const results: Record<string, Record<number, Sample[]>> = {};
const kernel = await startKernel(false);
const agents: Running[] = [];
try {
  await startAgents(kernel, specs, agents);
  for (let round = 0; round < Number(opts.rounds); round++) {
    for (const level of LEVELS) {
      for (const a of agents) ((results[a.name] ??= {})[level] ??= []).push(await workload(kernel, a, level));
    }
  }
} finally {
  stopAgents(agents);
  await stopKernel(kernel);
  fs.rmSync(kernel.dir, { recursive: true, force: true });
}

const fsyncs: Record<string, Record<number, number>> = {};
if (opts.fsyncs) {
  const traced = await startKernel(true);
  try {
    await startAgents(traced, specs, agents);
    for (const level of LEVELS) for (const a of agents) (fsyncs[a.name] ??= {})[level] = (await workload(traced, a, level, traced.straceOut)).fsyncs!;
  } finally {
    stopAgents(agents);
    await stopKernel(traced);
    fs.rmSync(traced.dir, { recursive: true, force: true });
  }
}

const load = os.loadavg().map((x) => x.toFixed(2)).join(" ");
if (opts.json) {
  console.log(JSON.stringify({ executions: EXECUTIONS, steps: STEPS, load, results, fsyncs }));
} else {
  console.log(`${EXECUTIONS} executions × ${STEPS} no-op tool steps; best steps/s and median CPU per step (µs) of ${opts.rounds} alternating rounds; load average ${load}`);
  console.log(`  ${"agent".padEnd(12)}${"c".padStart(4)}${"steps/s".padStart(10)}${"kernel".padStart(9)}${"agent".padStart(9)}${"(sys)".padStart(8)}${"client".padStart(9)}${opts.fsyncs ? "fsyncs/step".padStart(13) : ""}`);
  for (const [name] of specs) {
    for (const level of LEVELS) {
      const xs = results[name]![level]!;
      const best = Math.max(...xs.map((x) => x.stepsPerS));
      const f = fsyncs[name]?.[level];
      console.log(`  ${name.padEnd(12)}${String(level).padStart(4)}${best.toFixed(0).padStart(10)}${median(xs.map((x) => x.kernelUs)).toFixed(0).padStart(9)}${median(xs.map((x) => x.agentUs)).toFixed(0).padStart(9)}${median(xs.map((x) => x.agentSysUs)).toFixed(0).padStart(8)}${median(xs.map((x) => x.clientUs)).toFixed(0).padStart(9)}${f === undefined ? "" : f.toFixed(2).padStart(13)}`);
    }
  }
}
agentPool.destroy();
