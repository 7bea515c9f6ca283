/**
 * Seed 001's agent, verbatim but for the driver line
 * (examples/typescript/resources/agent-local.ts), run as its own process
 * with ai@6 + @ai-sdk/openai@3 + zod against the scripted server on the
 * Responses API: its checkpoints, a kill -9 mid-run and restart, and forks
 * that restore its workspace.
 */

import fs from "node:fs";
import path from "node:path";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { LocalDirectory } from "../../src/drivers/index.js";
import type { Event } from "../../src/index.js";
import { SECRET } from "../support/agents.js";
import { AgentProcess, eventually, Kernel, listening, REPO } from "../support/kernel.js";
import { ScriptServer, writesOf } from "../support/script-server.js";

const SCRIPT = path.join(REPO, "examples/typescript/resources/agent-local.ts");
const PORT = 5000; // as the page writes it
/** The workspace after the first `n` writes of the script (later writes of a path win). */
const after = (n: number): Record<string, string> => Object.fromEntries(writesOf(new ScriptServer().script).slice(0, n));
const FINAL = after(6);

let kernel: Kernel;
let llm: ScriptServer;
let agent: AgentProcess | undefined;
let env: Record<string, string>;

beforeAll(async () => {
  kernel = await new Kernel().start();
  llm = new ScriptServer();
  await llm.start();
  env = {
    REBUNO_URL: kernel.url, REBUNO_AGENT_SECRET: SECRET, LLM_MODEL: "scripted-model", OPENAI_BASE_URL: llm.url,
    OPENAI_API_KEY: "sk-test", REBUNO_LOCAL_RESOURCES: path.join(kernel.dir, "resources"),
  };
  if (await listening(PORT)) throw new Error(`port ${PORT} is taken: the seed agent serves there`);
  await kernel.client().registerAgent("coder", `http://127.0.0.1:${PORT}/webhook`, SECRET);
});
afterAll(async () => {
  await agent?.stop();
  await llm.stop();
  await kernel.destroy();
});

async function startAgent(): Promise<void> {
  agent = new AgentProcess(SCRIPT, env);
  await eventually(() => listening(PORT), "the seed agent to listen", 60_000);
}

const files = (dir: string): Record<string, string> =>
  Object.fromEntries(fs.readdirSync(dir).sort().map((n) => [n, fs.readFileSync(path.join(dir, n), "utf8")]));
const boundPath = (events: Event[]): string => (events.find((e) => e.type === "resource.bound")!.payload.binding as { path: string }).path;

describe("seed 001's agent", () => {
  let source: { id: string; events: Event[] };

  it("runs: a baseline, a capture with the 5th write's outcome, a completion capture", async () => {
    await startAgent();
    const client = kernel.client();
    const ex = await client.create("coder", { task: "write some files" });
    const done = await client.wait(ex.id, { timeout: 60_000 });
    expect(done.status, done.failureReason).toBe("completed");
    expect(done.output).toEqual({ answer: "done" });
    expect(llm.counts("/v1/responses")).toEqual([0, 1, 2, 3, 4, 5, 6, 7, 8]);
    const events = await client.allEvents(ex.id);
    source = { id: ex.id, events };
    const cps = events.filter((e) => e.type === "resource.checkpointed");
    expect(cps).toHaveLength(3);
    const previous = (e: Event) => events.find((x) => x.eventSeq === e.eventSeq - 1)!;
    expect(previous(cps[0]!).type).toBe("resource.bound");
    const writes = events.filter((e) => e.type === "step.succeeded" && e.payload.target === "write_file");
    expect(writes).toHaveLength(6);
    expect(previous(cps[1]!)).toEqual(writes[4]);
    expect(events.indexOf(cps[2]!)).toBeGreaterThan(events.indexOf(events.filter((e) => e.type === "step.succeeded").at(-1)!));
    expect(files(boundPath(events))).toEqual(FINAL);
    const steps = await client.steps(ex.id);
    expect(steps.filter((s) => s.kind === "llm_call")).toHaveLength(9);
    expect(steps.filter((s) => s.kind === "tool_call").map((s) => s.target)).toEqual(
      ["write_file", "write_file", "read_file", "write_file", "write_file", "write_file", "read_file", "write_file"]);
  });

  it("survives kill -9 mid-run: the restarted agent replays what was recorded and finishes", async () => {
    const client = kernel.client();
    const before = llm.requests.length;
    const ex = await client.create("coder", { task: "write some files" });
    await eventually(async () => (await client.allEvents(ex.id)).filter((e) => e.type === "step.succeeded" && e.payload.target === "write_file").length >= 2,
      "two writes recorded");
    await agent!.kill();
    await eventually(async () => !(await listening(PORT)), "the killed agent's port to close");
    await startAgent();
    await kernel.advance(121); // the lease lapses and the kernel redelivers
    const done = await client.wait(ex.id, { timeout: 60_000 });
    expect(done.status, done.failureReason).toBe("completed");
    expect(done.output).toEqual({ answer: "done" });
    // Each scripted answer was asked for once, and at most one call in flight at the kill twice.
    const counts = llm.requests.slice(before).map((r) => r.n);
    expect(new Set(counts)).toEqual(new Set([0, 1, 2, 3, 4, 5, 6, 7, 8]));
    expect(counts.length).toBeLessThanOrEqual(10);
    const events = await client.allEvents(ex.id);
    expect(events.filter((e) => e.type === "resource.bound")).toHaveLength(1);
    expect(events.filter((e) => e.type === "step.executing" && e.payload.retry === true).length).toBeLessThanOrEqual(1);
    expect(files(boundPath(events))).toEqual(FINAL);
  });

  it("forks at the periodic checkpoint and at an uncovered event; each fork restores the workspace and asks only the uncopied questions", async () => {
    const client = kernel.client();
    const cps = source.events.filter((e) => e.type === "resource.checkpointed");
    const periodic = cps[1]!.payload.covered_seq as number;
    const readStart = source.events.filter((e) => e.type === "step.executing" && e.payload.target === "read_file")[1]!.eventSeq;
    for (const [atSeq, covered] of [[periodic, true], [readStart, false]] as const) {
      const point = await client.coverage(source.id, { atSeq });
      expect(point.covered).toBe(covered);
      const copiedLlm = source.events.filter((e) => e.eventSeq <= atSeq && e.type === "step.succeeded" && e.payload.step_type === "llm_call").length;
      const before = llm.requests.length;
      const fork = await client.fork(source.id, { atSeq });
      // Both points restore the capture taken with the 5th write.
      const restoration = fork.restoration?.workspace as { checkpoint_ref: string; covered: boolean };
      expect(restoration.covered).toBe(covered);
      const { handle } = await new LocalDirectory({ root: env.REBUNO_LOCAL_RESOURCES }).create(restoration.checkpoint_ref);
      expect(files(handle.path)).toEqual(after(5));
      const done = await client.wait(fork.id, { timeout: 60_000 });
      expect(done.status, done.failureReason).toBe("completed");
      expect(done.output).toEqual({ answer: "done" });
      expect(llm.requests.slice(before).map((r) => r.n)).toEqual([0, 1, 2, 3, 4, 5, 6, 7, 8].slice(copiedLlm));
      const events = await client.allEvents(fork.id);
      const dir = boundPath(events);
      expect(dir).not.toBe(boundPath(source.events));
      // Covered or not, the fork ends with every write: copied results replay and later writes run live.
      expect(files(dir)).toEqual(FINAL);
    }
  });
});
