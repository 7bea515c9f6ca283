/**
 * The step protocol shared by `defineTool`, `wrapTool` and `step()`: submit,
 * run the body on `proceed`, report its outcome.
 *
 * | decision                      | outcome                                            |
 * |-------------------------------|----------------------------------------------------|
 * | `proceed`                     | the body runs; its result is recorded and returned |
 * | `replay`                      | the recorded result, or its error as `ToolError`   |
 * | `denied`                      | `PolicyError`                                      |
 * | `rate_limited`                | `RateLimited`                                      |
 * | `blocked`, `execution_blocked`| `Blocked` (sticky)                                 |
 * | `execution_terminal`, `409 lease_superseded` | `Terminated` (sticky)               |
 *
 * Results are encoded as plain JSON (insertion order kept) and the live call
 * returns the decoded copy, so a live run and its replays see the same values.
 */

import { Blocked, isRecord, PolicyError, RateLimited, Terminated, ToolError } from "./errors.js";
import { type ExecutionContext, requireContext, runInStep } from "./execution.js";
import { canonicalJson, NotJsonError, typeName } from "./identity.js";
import { type Capture, type CaptureFailure, Outcome } from "./kernel.js";
import { StepGuard, validResourceKey } from "./resources.js";
import type { Decision } from "./types.js";

export type Idempotency = "safe_to_retry" | "at_most_once";

export const MAX_DECLARED_RESOURCES = 32;

export function validateIdempotency(idempotency: unknown): Idempotency {
  if (idempotency !== "safe_to_retry" && idempotency !== "at_most_once") {
    throw new TypeError(`idempotency must be "safe_to_retry" or "at_most_once", not ${JSON.stringify(idempotency)}`);
  }
  return idempotency;
}

/**
 * Check declared resource keys: each 1–128 characters from `A–Z a–z 0–9 . _ -`,
 * neither `.` nor `..`; duplicates dropped, keeping the first.
 */
export function validateResources(resources: unknown): string[] {
  if (resources === undefined || resources === null) return [];
  if (typeof resources === "string" || !Array.isArray(resources)) throw new TypeError("resources must be an array of resource keys");
  const out: string[] = [];
  for (const key of resources as unknown[]) {
    if (!validResourceKey(key)) {
      throw new TypeError(`invalid resource key ${JSON.stringify(key)}: 1 to 128 characters from A-Z a-z 0-9 . _ -, and neither "." nor ".."`);
    }
    if (!out.includes(key)) out.push(key);
  }
  if (out.length > MAX_DECLARED_RESOURCES) throw new TypeError(`at most ${MAX_DECLARED_RESOURCES} resources may be declared`);
  return out;
}

/**
 * Plain JSON text of a result (insertion order kept). Throws
 * {@link NotJsonError} naming the first value plain JSON cannot hold: a
 * bigint, a function, a non-finite number, a `Map`, a class instance without
 * `toJSON`, a circular structure. `undefined` is `null` at the top and left
 * out inside objects, as `JSON.stringify` does.
 */
export function encodeResult(value: unknown): string {
  let text: string | undefined;
  try {
    text = JSON.stringify(value, function (this: unknown, _key: string, v: unknown) {
      switch (typeof v) {
        case "bigint":
        case "symbol":
        case "function":
          throw new NotJsonError(typeName(v));
        case "number":
          if (!Number.isFinite(v)) throw new NotJsonError("number", `${v} is not JSON-serializable`);
          return v;
        case "object":
          if (v !== null && !Array.isArray(v)) {
            const proto = Object.getPrototypeOf(v) as unknown;
            if (proto !== Object.prototype && proto !== null) throw new NotJsonError(typeName(v));
          }
          return v;
        default:
          return v;
      }
    });
  } catch (e) {
    if (e instanceof NotJsonError) throw e;
    throw new NotJsonError(typeName(value), e instanceof Error ? e.message : String(e));
  }
  return text ?? "null";
}

/** The message of a recorded step error: its string `message`, else `reason`, else its JSON text. */
export function errorMessage(error: unknown): string {
  if (isRecord(error)) {
    for (const key of ["message", "reason"] as const) if (typeof error[key] === "string") return error[key];
  }
  return JSON.stringify(error) ?? "null";
}

/** What a failed body records: `{"message": ..., "type": <class name>}`. */
export function errorValue(e: unknown): { message: string; type: string } {
  return { message: e instanceof Error ? e.message : String(e), type: typeName(e) };
}

