/**
 * Supersession against the real kernel: a redelivered attempt stops the
 * running handler (its abort signal fires, it reports nothing, no finished
 * step runs twice), repeats and stale attempts are ignored, and an
 * `at_most_once` orphan comes back indeterminate.
 */

import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { defineTool, execution, step, ToolError } from "../../src/index.js";
import { signLegacy } from "../../src/signing.js";
import { SECRET, serveAgent } from "../support/agents.js";
import { eventually, Kernel } from "../support/kernel.js";

let kernel: Kernel;
beforeAll(async () => {
  kernel = await new Kernel().start();
});
afterAll(async () => {
  await kernel.destroy();
});

/** Resolves when the dispatch stops (superseded, closed or terminal). */
const stopped = (signal: AbortSignal): Promise<never> =>
  new Promise((_, reject) => signal.addEventListener("abort", () => reject(signal.reason as Error), { once: true }));

describe("supersession", () => {
  it("a redelivery stops the running handler; the finished step replays and the orphan re-runs", async () => {
    const runs = { before: 0, slow: 0 };
    const attempts: (number | undefined)[] = [];
    const aborted: (number | undefined)[] = [];
    let release!: () => void;
    const gate = new Promise<void>((resolve) => (release = resolve));
    const before = defineTool({ name: "before", execute: () => (runs.before++, "done before") });
    const slow = defineTool({
      name: "slow",
      execute: async () => {
        runs.slow++;
        const ctx = execution();
        if (ctx.dispatchAttempt === 1) {
          try {
            await stopped(ctx.abortSignal); // stuck until superseded
          } catch (e) {
            aborted.push(ctx.dispatchAttempt);
            throw e;
          }
        }
        await gate;
        return `slow finished on attempt ${ctx.dispatchAttempt}`;
      },
    });
    const served = await serveAgent(kernel, "sup", async () => {
      attempts.push(execution().dispatchAttempt);
      const first = await before({});
      return { before: first, slow: await slow({}), token: await step("token", () => "x") };
    });
    const client = kernel.client();
    try {
      const ex = await client.create("sup", null);
      await eventually(() => runs.slow === 1, "slow tool started");
      const running = served.agent.running.get(ex.id)!;
      expect(running.attempt).toBe(1);
      // A repeat of the running attempt (the kernel's own bytes, sent again) is ignored.
      const body = JSON.stringify({ execution_id: ex.id, dispatch_id: running.dispatchId, dispatch_attempt: 1, lease_timeout_seconds: 120 });
      const repeat = () => fetch(served.webhook, { method: "POST", body, headers: { "Rebuno-Signature": signLegacy(SECRET, Buffer.from(body)) } }).then((r) => r.json());
      expect(await repeat()).toEqual({ status: "ignored" });
      expect(attempts).toEqual([1]);
      // The lease lapses (the kernel's clock jumps past it) and the kernel redelivers.
      await kernel.advance(121);
      await eventually(() => attempts.length === 2, "second attempt");
      expect(attempts).toEqual([1, 2]);
      await eventually(() => aborted.length === 1, "the first attempt aborted");
      expect(aborted).toEqual([1]);
      release();
      const done = await client.wait(ex.id, { timeout: 20_000 });
      expect(done.status, done.failureReason).toBe("completed");
      expect(done.output).toEqual({ before: "done before", slow: "slow finished on attempt 2", token: "x" });
      expect(runs).toEqual({ before: 1, slow: 2 });
      // A stale attempt arriving late is ignored too.
      expect(await repeat()).toEqual({ status: "ignored" });
      const steps = await client.steps(ex.id);
      expect(steps.map((s) => [s.target, s.status])).toEqual([["before", "succeeded"], ["slow", "succeeded"], ["token", "succeeded"]]);
      // The first attempt's failure was never reported: the step has one outcome.
      const events = await client.allEvents(ex.id);
      expect(events.filter((e) => e.type === "step.failed")).toEqual([]);
    } finally {
      await served.close();
    }
  });

  it("an at_most_once orphan is indeterminate, and calling it again is refused", async () => {
    const charged: (number | undefined)[] = [];
    let started!: () => void;
    const isStarted = new Promise<void>((resolve) => (started = resolve));
    const charge = defineTool({
      name: "charge_card",
      idempotency: "at_most_once",
      execute: async ({ amount }: { amount: number }) => {
        charged.push(execution().dispatchAttempt);
        started();
        await stopped(execution().abortSignal); // the first attempt never reports
        return `charged ${amount}`;
      },
    });
    const served = await serveAgent(kernel, "amo", async (input: { amount: number }) => {
      try {
        return { charged: await charge({ amount: input.amount }) };
      } catch (e) {
        if (!(e instanceof ToolError)) throw e;
        return { indeterminate: e.message, error: e.error, again: await charge({ amount: input.amount }) };
      }
    });
    const client = kernel.client();
    try {
      const ex = await client.create("amo", { amount: 10 });
      await isStarted;
      await kernel.advance(121);
      const done = await client.wait(ex.id, { timeout: 20_000 });
      expect(done.status, done.failureReason).toBe("completed");
      expect(charged).toEqual([1]);
      const out = done.output as { indeterminate: string; error: { reason: string }; again: string };
      expect(out.indeterminate).toMatch(/^outcome unknown: this may already have taken effect/);
      expect(out.error.reason).toBe("indeterminate");
      expect(out.again).toContain("prior attempt outcome unknown; retry refused");
      const steps = await client.steps(ex.id);
      expect(steps.map((s) => [s.status, s.idempotency])).toEqual([["failed", "at_most_once"], ["denied", "at_most_once"]]);
      expect((steps[1]!.error as { rule_id: string }).rule_id).toBe("__indeterminate_retry");
    } finally {
      await served.close();
    }
  });
});
