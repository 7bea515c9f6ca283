/**
 * Carried outcomes on the wire (docs/protocol/steps.md §13): the bodies the
 * SDK writes match docs/protocol/vectors/carried-outcomes.json byte for byte
 * (the Python SDK's tests read the same file).
 */

import { describe, expect, it } from "vitest";
import { ExecutionContext, submitBody } from "../src/execution.js";
import { finishBody, type KernelClient, type Lease, LeaseClock, Outcome } from "../src/kernel.js";
import { type CarriedOutcomeCase, loadVectors } from "./vectors.js";

const cases = loadVectors<{ cases: CarriedOutcomeCase[] }>("carried-outcomes").cases;

describe("carrier bodies", () => {
  it.each(cases.map((c) => [c.name, c] as const))("%s", (_name, c) => {
    const o = c.outcome;
    const outcome = new Outcome(o.step_id, o.succeeded, o.value, o.captures, o.capture_failures);
    let body: string;
    if (c.carrier === "submit") {
      const s = c.submit!;
      body = `${submitBody(s.kind, s.target, s.args, s.idempotency, s.resources)}${outcome.carried()}}`;
    } else {
      body = finishBody(c.carrier === "complete" ? { outputJson: c.output! } : { reason: c.reason! }, outcome);
    }
    expect(body).toBe(c.body);
  });
});

describe("outbox", () => {
  it("a flush right after the outcome sent alone is answered sends the waiting outcome", async () => {
    // The Python SDK once spun here: steps that end in the turn in which the
    // delivery is answered find it finished; one leaves its outcome waiting,
    // the next flushes, and the flush must send that outcome.
    let answer!: () => void;
    const answered = new Promise<void>((r) => (answer = r));
    let reached!: () => void;
    const reachedKernel = new Promise<void>((r) => (reached = r));
    const sent: string[] = [];
    const kernel = {
      async stepOutcome(_e: string, _l: Lease, o: Outcome) {
        sent.push(o.stepId);
        reached();
        await answered;
        return { decision: "recorded" };
      },
    } as unknown as KernelClient;
    const ctx = new ExecutionContext({
      executionId: "e", agentId: "a", dispatchId: "d", dispatchAttempt: 1, leaseTimeoutSeconds: 30, kernel,
      lease: { dispatchId: "d", attempt: 1, clock: new LeaseClock(30_000), carriedOutcomes: true },
    });
    const outbox = ctx.outbox;
    expect(outbox.defer(new Outcome("s1", true, "1"))).toBe(true);
    const first = outbox.flush();
    await reachedKernel;
    expect(sent).toEqual(["s1"]);
    let end!: () => void;
    const ended = new Promise<void>((r) => (end = r));
    const steps = [
      ended.then(() => outbox.flush()).then(() => void outbox.defer(new Outcome("s2", true, "2"))),
      ended.then(() => outbox.flush()),
    ];
    answer();
    end();
    await Promise.all([first, ...steps]);
    await outbox.flush();
    expect(sent).toEqual(["s1", "s2"]);
    expect(outbox.idle).toBe(true);
  });
});
