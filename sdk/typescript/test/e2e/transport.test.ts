/**
 * The lease and the transport: heartbeats keep a body longer than the lease
 * alive, and a kernel restart while a tool body runs is ridden out (the
 * step's outcome, carried by the next submit, is retried with backoff until
 * the kernel is back).
 */

import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { defineTool, setLogger, step } from "../../src/index.js";
import { serveAgent } from "../support/agents.js";
import { eventually, Kernel } from "../support/kernel.js";

let kernel: Kernel;
beforeAll(async () => {
  kernel = await new Kernel([], false).start();
});
afterAll(async () => {
  await kernel.destroy();
});

describe("a kernel restart", () => {
  it("is ridden out: outcomes are retried until the kernel answers again", async () => {
    let runs = 0;
    let entered!: () => void;
    const inBody = new Promise<void>((resolve) => (entered = resolve));
    let release!: () => void;
    const gate = new Promise<void>((resolve) => (release = resolve));
    const slow = defineTool({
      name: "slow",
      execute: async () => {
        runs++;
        entered();
        await gate;
        return "finished";
      },
    });
    const served = await serveAgent(kernel, "restarted", async () => ({ slow: await slow({}), after: await step("after", () => 2) }));
    try {
      const ex = await kernel.client().create("restarted", null);
      await inBody;
      await kernel.stop();
      const lines: string[] = [];
      setLogger({ debug: () => undefined, info: (m) => lines.push(m), warn: (m) => lines.push(m), error: (m) => lines.push(m) });
      release(); // the body ends while the kernel is down: the submit carrying its outcome fails and is retried
      await eventually(() => lines.some((l) => /POST \S+\/steps failed .* retrying in/.test(l)), "a failed carrier to be retried");
      await kernel.start(); // the same database and address
      const client = kernel.client();
      const done = await eventually(async () => {
        const e = await client.get(ex.id);
        return e.terminal ? e : undefined;
      }, "the execution to finish", 30_000);
      expect(done.status, done.failureReason).toBe("completed");
      expect(done.output).toEqual({ slow: "finished", after: 2 });
      expect(runs).toBe(1);
      const steps = await client.steps(ex.id);
      expect(steps.map((s) => [s.target, s.status])).toEqual([["slow", "succeeded"], ["after", "succeeded"]]);
    } finally {
      setLogger();
      await served.close();
    }
  });
});

describe("heartbeats", () => {
  it("keep the lease of a body that runs longer than it", async () => {
    const short = await new Kernel(["--dispatch-timeout", "1s"], false).start();
    let attempts = 0;
    const served = await serveAgent(short, "beating", async () => {
      attempts++;
      // Three times the lease: without heartbeats the kernel would reclaim it and redeliver.
      return step("long", () => new Promise((r) => setTimeout(() => r("done"), 3_000)));
    }, { leaseTimeoutSeconds: 2 });
    try {
      const client = short.client();
      const ex = await client.create("beating", null);
      const done = await client.wait(ex.id, { timeout: 30_000 });
      expect(done.status, done.failureReason).toBe("completed");
      expect(attempts).toBe(1);
      const events = await client.allEvents(ex.id);
      expect(events.filter((e) => e.type === "dispatch.lease_expired")).toEqual([]);
    } finally {
      await served.close();
      await short.destroy();
    }
  });
});
