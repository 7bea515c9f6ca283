/**
 * Resources: external state an execution changes (a sandbox, a directory),
 * checkpointed during the run and restored in forks.
 *
 *     const workspace = await resource("workspace", {
 *       driver: new LocalDirectory(),
 *       checkpoints: { everySteps: 5 },
 *     });
 *
 * What the SDK does:
 *
 * - `resource()` registers the key, then creates the resource (from the
 *   fork's checkpoint, or the initial environment) and records its binding,
 *   or opens the binding an earlier dispatch recorded. A create that finds
 *   the resource uncovered is followed by a **baseline** capture. Within a
 *   dispatch the same key returns the same handle.
 * - Tool calls and local steps run **one at a time** while the execution has
 *   resources; calls made inside a running body re-enter without waiting.
 * - The kernel counts live affecting starts and says in `proceed` when a
 *   capture is **due**; the SDK calls `driver.checkpoint(handle)` after the
 *   body and sends the ref with the step's outcome. A nested step's due
 *   capture waits for the outermost running body.
 * - When the handler returns normally, each resource opened in the dispatch
 *   that is uncovered and has `onCompletion` is captured before `complete`.
 */

import { APIError, CheckpointUnavailable, ConflictError, isRecord, Terminated } from "./errors.js";
import { type ExecutionContext, requireContext } from "./execution.js";
import { canonicalJson } from "./identity.js";
import type { Capture, CaptureFailure } from "./kernel.js";
import { log } from "./log.js";
import { BodyMark, currentMark, type OpenedResource, runMarked } from "./resource-state.js";
import type { Decision, Resource } from "./types.js";

export const MAX_EVERY_STEPS = 1_000_000;
const MAX_DRIVER_ID_BYTES = 256;
const MAX_REF_BYTES = 1024;
const MAX_ERROR_BYTES = 4096;
const KEY = /^[A-Za-z0-9._-]{1,128}$/;

/** When the SDK captures a resource. The policy a key was first registered with wins for the whole execution and its forks. */
export interface CheckpointPolicy {
  /** After every Nth live tool call or local step affecting the resource (1 to 1,000,000). Default 1. */
  everySteps?: number;
  /** When the handler returns normally, if the resource is uncovered. Default true. */
  onCompletion?: boolean;
}

/** What `create` returns: the handle tools use, and the JSON binding the kernel stores. */
export interface Created<Handle, Binding> {
  handle: Handle;
  binding: Binding;
}

/**
 * A resource driver. Methods may return values or promises.
 *
 * Optional members: `configuration` (JSON settings without credentials) and
 * `coverageReuse` (default false: every live step ends the resource's
 * coverage; true: only a live tool call or local step that declares it does).
 */
export interface ResourceDriver<Handle, Binding = unknown> {
  /** A stable name of the implementation, e.g. `"example.e2b.v1"`. */
  readonly driverId: string;
  readonly configuration?: unknown;
  readonly coverageReuse?: boolean;
  /**
   * A new, isolated resource: from `checkpointRef`, or the initial
   * environment when called without one. Throw `CheckpointUnavailable` when
   * the checkpoint is missing or expired.
   */
  create(checkpointRef?: string): Created<Handle, Binding> | Promise<Created<Handle, Binding>>;
  /** A handle for the live resource a binding names. */
  open(binding: Binding): Handle | Promise<Handle>;
  /** Capture the resource; return an immutable ref and leave the handle usable. */
  checkpoint(handle: Handle): string | Promise<string>;
}

export interface ResourceOptions<Handle> {
  // The binding type is the driver's business; any driver of this handle type fits.
  // eslint-disable-next-line @typescript-eslint/no-explicit-any
  driver: ResourceDriver<Handle, any>;
  checkpoints?: CheckpointPolicy | undefined;
}

/** 1 to 128 characters from `A–Z a–z 0–9 . _ -`, and neither `.` nor `..`. */
export function validResourceKey(key: unknown): key is string {
  return typeof key === "string" && KEY.test(key) && key !== "." && key !== "..";
}

