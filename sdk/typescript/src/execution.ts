/**
 * The ambient execution context of a running handler, and `execution()`.
 *
 * `Agent` creates one `ExecutionContext` per dispatch attempt and runs the
 * handler inside it (AsyncLocalStorage, so every promise the handler starts
 * inherits it). Tools, steps, `rebunoFetch` and `resource()` find it there.
 * It also keeps:
 *
 * - the **sticky signal**: the first `Blocked` or `Terminated` any step met.
 *   A handler that swallows it still ends its dispatch correctly, because
 *   `Agent` reads it here; every later step throws it again without
 *   contacting the kernel;
 * - the **occurrence counters** of this attempt: calls with the same
 *   identity are submitted one at a time, in the order they started, each
 *   with the occurrence the SDK expects;
 * - the **outbox**: a step outcome waiting to travel with the next submit or
 *   with the execution's end (docs/protocol/steps.md §13, `outbox.ts`).
 */

import { AsyncLocalStorage } from "node:async_hooks";
import { Blocked, installSignalLookup, Terminated } from "./errors.js";
import { argsHash, quote } from "./identity.js";
import type { KernelClient, Lease } from "./kernel.js";
import { Outbox } from "./outbox.js";
import { ResourceState } from "./resource-state.js";
import type { Decision } from "./types.js";

const current = new AsyncLocalStorage<ExecutionContext>();
// The step whose body is running (set by the effect protocol around each body).
const runningStep = new AsyncLocalStorage<string>();

type Signal = Blocked | Terminated;

/** One dispatch attempt of one execution, as the handler sees it. */
export class ExecutionContext {
  readonly executionId: string;
  readonly agentId: string;
  readonly dispatchId: string;
  readonly dispatchAttempt: number | undefined;
  readonly leaseTimeoutSeconds: number;
  /** The execution's input, as recorded. */
  input: unknown = null;
  /** @internal */ readonly kernel: KernelClient;
  /** @internal */ readonly lease: Lease;
  /** The first control-flow signal a step met; sticky for the rest of the dispatch. */
  signal: Signal | undefined;
  /**
   * Set when the dispatch itself stops (superseded, closed, terminal): no
   * outcome is reported from then on.
   */
  stopping = false;
  /** @internal Resources opened in this dispatch, generations and the step lock. */
  readonly resources = new ResourceState();
  /** @internal The step outcome waiting for a carrier. */
  readonly outbox = new Outbox(this);
  private readonly abort = new AbortController();
  private readonly counters = new Map<string, number>();
  private readonly tails = new Map<string, Promise<void>>();

  /** @internal */
  constructor(init: { executionId: string; agentId: string; dispatchId: string; dispatchAttempt: number | undefined; leaseTimeoutSeconds: number; kernel: KernelClient; lease: Lease }) {
    this.executionId = init.executionId;
    this.agentId = init.agentId;
    this.dispatchId = init.dispatchId;
    this.dispatchAttempt = init.dispatchAttempt;
    this.leaseTimeoutSeconds = init.leaseTimeoutSeconds;
    this.kernel = init.kernel;
    this.lease = init.lease;
  }

  /**
   * Aborted when this dispatch stops (superseded, closed, or the execution
   * became terminal). Pass it to long-running work so that it stops too;
   * `rebunoFetch` passes it to the provider.
   */
  get abortSignal(): AbortSignal {
    return this.abort.signal;
  }

  /**
   * The id of the step whose body is running here (a tool or local step),
   * else undefined. Stable across attempts: pass it to providers as an
   * idempotency key.
   */
  get stepId(): string | undefined {
    return runningStep.getStore();
  }

  // ------------------------------------------------------------ signals

  /**
   * Remember a control-flow signal: the first wins, except that
   * `Terminated` replaces `Blocked` (a terminal execution never resumes).
   */
  recordSignal(signal: Signal): Signal {
    if (this.signal === undefined || (signal instanceof Terminated && this.signal instanceof Blocked)) this.signal = signal;
    return this.signal;
  }

  /** Throw the sticky signal, if any. */
  check(): void {
    if (this.signal !== undefined) throw this.signal;
  }

  /** Record a `Terminated` a request met; superseded and abandoned attempts also stop reporting. */
  terminated(t: Terminated): Signal {
    if (t.reason === "lease_superseded" || t.reason === "abandoned") this.markStopping();
    return this.recordSignal(t);
  }

  /** Stop the dispatch: no outcome is reported from now on. */
  stop(reason: string): void {
    this.recordSignal(new Terminated(reason));
    this.markStopping();
  }

