/**
 * Resources and forks against the real kernel, with LocalDirectory:
 * baselines, `everySteps` and `onCompletion` captures, serialised tools,
 * forks at several events restoring the workspace, and
 * `CheckpointUnavailable` failing a fork with its reason.
 */

import fs from "node:fs";
import path from "node:path";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { CheckpointUnavailable, type Client, defineTool, type Event, execution, resource, type ResourceDriver, step } from "../../src/index.js";
import { LocalDirectory, type LocalDirectoryHandle } from "../../src/drivers/index.js";
import { type Served, serveAgent } from "../support/agents.js";
import { eventually, Kernel } from "../support/kernel.js";

let kernel: Kernel;
let root: string;
beforeAll(async () => {
  kernel = await new Kernel().start();
  root = path.join(kernel.dir, "resources");
});
afterAll(async () => {
  await kernel.destroy();
});

interface Input { writes: number; everySteps: number; onCompletion: boolean }

/** What each execution's workspace held when its first dispatch opened it. */
const initial = new Map<string, Record<string, string>>();

async function contents(handle: LocalDirectoryHandle): Promise<Record<string, string>> {
  const out: Record<string, string> = {};
  for (const name of await handle.files.list()) out[name] = await handle.files.read(name);
  return out;
}

/** Writes f1..fN (fK holds "K"), one tool call each, then reads them all back. */
async function writer(kernelRef: Kernel, id: string, driver: ResourceDriver<LocalDirectoryHandle, { path: string }>): Promise<Served> {
  return serveAgent(kernelRef, id, async (input: Input) => {
    const ws = await resource("workspace", { driver, checkpoints: { everySteps: input.everySteps, onCompletion: input.onCompletion } });
    if (!initial.has(execution().executionId)) initial.set(execution().executionId, await contents(ws));
    const write = defineTool({
      name: "write_file",
      resources: ["workspace"],
      execute: async ({ path: p, content }: { path: string; content: string }) => (await ws.files.write(p, content), `wrote ${p}`),
    });
    for (let k = 1; k <= input.writes; k++) await write({ path: `f${k}`, content: String(k) });
    const listed = await step("list", () => ws.files.list());
    return { files: listed };
  });
}

const checkpoints = (events: Event[]): Event[] => events.filter((e) => e.type === "resource.checkpointed");

async function run(client: Client, id: string, input: Input): Promise<{ id: string; events: Event[] }> {
  const ex = await client.create(id, input);
  const done = await client.wait(ex.id, { timeout: 30_000 });
  expect(done.status, done.failureReason).toBe("completed");
  return { id: ex.id, events: await client.allEvents(ex.id) };
}

describe("checkpoint policy", () => {
  it("everySteps=2 captures a baseline, every 2nd write with its outcome, and on completion", async () => {
    const served = await writer(kernel, "every2", new LocalDirectory({ root }));
    const client = kernel.client();
    try {
      const { events } = await run(client, "every2", { writes: 5, everySteps: 2, onCompletion: true });
      const cps = checkpoints(events);
      expect(cps).toHaveLength(4);
      const bySeq = new Map(events.map((e) => [e.eventSeq, e]));
      const before = (e: Event) => bySeq.get(e.eventSeq - 1)!;
      // The baseline follows the binding; the periodic captures follow the 2nd and 4th writes' outcomes.
      expect(before(cps[0]!).type).toBe("resource.bound");
      const succeeded = events.filter((e) => e.type === "step.succeeded" && e.payload.target === "write_file");
      expect(before(cps[1]!)).toBe(succeeded[1]);
      expect(before(cps[2]!)).toBe(succeeded[3]);
      // The completion capture comes last, before the execution completes.
      const last = events.findIndex((e) => e === cps[3]);
      expect(events.slice(last + 1).map((e) => e.type)).toContain("execution.completed");
      expect(events.filter((e) => e.type === "resource.checkpoint_failed")).toEqual([]);
    } finally {
      await served.close();
    }
  });

  it("onCompletion=false leaves the end uncovered", async () => {
    const served = await writer(kernel, "nocompletion", new LocalDirectory({ root }));
    const client = kernel.client();
    try {
      const { id, events } = await run(client, "nocompletion", { writes: 3, everySteps: 2, onCompletion: false });
      expect(checkpoints(events)).toHaveLength(2); // baseline and write 2
      const coverage = await client.coverage(id);
      expect(coverage.coveredRanges.some(([, hi]) => hi === coverage.lastEventSeq)).toBe(false);
    } finally {
      await served.close();
    }
  });

  it("refuses a bad policy and an undeclared resource before anything reaches the kernel", async () => {
    const driver = new LocalDirectory({ root });
    const served = await serveAgent(kernel, "badpolicy", async (input: { what: string }) => {
      try {
        if (input.what === "zero") await resource("workspace", { driver, checkpoints: { everySteps: 0 } });
        if (input.what === "snake") await resource("workspace", { driver, checkpoints: { every_steps: 2 } as never });
        if (input.what === "undeclared") await defineTool({ name: "t", resources: ["workspace"], execute: () => 1 })({});
      } catch (e) {
        return { error: `${(e as Error).name}: ${(e as Error).message}` };
      }
      return null;
    });
    const client = kernel.client();
    try {
      const out = async (what: string) => (await client.wait((await client.create("badpolicy", { what })).id, { timeout: 20_000 })).output;
      await expect(out("zero")).resolves.toEqual({ error: "RangeError: everySteps must be an integer from 1 to 1,000,000, not 0" });
      expect(await out("snake")).toEqual({ error: 'TypeError: unknown checkpoints option "every_steps": use everySteps and onCompletion' });
      expect(await out("undeclared")).toEqual({ error: 'TypeError: resource "workspace" must be opened with resource() in this dispatch before a step declares it' });
    } finally {
      await served.close();
    }
  });
});

