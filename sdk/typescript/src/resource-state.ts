/**
 * Per-dispatch resource bookkeeping, kept apart from `resources.ts` so that
 * `ExecutionContext` can own one without importing the public resource API.
 *
 * - `entries`: key → the resource opened in this dispatch (handle, driver and
 *   the identity it was opened with);
 * - `generations`: the newest generation the SDK has received per key, from
 *   register views and `proceed` answers (the kernel counts);
 * - the **step lock**: tool calls and local steps run one at a time while the
 *   execution has resources; `serialise` turns it on;
 * - the **body mark** (AsyncLocalStorage): "this code runs inside the body of
 *   a tool or local step". Calls made there re-enter the lock, and their due
 *   captures wait for the outermost running body.
 */

import { AsyncLocalStorage } from "node:async_hooks";
import type { DecisionResource } from "./types.js";

/**
 * The running body of one tool or local step. `active` is true only while
 * that body runs; promises it starts inherit the mark, and once the body has
 * ended their calls take the lock normally. `deferred` holds keys whose
 * capture waits for the end of this body, in the order they were deferred.
 */
export class BodyMark {
  active = true;
  readonly deferred: string[] = [];
  constructor(readonly owner: object, readonly parent: BodyMark | undefined) {}

  defer(keys: Iterable<string>): void {
    for (const k of keys) if (!this.deferred.includes(k)) this.deferred.push(k);
  }

  /** The outermost running body enclosing this mark (itself while it runs), or undefined. */
  root(): BodyMark | undefined {
    let found: BodyMark | undefined;
    for (let m: BodyMark | undefined = this; m; m = m.parent) if (m.active) found = m;
    return found;
  }
}

const marks = new AsyncLocalStorage<BodyMark>();

/** The mark of the running body this code is inside, for `owner`'s dispatch. */
export function currentMark(owner: object): BodyMark | undefined {
  const mark = marks.getStore();
  return mark && mark.owner === owner && mark.root() ? mark : undefined;
}

export function runMarked<T>(mark: BodyMark, fn: () => T): T {
  return marks.run(mark, fn);
}

/** An async mutex: tool calls and local steps run one at a time while it is on. */
export class Lock {
  private tail: Promise<void> = Promise.resolve();

  async acquire(): Promise<() => void> {
    let release!: () => void;
    const next = new Promise<void>((resolve) => (release = resolve));
    const previous = this.tail;
    this.tail = previous.then(() => next);
    await previous;
    return release;
  }
}

/** A resource opened (or being opened) in this dispatch. */
export interface OpenedResource {
  key: string;
  driver: unknown;
  driverId: string;
  configuration: unknown;
  /** The configuration's canonical text, for comparisons. */
  configurationText: string;
  coverageReuse: boolean;
  /** The policy this dispatch registers with. */
  everySteps: number;
  onCompletion: boolean;
  ready: Promise<unknown>;
  handle: unknown;
  done: boolean;
  registeredSeq: number;
  /** The policy the kernel keeps for the key (it wins over code). */
  storedEverySteps: number;
  storedOnCompletion: boolean;
  policyWarned: boolean;
}

/** The resources of one dispatch attempt. */
export class ResourceState {
  readonly entries = new Map<string, OpenedResource>();
  readonly generations = new Map<string, number>();
  /** Keys of the execution record read at dispatch start. */
  initialKeys: string[] = [];
  serialise = false;
  readonly lock = new Lock();

  /** Dispatch start: the lock is on from here when the execution already has resources. */
  start(resourceKeys: readonly string[]): void {
    this.initialKeys = [...resourceKeys];
    if (this.initialKeys.length) this.serialise = true;
  }

  /** Keep the newest generation received for `key`. */
  learn(key: string, generation: number): void {
    if (generation > (this.generations.get(key) ?? -1)) this.generations.set(key, generation);
  }

  learnEntries(entries: readonly DecisionResource[]): void {
    for (const e of entries) this.learn(e.key, e.generation);
  }

  opened(key: string): OpenedResource | undefined {
    const e = this.entries.get(key);
    return e?.done ? e : undefined;
  }
}