  /**
   * Resolve once the kernel has recorded the outcome of every step this
   * dispatch has finished. A `safe_to_retry` step's outcome is sent with the
   * next step or the execution's end, or alone within a few milliseconds, so
   * a step call can return before its outcome is durable
   * (docs/protocol/steps.md §13). Call this before handing a step's result to
   * the outside world other than through another step. Throws `Terminated`
   * when an outcome could not be recorded: the dispatch then stops, and the
   * next attempt runs the step again or replays what was recorded.
   */
  async flush(): Promise<void> {
    await this.outbox.flush();
    this.check();
  }

  /**
   * @internal Complete (with `outputJson`) or fail the execution, carrying the
   * waiting step outcome. Resolves false when it was already terminal.
   */
  finish(outcome: { outputJson: string } | { reason: string }): Promise<boolean> {
    return this.outbox.carrying((carried) => this.kernel.finishExecution(this.executionId, this.lease, outcome, carried));
  }

  private markStopping(): void {
    this.stopping = true;
    if (!this.abort.signal.aborted) this.abort.abort(this.signal);
  }

  // ------------------------------------------------------------- submit

  /**
   * Submit a step and return its decision. `blocked`, `execution_blocked`
   * and `execution_terminal` are recorded as the sticky signal and thrown;
   * every other decision is returned.
   *
   * The call takes its place in its identity's queue synchronously, before
   * its first await, so that identical calls get occurrences in the order
   * they were made.
   */
  async submit(kind: string, target: string, canonicalArgs: string, idempotency: string, resources: readonly string[]): Promise<Decision> {
    this.check();
    const key = `${kind}\u0000${target}\u0000${argsHash(canonicalArgs)}`;
    const previous = this.tails.get(key);
    let release!: () => void;
    const mine = new Promise<void>((resolve) => (release = resolve));
    this.tails.set(key, mine);
    let decision: Decision;
    try {
      if (previous) await previous;
      this.check();
      const occurrence = this.counters.get(key) ?? 0;
      const head = submitBody(kind, target, canonicalArgs, idempotency, resources);
      try {
        decision = await this.outbox.carrying((carried) =>
          this.kernel.submit(this.executionId, this.lease, `${head}${carried ? carried.carried() : ""}}`, occurrence));
      } catch (e) {
        if (e instanceof Terminated) throw this.terminated(e);
        throw e;
      }
      if (decision.stepId !== undefined) this.counters.set(key, Math.max(this.counters.get(key) ?? 0, occurrence + 1));
      if (decision.resources) this.resources.learnEntries(decision.resources);
    } finally {
      release();
      if (this.tails.get(key) === mine) this.tails.delete(key);
    }
    if (decision.decision === "execution_terminal") throw this.recordSignal(new Terminated("execution_terminal"));
    if (decision.decision === "blocked" || decision.decision === "execution_blocked") {
      throw this.recordSignal(new Blocked(decision.decision === "blocked" ? "step awaits approval" : "execution is blocked", {
        approvalId: decision.approvalId, stepId: decision.stepId,
      }));
    }
    return decision;
  }
}

/**
 * @internal A submit body without its closing brace, so that a carried
 * outcome can follow; the member order is the one of
 * docs/protocol/vectors/carried-outcomes.json.
 */
export function submitBody(kind: string, target: string, canonicalArgs: string, idempotency: string, resources: readonly string[]): string {
  return `{"kind":${quote(kind)},"target":${quote(target)},"args":${canonicalArgs},"idempotency":${quote(idempotency)},"resources":${JSON.stringify(resources)}`;
}

/** The context of the running handler, or undefined outside one. */
export function currentContext(): ExecutionContext | undefined {
  return current.getStore();
}

/** @internal The context, or an error naming what needed it. */
export function requireContext(what: string): ExecutionContext {
  const ctx = current.getStore();
  if (ctx === undefined) throw new Error(`${what} must be called inside a Rebuno handler (no active execution)`);
  return ctx;
}

/**
 * The current execution: `executionId`, `agentId`, `dispatchId`,
 * `dispatchAttempt`, `leaseTimeoutSeconds`, `input`, `stepId` and
 * `abortSignal`. Throws outside a handler.
 */
export function execution(): ExecutionContext {
  return requireContext("execution()");
}

/** @internal Run `fn` inside `ctx`. */
export function runInContext<T>(ctx: ExecutionContext, fn: () => T): T {
  return current.run(ctx, fn);
}

/** @internal Run a step body with its id visible through `execution().stepId`. */
export function runInStep<T>(stepId: string, fn: () => T): T {
  return runningStep.run(stepId, fn);
}

installSignalLookup(() => current.getStore()?.signal);