describe("serialisation", () => {
  it("runs tools one at a time while the execution has resources, and concurrently before", async () => {
    const intervals: Record<string, [number, number][]> = { before: [], after: [] };
    const driver = new LocalDirectory({ root });
    const served = await serveAgent(kernel, "serial", async () => {
      const timed = (phase: string) => defineTool({
        name: `sleep_${phase}`,
        execute: async ({ i }: { i: number }) => {
          const start = performance.now();
          await new Promise((r) => setTimeout(r, 60));
          intervals[phase]!.push([start, performance.now()]);
          return i;
        },
      });
      await Promise.all([0, 1, 2].map((i) => timed("before")({ i })));
      await resource("workspace", { driver });
      await Promise.all([0, 1, 2].map((i) => timed("after")({ i })));
      return null;
    });
    const client = kernel.client();
    try {
      const done = await client.wait((await client.create("serial", null)).id, { timeout: 20_000 });
      expect(done.status).toBe("completed");
      const overlaps = (xs: [number, number][]) => xs.some(([s1, e1], i) => xs.some(([s2], j) => i !== j && s1 < s2 && s2 < e1));
      expect(overlaps(intervals.before!)).toBe(true);
      expect(overlaps(intervals.after!)).toBe(false);
    } finally {
      await served.close();
    }
  });
});

