/**
 * Step outcomes that travel with the next request (docs/protocol/steps.md §13,
 * docs/protocol/sdk.md §7); the counterpart of the Python SDK's `_outbox.py`.
 *
 * Once the kernel has advertised `carried-outcome`, the outcome of a
 * `safe_to_retry` step is not sent on its own: the call returns at once and
 * the outcome waits here, to be carried by the dispatch's next submit or by
 * the execution's complete or fail. One request per step instead of two, and
 * at c1 one durable commit instead of two. At most one outcome waits at a
 * time, and outcomes reach the kernel in the order their steps ended (a step
 * that ends while another's outcome waits sends that one alone first), so a
 * nested step's outcome precedes its outer step's and a capture is never sent
 * while an earlier writer's outcome is still out. The waiting outcome is sent
 * alone when no carrier comes within `FLUSH_DELAY_MS`, before any resource
 * request, when the handler calls `execution().flush()`, and when the
 * dispatch ends.
 *
 * Crash semantics are the protocol's: an outcome that was never recorded
 * leaves its step `executing`, and the next attempt runs it again, which a
 * `safe_to_retry` step allows. `at_most_once` steps always report
 * synchronously.
 *
 * The kernel answers a carrier only when the outcome stands as sent. When it
 * does not (another run of the step recorded a different outcome first), the
 * code has gone on with a value the log does not hold, so the dispatch stops
 * without reporting anything more (`Terminated("outcome_conflict")`) and the
 * next attempt replays the recorded value.
 */

import { APIError, Terminated } from "./errors.js";
import type { ExecutionContext } from "./execution.js";
import type { Outcome } from "./kernel.js";
import { log } from "./log.js";

/** How long an outcome may wait for a carrier before it is sent alone. */
export const FLUSH_DELAY_MS = 5;

/** The outcome of one dispatch waiting for a carrier. */
export class Outbox {
  private pending: Outcome | undefined;
  private timer: NodeJS.Timeout | undefined;
  private alone: Promise<void> | undefined;
  /** Outcomes on their way inside a carrier, until its answer. */
  private readonly carriedOut = new Set<Promise<unknown>>();

  constructor(private readonly ctx: ExecutionContext) {}

  /** No outcome waits or is on its way. */
  get idle(): boolean {
    return this.pending === undefined && this.alone === undefined && this.carriedOut.size === 0;
  }

  /**
   * Keep `outcome` for the next carrier; false when it must be reported now
   * (the kernel does not offer the extension, the dispatch is stopping, or
   * another outcome already waits).
   */
  defer(outcome: Outcome): boolean {
    const ctx = this.ctx;
    if (this.pending !== undefined || !ctx.lease.carriedOutcomes || ctx.stopping || ctx.signal !== undefined) return false;
    this.pending = outcome;
    this.timer = setTimeout(() => this.sendPending(), FLUSH_DELAY_MS);
    return true;
  }

  /**
   * Run a carrier with the waiting outcome (undefined when there is none).
   * An outcome already on its way alone is awaited first, so that the kernel
   * records it before the carrier. When the carrier is refused with an error
   * answer (`409 lease_superseded` aside, which stops the dispatch anyway),
   * the outcome is sent alone before the error propagates: that records it,
   * or finds it recorded (the kernel keeps a carried outcome when it refuses
   * only the carrier's own part), or stops the dispatch, whose signal is then
   * thrown instead.
   */
  async carrying<T>(send: (carried: Outcome | undefined) => Promise<T>): Promise<T> {
    if (this.alone) await this.alone;
    const outcome = this.pending;
    if (outcome === undefined) return send(undefined);
    this.pending = undefined;
    clearTimeout(this.timer);
    this.timer = undefined;
    const answered = send(outcome);
    this.carriedOut.add(answered);
    try {
      return await answered;
    } catch (e) {
      if (e instanceof APIError) {
        await this.deliver(outcome);
        this.ctx.check();
      }
      throw e;
    } finally {
      this.carriedOut.delete(answered);
    }
  }

  /**
   * Resolve once every outcome reported so far has been answered by the
   * kernel: the waiting one is sent alone, carriers on their way are awaited.
   */
  async flush(): Promise<void> {
    for (;;) {
      if (this.alone) await this.alone;
      if (this.carriedOut.size) await Promise.allSettled([...this.carriedOut]);
      if (this.pending === undefined) return;
      this.sendPending();
    }
  }

  private sendPending(): void {
    this.timer = undefined;
    const outcome = this.pending;
    if (outcome === undefined) return;
    if (this.alone) {
      // One delivery at a time, in the order the steps ended.
      this.timer = setTimeout(() => this.sendPending(), FLUSH_DELAY_MS);
      return;
    }
    this.pending = undefined;
    const delivery = this.deliver(outcome).finally(() => {
      if (this.alone === delivery) this.alone = undefined;
    });
    this.alone = delivery;
  }

  /**
   * Send `outcome` through its own route. Any answer but `recorded` or a
   * replay of the same value stops the dispatch: the code went on with a
   * value the log may not hold. Never throws.
   */
  private async deliver(outcome: Outcome): Promise<void> {
    const ctx = this.ctx;
    try {
      const d = await ctx.kernel.stepOutcome(ctx.executionId, ctx.lease, outcome);
      if (d.decision === "recorded") return;
      if (d.decision === "execution_terminal") {
        ctx.recordSignal(new Terminated("execution_terminal"));
        return;
      }
      const kept = outcome.succeeded ? d.hasResult : d.hasError;
      const stored = outcome.succeeded ? d.result : d.error;
      if (d.decision === "replay" && kept && sameJson(stored, JSON.parse(outcome.valueJson))) return;
      log.warn(`rebuno: step ${outcome.stepId} was recorded with another outcome than the one this handler went on with; stopping the dispatch so that the next attempt replays it`);
      ctx.stop("outcome_conflict");
    } catch (e) {
      if (e instanceof Terminated) {
        ctx.terminated(e);
        return;
      }
      log.warn(`rebuno: the outcome of step ${outcome.stepId} was not recorded (${(e as Error).message}); stopping the dispatch`);
      ctx.stop("abandoned");
    }
  }
}

/** Deep equality of two parsed JSON values (key order aside). */
function sameJson(a: unknown, b: unknown): boolean {
  if (a === b) return true;
  if (typeof a !== "object" || typeof b !== "object" || a === null || b === null) return false;
  if (Array.isArray(a) !== Array.isArray(b)) return false;
  const ka = Object.keys(a);
  const kb = Object.keys(b);
  if (ka.length !== kb.length) return false;
  return ka.every((k) => Object.prototype.hasOwnProperty.call(b, k) && sameJson((a as Record<string, unknown>)[k], (b as Record<string, unknown>)[k]));
}