function policyOf(checkpoints: unknown): Required<CheckpointPolicy> {
  if (checkpoints === undefined || checkpoints === null) return { everySteps: 1, onCompletion: true };
  if (!isRecord(checkpoints)) throw new TypeError("checkpoints must be an object { everySteps?, onCompletion? }");
  const unknown = Object.keys(checkpoints).filter((k) => k !== "everySteps" && k !== "onCompletion");
  if (unknown.length) throw new TypeError(`unknown checkpoints option ${unknown.map((k) => JSON.stringify(k)).join(", ")}: use everySteps and onCompletion`);
  const { everySteps = 1, onCompletion = true } = checkpoints;
  if (typeof everySteps !== "number" || !Number.isInteger(everySteps) || everySteps < 1 || everySteps > MAX_EVERY_STEPS) {
    throw new RangeError(`everySteps must be an integer from 1 to 1,000,000, not ${String(everySteps)}`);
  }
  if (typeof onCompletion !== "boolean") throw new TypeError(`onCompletion must be a boolean, not ${String(onCompletion)}`);
  return { everySteps, onCompletion };
}

/** `text` cut to at most `limit` bytes of UTF-8, at a character boundary. */
export function truncateUtf8(text: string, limit = MAX_ERROR_BYTES): string {
  const data = Buffer.from(text, "utf8");
  if (data.length <= limit) return text;
  let cut = limit;
  while (cut > 0 && (data[cut]! & 0xc0) === 0x80) cut--;
  return data.subarray(0, cut).toString("utf8");
}

function refProblem(ref: unknown): string | undefined {
  if (typeof ref !== "string") return `checkpoint() must return a string ref, not ${ref === null ? "null" : typeof ref}`;
  if (!ref) return "checkpoint() returned an empty ref";
  if (Buffer.byteLength(ref, "utf8") > MAX_REF_BYTES) return `checkpoint() returned a ref longer than ${MAX_REF_BYTES} bytes`;
  return undefined;
}

interface Identity {
  driverId: string;
  configuration: unknown;
  configurationText: string;
  coverageReuse: boolean;
}

const describe = (i: Identity): string =>
  `driverId ${JSON.stringify(i.driverId)}, configuration ${i.configurationText}, coverageReuse ${i.coverageReuse}`;

function identityOf(driver: unknown): Identity {
  if (!driver || typeof driver !== "object") throw new TypeError("a resource driver must be an object");
  const d = driver as Record<string, unknown>;
  for (const name of ["create", "open", "checkpoint"]) {
    if (typeof d[name] !== "function") throw new TypeError(`a resource driver needs a ${name}() method`);
  }
  const driverId = d.driverId;
  if (typeof driverId !== "string") throw new TypeError(`driverId must be a string, not ${typeof driverId}`);
  if (!driverId || Buffer.byteLength(driverId, "utf8") > MAX_DRIVER_ID_BYTES) {
    throw new TypeError(`driverId must be a non-empty string of at most ${MAX_DRIVER_ID_BYTES} bytes`);
  }
  const configuration = d.configuration ?? null;
  let configurationText: string;
  try {
    configurationText = canonicalJson(configuration, "strict");
  } catch (e) {
    throw new TypeError(`the driver's configuration is not JSON-serialisable: ${(e as Error).message}`);
  }
  const reuse = d.coverageReuse ?? false;
  if (typeof reuse !== "boolean") throw new TypeError(`coverageReuse must be a boolean, not ${String(reuse)}`);
  return { driverId, configuration, configurationText, coverageReuse: reuse };
}

function describeWire(data: unknown): string {
  if (!isRecord(data)) return String(data);
  let config: string;
  try {
    config = canonicalJson(data.configuration ?? null, "strict");
  } catch {
    config = String(data.configuration);
  }
  return `driverId ${JSON.stringify(data.driver_id)}, configuration ${config}, coverageReuse ${String(data.coverage_reuse)}`;
}

// ------------------------------------------------------------------ resource()

/**
 * Open the execution's resource `key` and return its handle.
 *
 * On first use the SDK creates the resource from its initial environment or
 * the fork's selected checkpoint; later dispatches open the recorded
 * binding. Calls with the same key within a dispatch return the same handle.
 * `checkpoints` defaults to `{ everySteps: 1, onCompletion: true }`; the
 * policy a key was first registered with always wins.
 *
 * Throws `TypeError` when the key was opened (in this dispatch, or as
 * recorded) with another driverId, configuration or coverageReuse;
 * `CheckpointUnavailable` (after failing the execution) when the driver
 * cannot restore the selected checkpoint; `Error` outside a handler. Other
 * create and open errors propagate unchanged.
 */
