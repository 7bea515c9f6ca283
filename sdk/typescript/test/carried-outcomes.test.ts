/**
 * Carried outcomes on the wire (docs/protocol/steps.md §13): the bodies the
 * SDK writes match docs/protocol/vectors/carried-outcomes.json byte for byte
 * (the Python SDK's tests read the same file).
 */

import { describe, expect, it } from "vitest";
import { submitBody } from "../src/execution.js";
import { finishBody, Outcome } from "../src/kernel.js";
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
