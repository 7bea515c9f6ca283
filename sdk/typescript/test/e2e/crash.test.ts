/**
 * kill -9 of the agent in the middle of a step: the kernel redelivers after
 * the lease lapses, the restarted agent reopens the same workspace, the
 * steps that succeeded replay without running their bodies, and the
 * interrupted step runs again in a new generation. And kill -9 while a
 * finished step's outcome waits for its carrier (docs/protocol/steps.md §13):
 * exactly that step runs again, an at_most_once step never does.
 */

import fs from "node:fs";
import path from "node:path";
import { fileURLToPath } from "node:url";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { SECRET } from "../support/agents.js";
import { AgentProcess, eventually, freePort, Kernel, listening, markers } from "../support/kernel.js";

const SCRIPT = fileURLToPath(new URL("./agents/crash-agent.ts", import.meta.url));
const PENDING = fileURLToPath(new URL("./agents/pending-agent.ts", import.meta.url));

let kernel: Kernel;
beforeAll(async () => {
  kernel = await new Kernel().start();
});
afterAll(async () => {
  await kernel.destroy();
});


describe("a crash mid-step", () => {
  it("replays the succeeded steps after kill -9 and re-runs the interrupted one", async () => {
    const port = await freePort();
    const markerFile = path.join(kernel.dir, "markers");
    const env = {
      REBUNO_URL: kernel.url, REBUNO_AGENT_SECRET: SECRET, AGENT_ID: "crasher", PORT: String(port),
      MARKERS: markerFile, REBUNO_LOCAL_RESOURCES: path.join(kernel.dir, "resources"),
    };
    let agent = new AgentProcess(SCRIPT, env);
    const client = kernel.client();
    try {
      await client.registerAgent("crasher", await agent.webhook(), SECRET);
      const ex = await client.create("crasher", { n: 7 });
      await eventually(() => markers(markerFile).includes("write:slow.txt"), "the slow write to start");
      const workspace = (await client.allEvents(ex.id)).find((e) => e.type === "resource.bound")!.payload.binding as { path: string };
      await eventually(() => fs.existsSync(path.join(workspace.path, "slow.txt")), "slow.txt written");
      await agent.kill();
      await eventually(async () => !(await listening(port)), "the killed agent's port to close");
      expect(markers(markerFile)).toEqual(["token", "write:a.txt", "write:slow.txt"]);

      agent = new AgentProcess(SCRIPT, env);
      await agent.webhook();
      await kernel.advance(121); // the lease lapses: the kernel redelivers attempt 2
      const done = await client.wait(ex.id, { timeout: 30_000 });
      expect(done.status, done.failureReason).toBe("completed");
      expect(done.output).toEqual({ token: "t-7", files: ["a.txt", "b.txt", "slow.txt"] });
      // The token step and the first write replayed; only the interrupted write ran again.
      expect(markers(markerFile)).toEqual(["token", "write:a.txt", "write:slow.txt", "write:slow.txt", "write:b.txt"]);
      const events = await client.allEvents(ex.id);
      expect(events.filter((e) => e.type === "resource.bound")).toHaveLength(1); // the same directory, reopened
      const executing = events.filter((e) => e.type === "step.executing" && e.payload.target === "write_file");
      const retry = executing.filter((e) => e.payload.retry === true);
      expect(retry).toHaveLength(1);
      const generations = executing.map((e) => (e.payload.generations as Record<string, number>).workspace);
      expect(generations).toEqual([...generations].sort((a, b) => a! - b!));
      expect(new Set(generations).size).toBe(generations.length);
      expect(fs.readFileSync(path.join(workspace.path, "a.txt"), "utf8")).toBe("t-7");
      const steps = await client.steps(ex.id);
      expect(steps.map((s) => [s.target, s.status])).toEqual([["token", "succeeded"], ["write_file", "succeeded"], ["write_file", "succeeded"], ["write_file", "succeeded"]]);
    } finally {
      await agent.stop();
    }
  });
});

describe("a crash with a step outcome waiting for its carrier", () => {
  /** Run pending-agent.ts until it kills itself after `killAfter`, then finish on a new process. */
  async function crashAfter(killAfter: string, agentId: string) {
    const port = await freePort();
    const markerFile = path.join(kernel.dir, `markers-${agentId}`);
    const env = { REBUNO_URL: kernel.url, REBUNO_AGENT_SECRET: SECRET, AGENT_ID: agentId, PORT: String(port), MARKERS: markerFile, KILL_AFTER: killAfter };
    let agent = new AgentProcess(PENDING, env);
    const client = kernel.client();
    try {
      await client.registerAgent(agentId, await agent.webhook(), SECRET);
      const ex = await client.create(agentId, { n: 5 });
      await eventually(() => markers(markerFile).includes("killing"), "the agent to kill itself");
      await eventually(async () => !(await listening(port)), "the killed agent's port to close");
      const killed = (await client.steps(ex.id)).map((s) => [s.target, s.status]);
      agent = new AgentProcess(PENDING, { ...env, RELEASE: "1" });
      await agent.webhook();
      await kernel.advance(121); // the lease lapses: the kernel redelivers attempt 2
      const done = await client.wait(ex.id, { timeout: 30_000 });
      expect(done.status, done.failureReason).toBe("completed");
      expect(done.output).toEqual({ a: "safe_a:5", b: "once_b:5", c: "safe_c:5", d: "safe_d:5" });
      const runs = (name: string): number => markers(markerFile).filter((m) => m === name).length;
      const events = await client.allEvents(ex.id);
      return { killed, runs, events, steps: await client.steps(ex.id) };
    } finally {
      await agent.stop();
    }
  }

  it("re-runs exactly the step whose outcome died with the process", async () => {
    const { killed, runs, events, steps } = await crashAfter("safe_c", "pender");
    // What the kernel acknowledged before the kill is there: safe_a's outcome
    // (carried by once_b's submit) and once_b's; safe_c's is lost, its step executing.
    expect(killed).toEqual([["safe_a", "succeeded"], ["once_b", "succeeded"], ["safe_c", "executing"]]);
    expect(["safe_a", "once_b", "safe_c", "safe_d"].map(runs)).toEqual([1, 1, 2, 1]);
    expect(events.filter((e) => e.type === "step.executing" && e.payload.retry === true).map((e) => e.payload.target)).toEqual(["safe_c"]);
    expect(steps.map((s) => s.status)).toEqual(["succeeded", "succeeded", "succeeded", "succeeded"]);
    // safe_d's outcome travelled with the execution's complete, in one transaction.
    expect(events.slice(-2).map((e) => e.type)).toEqual(["step.succeeded", "execution.completed"]);
  });

  it("never runs an at_most_once step again: its outcome is recorded before the call returns", async () => {
    const { killed, runs, events } = await crashAfter("once_b", "once-pender");
    expect(killed).toEqual([["safe_a", "succeeded"], ["once_b", "succeeded"]]);
    expect(["safe_a", "once_b", "safe_c", "safe_d"].map(runs)).toEqual([1, 1, 1, 1]);
    expect(events.filter((e) => e.type === "step.executing" && e.payload.retry === true)).toEqual([]);
  });
});