export async function resource<Handle>(key: string, options: ResourceOptions<Handle>): Promise<Handle> {
  const ctx = requireContext("resource()");
  if (!validResourceKey(key)) {
    throw new TypeError(`invalid resource key ${JSON.stringify(key)}: 1 to 128 characters from A-Z a-z 0-9 . _ -, and neither "." nor ".."`);
  }
  if (!isRecord(options)) throw new TypeError("resource() needs options { driver, checkpoints? }");
  const policy = policyOf(options.checkpoints);
  const ident = identityOf(options.driver);
  ctx.check();
  const rs = ctx.resources;
  const cached = rs.entries.get(key);
  if (cached) {
    if (cached.driverId !== ident.driverId || cached.configurationText !== ident.configurationText || cached.coverageReuse !== ident.coverageReuse) {
      throw new TypeError(`resource "${key}" is already open in this dispatch with ${describe(cached)}; this call passes ${describe(ident)}`);
    }
    const handle = cached.done ? cached.handle : await cached.ready;
    warnPolicy(cached, policy);
    return handle as Handle;
  }
  let settle!: { resolve: (h: unknown) => void; reject: (e: unknown) => void };
  const ready = new Promise<unknown>((resolve, reject) => (settle = { resolve, reject }));
  ready.catch(() => undefined); // a failed first use is seen by whoever awaits it, or by nobody
  const entry: OpenedResource = {
    key, driver: options.driver, ...ident, everySteps: policy.everySteps, onCompletion: policy.onCompletion,
    ready, handle: undefined, done: false, registeredSeq: 0, storedEverySteps: 0, storedOnCompletion: false, policyWarned: false,
  };
  rs.entries.set(key, entry);
  rs.serialise = true; // "while an execution has resources" starts now
  let handle: unknown;
  try {
    handle = await firstUse(ctx, entry, policy);
  } catch (e) {
    if (rs.entries.get(key) === entry) rs.entries.delete(key);
    settle.reject(e);
    throw e;
  }
  entry.handle = handle;
  entry.done = true;
  settle.resolve(handle);
  return handle as Handle;
}

/** One warning per key and dispatch when code passes a policy other than the stored one, which wins. */
function warnPolicy(entry: OpenedResource, policy: Required<CheckpointPolicy>): void {
  if ((policy.everySteps !== entry.storedEverySteps || policy.onCompletion !== entry.storedOnCompletion) && !entry.policyWarned) {
    entry.policyWarned = true;
    log.warn(`rebuno: resource "${entry.key}" keeps its recorded checkpoint policy (everySteps=${entry.storedEverySteps}, ` +
      `onCompletion=${entry.storedOnCompletion}); the policy passed (everySteps=${policy.everySteps}, onCompletion=${policy.onCompletion}) is ignored`);
  }
}

async function register(ctx: ExecutionContext, entry: OpenedResource, everySteps: number, onCompletion: boolean): Promise<Resource> {
  // Resource requests read and change coverage, which a step outcome still
  // waiting for a carrier would change after them (docs/protocol/steps.md §13).
  await ctx.outbox.flush();
  let view: Resource;
  try {
    view = await ctx.kernel.registerResource(ctx.executionId, ctx.lease, {
      key: entry.key, driver_id: entry.driverId, configuration: entry.configuration,
      coverage_reuse: entry.coverageReuse, every_steps: everySteps, on_completion: onCompletion,
    });
  } catch (e) {
    if (e instanceof Terminated) throw ctx.terminated(e);
    if (e instanceof ConflictError) {
      throw new TypeError(`resource "${entry.key}" is registered with ${describeWire(e.details.stored)}; this call passes ` +
        `${describeWire(e.details.requested)} (keep driverId, configuration and coverageReuse stable for each key)`, { cause: e });
    }
    throw e;
  }
  ctx.resources.learn(entry.key, view.generation);
  return view;
}

type AnyDriver = ResourceDriver<unknown, unknown>;

