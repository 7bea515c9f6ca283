/**
 * One execution, two SDKs: an execution the Python SDK ran is forked and
 * finished by the TypeScript SDK, and the other way round. The fork's agent
 * restores the other SDK's LocalDirectory checkpoint, replays the other
 * SDK's recorded steps (same identities), and runs the rest itself.
 */

import fs from "node:fs";
import path from "node:path";
import { fileURLToPath } from "node:url";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { SECRET } from "../support/agents.js";
import { AgentProcess, freePort, Kernel, REPO } from "../support/kernel.js";

const PYTHON = process.env.REBUNO_PYTHON ?? path.join(REPO, "sdk/python/.venv/bin/python");
const here = (name: string): string => fileURLToPath(new URL(name, import.meta.url));

let kernel: Kernel;
let env: Record<string, string>;
let opened: string;
beforeAll(async () => {
  if (!fs.existsSync(PYTHON)) throw new Error(`no Python SDK at ${PYTHON}: run make sdk/python/.venv/.installed or set REBUNO_PYTHON`);
  kernel = await new Kernel().start();
  opened = path.join(kernel.dir, "opened.jsonl");
  env = { REBUNO_URL: kernel.url, REBUNO_AGENT_SECRET: SECRET, REBUNO_LOCAL_RESOURCES: path.join(kernel.dir, "resources"), OPENED: opened };
});
afterAll(async () => {
  await kernel.destroy();
});


/** Start one SDK's writer agent as `agentId` and point the kernel's webhook at it. */
async function start(sdk: "python" | "typescript", agentId: string): Promise<AgentProcess> {
  const port = String(await freePort());
  const agent = sdk === "python"
    ? new AgentProcess(here("./agents/py_writer.py"), { ...env, AGENT_ID: agentId, PORT: port }, [], PYTHON)
    : new AgentProcess(here("./agents/ts-writer.ts"), { ...env, AGENT_ID: agentId, PORT: port });
  await kernel.client().registerAgent(agentId, await agent.webhook(), SECRET);
  return agent;
}

const openedBy = (executionId: string): { sdk: string; files: Record<string, string> }[] =>
  fs.readFileSync(opened, "utf8").trim().split("\n").map((l) => JSON.parse(l) as { execution: string; sdk: string; files: Record<string, string> })
    .filter((o) => o.execution === executionId);

describe.each([["python", "typescript"], ["typescript", "python"]] as const)("%s runs, %s forks", (first, second) => {
  it("restores the other SDK's checkpoint, replays its steps and finishes", async () => {
    const agentId = `cross-${first}`;
    const client = kernel.client();
    let agent = await start(first, agentId);
    let source: string;
    try {
      source = (await client.create(agentId, { writes: 3, every: 1, who: first })).id;
      const done = await client.wait(source, { timeout: 60_000 });
      expect(done.status, done.failureReason).toBe("completed");
      expect(done.output).toEqual({ files: ["f1", "f2", "f3"] });
    } finally {
      await agent.stop();
    }
    const events = await client.allEvents(source);
    const secondWrite = events.filter((e) => e.type === "step.succeeded" && e.payload.target === "write_file")[1]!.eventSeq;
    expect((await client.coverage(source, { atSeq: secondWrite })).covered).toBe(true);

    agent = await start(second, agentId);
    try {
      const fork = await client.fork(source, { atSeq: secondWrite });
      const done = await client.wait(fork.id, { timeout: 60_000 });
      expect(done.status, done.failureReason).toBe("completed");
      expect(done.output).toEqual({ files: ["f1", "f2", "f3"] });
      // The restored workspace held the first SDK's two writes.
      expect(openedBy(fork.id)).toEqual([{ execution: fork.id, sdk: second, files: { f1: `1 by ${first}`, f2: `2 by ${first}` } }]);
      // Writes 1 and 2 replayed (copied from the first SDK); write 3 and the listing ran live here.
      const steps = await client.steps(fork.id);
      expect(steps.map((s) => [s.target, s.status, s.result])).toEqual([
        ["write_file", "succeeded", "wrote f1"], ["write_file", "succeeded", "wrote f2"], ["write_file", "succeeded", "wrote f3"],
        ["list", "succeeded", ["f1", "f2", "f3"]],
      ]);
      const forkEvents = await client.allEvents(fork.id);
      const startedAt = forkEvents.findIndex((e) => e.type === "execution.started");
      const live = forkEvents.slice(startedAt).filter((e) => e.type === "step.executing").map((e) => e.payload.target);
      expect(live).toEqual(["write_file", "list"]);
      const dir = (forkEvents.find((e) => e.type === "resource.bound")!.payload.binding as { path: string }).path;
      expect(fs.readFileSync(path.join(dir, "f3"), "utf8")).toBe(`3 by ${first}`); // the input is the source's
    } finally {
      await agent.stop();
    }
  });
});