describe("forks", () => {
  it("restores the workspace at several events, covered and not, and each fork completes", async () => {
    const driver = new LocalDirectory({ root });
    const served = await writer(kernel, "forker", driver);
    const client = kernel.client();
    try {
      const source = await run(client, "forker", { writes: 4, everySteps: 1, onCompletion: true });
      const written = source.events.filter((e) => e.type === "step.succeeded" && e.payload.target === "write_file");
      const starts = source.events.filter((e) => e.type === "step.executing" && e.payload.target === "write_file");
      const points: [number, boolean, Record<string, string>][] = [
        [written[0]!.eventSeq, true, { f1: "1" }], // the first write's outcome, which its capture covers
        [written[2]!.eventSeq, true, { f1: "1", f2: "2", f3: "3" }],
        [starts[3]!.eventSeq, false, { f1: "1", f2: "2", f3: "3" }], // a live start ended coverage: the newest earlier checkpoint
        [starts[0]!.eventSeq - 1, true, {}], // before any write: the baseline
      ];
      for (const [atSeq, covered, want] of points) {
        const point = await client.coverage(source.id, { atSeq });
        expect(point.covered, `coverage at ${atSeq}`).toBe(covered);
        const fork = await client.fork(source.id, { atSeq });
        expect(fork.forkedFrom).toBe(source.id);
        expect((fork.restoration?.workspace as { covered: boolean }).covered).toBe(covered);
        const done = await client.wait(fork.id, { timeout: 30_000 });
        expect(done.status, done.failureReason).toBe("completed");
        expect(initial.get(fork.id), `restored at ${atSeq}`).toEqual(want);
        expect(done.output).toEqual({ files: ["f1", "f2", "f3", "f4"] });
        // Its workspace is a new directory holding every write.
        const bound = (await client.allEvents(fork.id)).find((e) => e.type === "resource.bound")!.payload.binding as { path: string };
        const sourceBound = source.events.find((e) => e.type === "resource.bound")!.payload.binding as { path: string };
        expect(bound.path).not.toBe(sourceBound.path);
        expect(fs.readdirSync(bound.path).sort()).toEqual(["f1", "f2", "f3", "f4"]);
      }
      expect((await client.listForks(source.id)).executions).toHaveLength(points.length);
    } finally {
      await served.close();
    }
  });

  it("fails a fork whose checkpoint is gone with checkpoint_unavailable, running nothing", async () => {
    const driver = new LocalDirectory({ root });
    const served = await writer(kernel, "lost", driver);
    const client = kernel.client();
    try {
      const source = await run(client, "lost", { writes: 2, everySteps: 1, onCompletion: true });
      const atSeq = source.events.filter((e) => e.type === "step.succeeded" && e.payload.target === "write_file")[0]!.eventSeq;
      const point = await client.coverage(source.id, { atSeq });
      const ref = point.resources[0]!.checkpointRef!;
      fs.rmSync(driver.snapshotPath(ref));
      const fork = await client.fork(source.id, { atSeq });
      const done = await client.wait(fork.id, { timeout: 30_000 });
      expect(done.status).toBe("failed");
      expect(done.failureReason).toBe(`checkpoint_unavailable: resource "workspace": local snapshot ${ref} is missing or damaged: the manifest does not exist`);
      expect((await client.steps(fork.id)).filter((s) => s.status === "executing")).toEqual([]);
      const forkEvents = await client.allEvents(fork.id);
      const started = forkEvents.findIndex((e) => e.type === "execution.started");
      expect(forkEvents.slice(started).filter((e) => e.type === "step.executing")).toEqual([]);
      expect((await client.allEvents(source.id)).length).toBe(source.events.length);
    } finally {
      await served.close();
    }
  });

  it("fails a fork with the reason a driver's CheckpointUnavailable gives", async () => {
    const local = new LocalDirectory({ root });
    let expired = false;
    const driver: ResourceDriver<LocalDirectoryHandle, { path: string }> = {
      driverId: "test.expiring.v1",
      create: (ref?: string) => {
        if (ref !== undefined && expired) throw new CheckpointUnavailable(`checkpoint missing: ${ref}`);
        return local.create(ref);
      },
      open: (binding) => local.open(binding),
      checkpoint: (handle) => local.checkpoint(handle),
    };
    const served = await writer(kernel, "expiring", driver);
    const client = kernel.client();
    try {
      const source = await run(client, "expiring", { writes: 1, everySteps: 1, onCompletion: true });
      expired = true;
      const atSeq = source.events.find((e) => e.type === "step.succeeded" && e.payload.target === "write_file")!.eventSeq;
      const fork = await client.fork(source.id, { atSeq });
      const done = await client.wait(fork.id, { timeout: 30_000 });
      expect(done.failureReason).toMatch(/^checkpoint_unavailable: resource "workspace": checkpoint missing: sha256:[0-9a-f]{64}$/);
    } finally {
      await served.close();
    }
  });
});

describe("bindings", () => {
  it("reopens the recorded workspace on a later dispatch (after an approval)", async () => {
    const driver = new LocalDirectory({ root });
    const served = await writer(kernel, "approved", driver);
    const client = kernel.client();
    try {
      await client.setPolicy("approved", `
default_action: allow
rules:
  - id: third-write
    when: {target: write_file, arguments: {path: {equals: f3}}}
    then: {decision: require_approval, approval_config: {approvers: [alice]}}
`);
      const ex = await client.create("approved", { writes: 3, everySteps: 1, onCompletion: true });
      await eventually(async () => (await client.approvals({ executionId: ex.id })).length === 1, "approval requested");
      await eventually(() => served.agent.running.size === 0, "the first dispatch to end");
      const [approval] = await client.approvals({ executionId: ex.id });
      await client.grant(approval!.id, { decidedBy: "alice" });
      const done = await client.wait(ex.id, { timeout: 30_000 });
      expect(done.status, done.failureReason).toBe("completed");
      const events = await client.allEvents(ex.id);
      expect(events.filter((e) => e.type === "resource.bound")).toHaveLength(1);
      expect(events.filter((e) => e.type === "resource.registered")).toHaveLength(1);
    } finally {
      await served.close();
    }
  });
});
