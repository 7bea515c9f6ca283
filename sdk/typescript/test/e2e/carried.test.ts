/**
 * Carried outcomes against the real kernel (docs/protocol/steps.md §13,
 * docs/protocol/sdk.md §7): one request per step, a waiting outcome sent
 * alone when no step follows, `flush()`, `at_most_once` steps reported before
 * they return, and a dispatch that stops when another run recorded a step
 * differently.
 */

import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { defineTool, execution, Terminated } from "../../src/index.js";
import { type Served, serveAgent } from "../support/agents.js";
import { eventually, Kernel } from "../support/kernel.js";

let kernel: Kernel;
beforeAll(async () => {
  kernel = await new Kernel().start();
});
afterAll(async () => {
  await kernel.destroy();
});

/** `rebuno_step_outcomes_total` by route. */
async function outcomeCounts(): Promise<Record<string, number>> {
  const text = await (await fetch(`${kernel.url}/metrics`)).text();
  const out: Record<string, number> = {};
  for (const m of text.matchAll(/rebuno_step_outcomes_total\{route="(\w+)"\} (\S+)/g)) out[m[1]!] = Number(m[2]);
  return out;
}

function gate(): { wait: Promise<void>; open: () => void } {
  let open!: () => void;
  const wait = new Promise<void>((resolve) => (open = resolve));
  return { wait, open };
}

describe("carried outcomes", () => {
  it("make each step cost one request", async () => {
    const double = defineTool({ name: "double", execute: ({ n }: { n: number }) => 2 * n });
    const served = await serveAgent(kernel, "one-trip", async ({ n }: { n: number }) => {
      for (let i = 0; i < 3; i++) n = (await double({ n })) as number;
      return n;
    });
    try {
      const client = kernel.client();
      const before = await outcomeCounts();
      const ex = await client.create("one-trip", { n: 1 });
      const done = await client.wait(ex.id, { timeout: 30_000 });
      expect([done.status, done.output]).toEqual(["completed", 8]);
      const after = await outcomeCounts();
      // Two outcomes rode on the next submit, the last on the complete; none went alone.
      expect(after.carried! - before.carried!).toBe(3);
      expect(after.separate).toBe(before.separate);
      const events = await client.allEvents(ex.id);
      events.forEach((e, i) => {
        if (e.type !== "step.succeeded") return;
        expect(["step.proposed", "execution.completed"]).toContain(events[i + 1]!.type);
        expect(events[i + 1]!.occurredAt).toBe(e.occurredAt); // one transaction
      });
    } finally {
      await served.close();
    }
  });

  it("send an outcome alone when no step follows", async () => {
    const reached = gate();
    const release = gate();
    const fetchPage = defineTool({ name: "fetch", execute: () => "page" });
    const served = await serveAgent(kernel, "lone", async () => {
      const page = await fetchPage({});
      reached.open();
      await release.wait; // no step follows for a while
      return page;
    });
    try {
      const client = kernel.client();
      const before = await outcomeCounts();
      const ex = await client.create("lone", null);
      await reached.wait;
      const steps = await eventually(async () => {
        const list = await client.steps(ex.id);
        return list.length === 1 && list[0]!.status === "succeeded" ? list : undefined;
      }, "fetch's outcome to be recorded");
      expect(steps[0]!.result).toBe("page");
      expect((await outcomeCounts()).separate).toBe(before.separate! + 1);
      release.open();
      const done = await client.wait(ex.id, { timeout: 30_000 });
      expect([done.status, done.output]).toEqual(["completed", "page"]);
    } finally {
      await served.close();
    }
  });

  it("are durable after flush(), and at_most_once outcomes before the call returns", async () => {
    const seen: Record<string, [string, string][]> = {};
    const quote = defineTool({ name: "quote", execute: () => 42 });
    const charge = defineTool({ name: "charge", idempotency: "at_most_once", execute: ({ amount }: { amount: number }) => `charged ${amount}` });
    const served = await serveAgent(kernel, "durable", async () => {
      const client = kernel.client();
      const id = execution().executionId;
      const amount = (await quote({})) as number;
      await execution().flush();
      seen.afterFlush = (await client.steps(id)).map((s) => [s.target, s.status]);
      const receipt = await charge({ amount });
      seen.afterCharge = (await client.steps(id)).map((s) => [s.target, s.status]);
      return receipt;
    });
    try {
      const client = kernel.client();
      const ex = await client.create("durable", null);
      const done = await client.wait(ex.id, { timeout: 30_000 });
      expect([done.status, done.output]).toEqual(["completed", "charged 42"]);
      expect(seen).toEqual({ afterFlush: [["quote", "succeeded"]], afterCharge: [["quote", "succeeded"], ["charge", "succeeded"]] });
    } finally {
      await served.close();
    }
  });

  it("stop the dispatch when another run recorded the step differently", async () => {
    // Attempt 1 (agent one) runs `pick` and is superseded while its body
    // runs; attempt 2 (agent two) runs it again. Attempt 1's outcome ("one")
    // is recorded first; attempt 2's carrier holds "two", which the log does
    // not: it is refused, attempt 2 stops without starting use("two"), and
    // attempt 3 replays "one".
    const started = { 1: gate(), 2: gate() };
    const gates = { 1: gate(), 2: gate() };
    const stopped: string[] = [];
    const pick = defineTool({
      name: "pick",
      execute: async () => {
        const attempt = execution().dispatchAttempt as 1 | 2;
        if (attempt !== 1 && attempt !== 2) throw new Error("a recorded pick must replay");
        started[attempt].open();
        await gates[attempt].wait;
        return attempt === 1 ? "one" : "two";
      },
    });
    const use = defineTool({ name: "use", execute: ({ value }: { value: string }) => `used ${value}` });
    const handler = async () => {
      const value = (await pick({})) as string;
      try {
        return { value, used: await use({ value }) };
      } catch (e) {
        if (e instanceof Terminated) stopped.push(`${execution().dispatchAttempt}:${e.reason}`);
        throw e;
      }
    };
    const first = await serveAgent(kernel, "picker", handler);
    let second: Served | undefined;
    try {
      const client = kernel.client();
      const ex = await client.create("picker", null);
      await started[1].wait;
      second = await serveAgent(kernel, "picker", handler); // registered with its own webhook now
      await kernel.advance(121); // attempt 1's lease lapses; attempt 2 goes to agent two
      await started[2].wait;
      gates[1].open(); // the superseded attempt's outcome is recorded; its carrier's submit is refused
      const recorded = await eventually(async () => {
        const list = await client.steps(ex.id);
        return list.length === 1 && list[0]!.status === "succeeded" ? list : undefined;
      }, "attempt 1's pick to be recorded");
      expect(recorded[0]!.result).toBe("one");
      gates[2].open();
      await eventually(() => stopped.includes("2:outcome_conflict"), "attempt 2 to stop");
      expect((await client.steps(ex.id)).map((s) => s.target)).toEqual(["pick"]); // use("two") never started
      await kernel.advance(121); // attempt 3 replays pick's recorded value
      const done = await client.wait(ex.id, { timeout: 30_000 });
      expect(stopped).toEqual(["1:lease_superseded", "2:outcome_conflict"]);
      expect([done.status, done.output]).toEqual(["completed", { value: "one", used: "used one" }]);
      expect((await client.steps(ex.id)).map((s) => [s.target, s.args])).toEqual([["pick", {}], ["use", { value: "one" }]]);
    } finally {
      await first.close();
      await second?.close();
    }
  });
});