async function firstUse(ctx: ExecutionContext, entry: OpenedResource, policy: Required<CheckpointPolicy>): Promise<unknown> {
  const driver = entry.driver as AnyDriver;
  const release = currentMark(ctx) ? undefined : await ctx.resources.lock.acquire();
  try {
    ctx.check();
    const view = await register(ctx, entry, policy.everySteps, policy.onCompletion);
    entry.registeredSeq = view.registeredSeq;
    entry.storedEverySteps = view.everySteps;
    entry.storedOnCompletion = view.onCompletion;
    warnPolicy(entry, policy);
    if (view.binding !== null) return await driver.open(view.binding);
    let created: unknown;
    try {
      created = view.checkpointRef === "" ? await driver.create() : await driver.create(view.checkpointRef);
    } catch (e) {
      if (e instanceof CheckpointUnavailable) await failUnavailable(ctx, entry.key, e);
      throw e;
    }
    const [handle, bindingJson] = checkCreated(created);
    await ctx.outbox.flush();
    try {
      await ctx.kernel.bindResource(ctx.executionId, ctx.lease, entry.key, bindingJson);
    } catch (e) {
      if (e instanceof Terminated) throw ctx.terminated(e);
      throw e;
    }
    entry.handle = handle;
    if (!view.covered) await baseline(ctx, entry);
    return handle;
  } finally {
    release?.();
  }
}

function checkCreated(created: unknown): [unknown, string] {
  if (!isRecord(created) || !("handle" in created) || !("binding" in created)) {
    throw new TypeError("create() must return { handle, binding }");
  }
  if (created.binding === null || created.binding === undefined) throw new TypeError("create() returned a null binding");
  try {
    return [created.handle, canonicalJson(created.binding, "strict")];
  } catch (e) {
    throw new TypeError(`create() returned a binding that is not JSON-serialisable: ${(e as Error).message}`);
  }
}

/** Fail the execution at once and make the context terminal. */
async function failUnavailable(ctx: ExecutionContext, key: string, err: CheckpointUnavailable): Promise<void> {
  const reason = `checkpoint_unavailable: resource "${key}": ${err.message}`;
  try {
    await ctx.finish({ reason });
  } catch (e) {
    if (e instanceof Terminated) ctx.terminated(e);
    else if (e instanceof APIError) log.warn(`rebuno: could not fail execution ${ctx.executionId} (${reason}): ${e.message}`);
    else throw e;
  }
  ctx.stop("execution_terminal");
}

/**
 * Capture a freshly created, uncovered resource: now, or at the end of the
 * outermost running body when `resource()` was called inside one.
 */
async function baseline(ctx: ExecutionContext, entry: OpenedResource): Promise<void> {
  const root = currentMark(ctx)?.root();
  if (root) {
    root.defer([entry.key]);
    return;
  }
  await publish(ctx, await captureEntries(ctx, [entry], "baseline"));
}

async function publish(ctx: ExecutionContext, [captures, failures]: [Capture[], CaptureFailure[]]): Promise<void> {
  if (!captures.length && !failures.length) return;
  await ctx.outbox.flush();
  try {
    await ctx.kernel.publishCheckpoints(ctx.executionId, ctx.lease, captures, failures);
  } catch (e) {
    if (e instanceof Terminated) throw ctx.terminated(e);
    if (e instanceof APIError) log.warn(`rebuno: could not publish the captures of ${ctx.executionId}: ${e.message}`);
    else throw e;
  }
}

// ------------------------------------------------------------------- captures

/** No capture while the dispatch stops or the execution is terminal: a newer dispatch may already run steps. */
function capturing(ctx: ExecutionContext): boolean {
  return !ctx.stopping && !(ctx.signal instanceof Terminated);
}

/**
 * Call `checkpoint` for each resource in order; return the captures and the
 * failures to report, each with the newest generation the SDK held for the
 * key when it called `checkpoint`.
 */
async function captureEntries(ctx: ExecutionContext, entries: readonly OpenedResource[], what: string): Promise<[Capture[], CaptureFailure[]]> {
  const captures: Capture[] = [];
  const failures: CaptureFailure[] = [];
  if (!capturing(ctx)) return [captures, failures];
  for (const entry of entries) {
    const generation = ctx.resources.generations.get(entry.key) ?? 0;
    try {
      const ref: unknown = await (entry.driver as AnyDriver).checkpoint(entry.handle);
      const problem = refProblem(ref);
      if (problem) throw new Error(problem);
      captures.push({ key: entry.key, generation, checkpoint_ref: ref as string });
    } catch (e) {
      const message = truncateUtf8((e instanceof Error ? e.message : String(e)) || (e as Error)?.name || "error");
      log.warn(`rebuno: capture of resource "${entry.key}" (${what}) failed: ${message}`);
      failures.push({ key: entry.key, generation, error: message });
    }
  }
  return [captures, failures];
}

