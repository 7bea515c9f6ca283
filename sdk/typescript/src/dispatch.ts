/**
 * Webhook ordering and supersession.
 *
 * Per execution the agent keeps the newest (`dispatchId`, `dispatchAttempt`)
 * it has seen, while its handler runs and for 2 × `lease_timeout_seconds`
 * after it ends, in an LRU of at most 10,000 executions. A webhook runs only
 * when it is newer: a greater dispatch id (the UUIDv7 ids of one execution
 * increase), or the same id with a greater attempt. Everything else (a
 * repeat of the running attempt, or an attempt the kernel has moved past) is
 * acknowledged and ignored.
 */

import { performance } from "node:perf_hooks";

export const MAX_TRACKED = 10_000;

export interface DispatchKey {
  /** Lowercase hyphenated UUID: string order is UUID order. */
  dispatchId: string;
  /** Undefined when the kernel did not send it. */
  attempt: number | undefined;
}

/** Whether `next` supersedes `seen`; undefined when it cannot be told (an attempt is missing for the same id). */
export function isNewer(next: DispatchKey, seen: DispatchKey): boolean | undefined {
  if (next.dispatchId !== seen.dispatchId) return next.dispatchId > seen.dispatchId;
  if (next.attempt === undefined || seen.attempt === undefined) return undefined;
  return next.attempt > seen.attempt;
}

interface Entry {
  key: DispatchKey;
  running: boolean;
  expiresAt: number;
}

/** The newest dispatch seen per execution. */
export class DispatchTracker {
  // A Map iterates in insertion order: re-inserting moves an entry to the end (most recent).
  private readonly entries = new Map<string, Entry>();

  constructor(private readonly maxEntries = MAX_TRACKED, private readonly clock: () => number = () => performance.now()) {}

  get size(): number {
    return this.entries.size;
  }

  newest(executionId: string): DispatchKey | undefined {
    return this.live(executionId)?.key;
  }

  private live(executionId: string): Entry | undefined {
    const entry = this.entries.get(executionId);
    if (entry && !entry.running && entry.expiresAt <= this.clock()) {
      this.entries.delete(executionId);
      return undefined;
    }
    return entry;
  }

  /** Record `key` and return true when it should run; false to ignore it. */
  offer(executionId: string, key: DispatchKey): boolean {
    const entry = this.live(executionId);
    if (entry) {
      // Unknown order: a finished handler may run again (replays are safe).
      const newer = isNewer(key, entry.key) ?? !entry.running;
      if (!newer) {
        this.entries.delete(executionId);
        this.entries.set(executionId, entry);
        return false;
      }
    }
    this.entries.delete(executionId);
    this.entries.set(executionId, { key, running: true, expiresAt: Infinity });
    this.evict();
    return true;
  }

  /** The handler of `key` ended: keep the entry for 2 × lease, then forget it. */
  finished(executionId: string, key: DispatchKey, leaseTimeoutMs: number): void {
    const entry = this.entries.get(executionId);
    if (entry && entry.key.dispatchId === key.dispatchId && entry.key.attempt === key.attempt) {
      entry.running = false;
      entry.expiresAt = this.clock() + 2 * leaseTimeoutMs;
    }
  }

  private evict(): void {
    while (this.entries.size > this.maxEntries) {
      // Prefer forgetting finished executions, oldest first.
      let victim: string | undefined;
      for (const [id, e] of this.entries) {
        if (!e.running) {
          victim = id;
          break;
        }
      }
      victim ??= this.entries.keys().next().value as string;
      this.entries.delete(victim);
    }
  }
}