/** Return or throw the outcome of a decision other than `proceed`. */
export function decisionOutcome(ctx: ExecutionContext, target: string, d: Decision): unknown {
  switch (d.decision) {
    case "replay":
      if (d.hasError) throw new ToolError(target, errorMessage(d.error), { error: d.error, stepId: d.stepId });
      return d.result ?? null;
    case "denied":
      throw new PolicyError(d.reason || "policy_denied", { ruleId: d.ruleId, stepId: d.stepId });
    case "rate_limited":
      throw new RateLimited(d.reason || "rate_limit_exceeded", { retryAfterMs: d.retryAfterMs, ruleId: d.ruleId });
    case "execution_terminal":
      throw ctx.recordSignal(new Terminated("execution_terminal"));
    case "blocked":
    case "execution_blocked":
      throw ctx.recordSignal(new Blocked(undefined, { approvalId: d.approvalId, stepId: d.stepId }));
    default:
      throw new ToolError(target, `unexpected decision ${JSON.stringify(d.decision)} from the kernel`);
  }
}

/**
 * Record a step's outcome with the captures taken after its body. Returns
 * undefined when recorded, or the kernel's stored outcome (a `replay`
 * decision) when an earlier try recorded one. With `defer` (a
 * `safe_to_retry` step) the outcome may instead wait for the dispatch's next
 * request to carry it (docs/protocol/steps.md §13); the value the code goes
 * on with is then its own.
 */
export async function report(ctx: ExecutionContext, target: string, stepId: string, succeeded: boolean, valueJson: string,
  captures: [Capture[], CaptureFailure[]] = [[], []], defer = false): Promise<Decision | undefined> {
  const outcome = new Outcome(stepId, succeeded, valueJson, captures[0], captures[1]);
  // Outcomes reach the kernel in the order their steps ended.
  if (!ctx.outbox.idle) await ctx.outbox.flush();
  if (defer && ctx.outbox.defer(outcome)) return undefined;
  let d: Decision;
  try {
    d = await ctx.kernel.stepOutcome(ctx.executionId, ctx.lease, outcome);
  } catch (e) {
    if (e instanceof Terminated) throw ctx.terminated(e);
    throw e;
  }
  if (d.decision === "recorded") return undefined;
  if (d.decision === "replay") return d;
  return decisionOutcome(ctx, target, d) as never;
}

export interface EffectOptions {
  idempotency: Idempotency;
  resources: readonly string[];
  /** How errors name the caller: "tool \"x\"", "step \"y\"". */
  what: string;
}

/**
 * Run one governed effect (a tool call or local step) and return its
 * recorded or replayed result. While the execution has resources the whole
 * call (submit, body, due captures, outcome) holds the step lock, unless it
 * is made from inside another running body.
 */
export async function runEffect(kind: string, target: string, args: unknown, body: () => unknown, options: EffectOptions): Promise<unknown> {
  const ctx = requireContext(options.what);
  const guard = await StepGuard.enter(ctx, options.resources);
  try {
    return await runLocked(ctx, guard, kind, target, args, body, options);
  } finally {
    guard.release();
  }
}

async function runLocked(ctx: ExecutionContext, guard: StepGuard, kind: string, target: string, args: unknown,
  body: () => unknown, options: EffectOptions): Promise<unknown> {
  const decision = await ctx.submit(kind, target, canonicalJson(args), options.idempotency, guard.declared);
  if (decision.decision !== "proceed") return decisionOutcome(ctx, target, decision);
  const stepId = decision.stepId ?? "";
  guard.started(decision);
  const label = `${options.what} (${stepId.slice(0, 12)})`;
  // An at_most_once outcome is durable before the call returns: an
  // unreported run of such a step is never run again.
  const defer = options.idempotency === "safe_to_retry";
  let value: unknown;
  try {
    value = await guard.body(() => runInStep(stepId, body));
  } catch (e) {
    // A nested step met a signal, or this dispatch is stopping: leave the
    // step executing; it re-runs (or is found indeterminate) later.
    if (e instanceof Blocked || e instanceof Terminated) throw e;
    if (ctx.signal !== undefined) throw ctx.signal;
    const error = errorValue(e);
    const stored = await report(ctx, target, stepId, false, JSON.stringify(error), await guard.captures(label), defer);
    if (stored) return decisionOutcome(ctx, target, stored);
    throw new ToolError(target, error.message, { error, stepId, cause: e });
  }
  let text: string;
  try {
    text = encodeResult(value);
  } catch (e) {
    const message = `result is not JSON-serializable: ${(e as NotJsonError).typeName}`;
    await report(ctx, target, stepId, false, JSON.stringify({ message, type: "TypeError" }), await guard.captures(label));
    throw new ToolError(target, message, { stepId, cause: e });
  }
  const stored = await report(ctx, target, stepId, true, text, await guard.captures(label), defer);
  if (stored) return decisionOutcome(ctx, target, stored);
  return JSON.parse(text) as unknown;
}