/**
 * The resource side of one tool call or local step: the step lock, the
 * declared-keys check, the body mark and the due captures.
 */
export class StepGuard {
  private readonly enclosing: BodyMark | undefined;
  private mark: BodyMark | undefined;
  private due: string[] = [];
  private unlock: (() => void) | undefined;

  private constructor(private readonly ctx: ExecutionContext, readonly declared: readonly string[]) {
    this.enclosing = currentMark(ctx);
  }

  static async enter(ctx: ExecutionContext, declared: readonly string[]): Promise<StepGuard> {
    const guard = new StepGuard(ctx, declared);
    const rs = ctx.resources;
    if (!guard.enclosing && rs.serialise) guard.unlock = await rs.lock.acquire();
    for (const key of declared) {
      if (!rs.opened(key)) {
        guard.release();
        throw new TypeError(`resource "${key}" must be opened with resource() in this dispatch before a step declares it`);
      }
    }
    return guard;
  }

  release(): void {
    const unlock = this.unlock;
    this.unlock = undefined;
    unlock?.();
  }

  /** The start's answer: which declared keys are due, in declaration order. */
  started(decision: Decision): void {
    const due = new Set((decision.resources ?? []).filter((e) => e.due).map((e) => e.key));
    this.due = this.declared.filter((k) => due.has(k));
  }

  /** Run the body under its mark; calls made inside it re-enter the lock. */
  async body<T>(fn: () => T): Promise<Awaited<T>> {
    const mark = new BodyMark(this.ctx, this.enclosing);
    this.mark = mark;
    try {
      return await runMarked(mark, fn);
    } finally {
      mark.active = false;
    }
  }

  /**
   * The captures to send with this step's outcome: its due keys, then those
   * nested steps deferred to it. A step nested in a running body defers them
   * to the outermost one instead.
   */
  async captures(what: string): Promise<[Capture[], CaptureFailure[]]> {
    const keys = [...this.due];
    for (const k of this.mark?.deferred ?? []) if (!keys.includes(k)) keys.push(k);
    if (!keys.length || !capturing(this.ctx)) return [[], []];
    const root = this.mark?.root();
    if (root) {
      root.defer(keys);
      return [[], []];
    }
    const entries = keys.map((k) => this.ctx.resources.entries.get(k)).filter((e): e is OpenedResource => e !== undefined && e.handle !== undefined);
    return captureEntries(this.ctx, entries, what);
  }
}

/**
 * Before `complete`: read the view of each resource opened in this dispatch
 * by registering it again, and capture, in registration order, those that
 * are uncovered and have `onCompletion`. One publish carries them.
 */
export async function completionCaptures(ctx: ExecutionContext): Promise<void> {
  if (!capturing(ctx) || ctx.signal !== undefined) return;
  const rs = ctx.resources;
  const opened = [...rs.entries.values()].filter((e) => e.done);
  const never = rs.initialKeys.filter((k) => !rs.opened(k));
  if (never.length) {
    log.warn(`rebuno: execution ${ctx.executionId} completes without a completion capture of ${never.map((k) => `"${k}"`).join(", ")}: ` +
      "resource() was not called for them in this dispatch");
  }
  const due: [number, OpenedResource][] = [];
  for (const entry of opened) {
    let view: Resource;
    try {
      view = await register(ctx, entry, entry.everySteps, entry.onCompletion);
    } catch (e) {
      if (e instanceof APIError || e instanceof TypeError) {
        log.warn(`rebuno: completion capture of resource "${entry.key}" skipped: ${e.message}`);
        continue;
      }
      throw e;
    }
    if (view.onCompletion && !view.covered) due.push([view.registeredSeq, entry]);
  }
  if (!due.length) return;
  due.sort((a, b) => a[0] - b[0]);
  await publish(ctx, await captureEntries(ctx, due.map(([, e]) => e), "completion"));
}
