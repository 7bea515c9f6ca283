/**
 * `Client.wait` and `Client.run` against the real kernel: a result costs one
 * request held by the kernel (docs/protocol/executions.md §3.1), never a polling
 * loop; failures and cancellations reject with `ExecutionFailedError`.
 */

import { afterAll, afterEach, beforeAll, describe, expect, it, vi } from "vitest";
import { Client, ExecutionFailedError, step } from "../../src/index.js";
import { type Served, serveAgent } from "../support/agents.js";
import { Kernel } from "../support/kernel.js";

let kernel: Kernel;
let served: Served;
let release!: () => void;
let gate = new Promise<void>((resolve) => (release = resolve));

beforeAll(async () => {
  kernel = await new Kernel().start();
  served = await serveAgent(kernel, "waiter", async (input: { n: number; gated?: boolean; fail?: boolean }) => {
    if (input.gated) await step("gate", async () => { await gate; return "open"; });
    if (input.fail) throw new Error("asked to fail");
    return { doubled: input.n * 2 };
  });
});
afterAll(async () => {
  release();
  await served.close();
  await kernel.destroy();
});
afterEach(() => {
  vi.restoreAllMocks();
});

/** Records every request the client sends through the global fetch, still sending it. */
function recordFetch(): { calls: () => [string, string, string | null][]; sent: (n: number) => Promise<void> } {
  const seen: [string, string, string | null][] = [];
  const waiters: [number, () => void][] = [];
  const real = globalThis.fetch;
  vi.spyOn(globalThis, "fetch").mockImplementation((input, init) => {
    const url = new URL(String(input));
    seen.push([init?.method ?? "GET", url.pathname, url.searchParams.get("wait")]);
    for (const [n, resolve] of waiters) if (seen.length >= n) resolve();
    return real(input, init);
  });
  return {
    calls: () => [...seen],
    sent: (n) => new Promise<void>((resolve) => (seen.length >= n ? resolve() : waiters.push([n, resolve]))),
  };
}

describe("Client.run and Client.wait", () => {
  it("runs an agent in one request and resolves to its output", async () => {
    const client = kernel.client();
    const rec = recordFetch();
    expect(await client.run("waiter", { n: 21 })).toEqual({ doubled: 42 });
    expect(rec.calls()).toEqual([["POST", "/v0/executions", "30000ms"]]);
    // A fixed key makes a retried run wait on the same execution.
    expect(await client.run("waiter", { n: 1 }, { idempotencyKey: "ts-run-key" })).toEqual({ doubled: 2 });
    expect(await client.run("waiter", { n: 1 }, { idempotencyKey: "ts-run-key" })).toEqual({ doubled: 2 });
    expect((await client.listExecutions({ agentId: "waiter" })).executions).toHaveLength(2);
  });

  it("rejects with ExecutionFailedError when the execution fails or is cancelled", async () => {
    const client = kernel.client();
    const failed = await client.run("waiter", { n: 1, fail: true }).catch((e: unknown) => e);
    expect(failed).toBeInstanceOf(ExecutionFailedError);
    const err = failed as ExecutionFailedError;
    expect(err.status).toBe("failed");
    expect(err.reason).toContain("asked to fail");
    expect(err.execution.id).toBe(err.executionId);
    expect(err.message).toContain(err.executionId);

    gate = new Promise<void>((resolve) => (release = resolve));
    const running = client.run("waiter", { n: 1, gated: true }).catch((e: unknown) => e);
    let page = await client.listExecutions({ agentId: "waiter", status: "running" });
    while (!page.executions.length) page = await client.listExecutions({ agentId: "waiter", status: "running" });
    await client.cancel(page.executions[0]!.id);
    const cancelled = (await running) as ExecutionFailedError;
    expect(cancelled).toBeInstanceOf(ExecutionFailedError);
    expect([cancelled.status, cancelled.reason]).toEqual(["cancelled", "client_cancelled"]);
    release();
  });

  it("waits with requests the kernel holds, a sequence of them for a long wait", async () => {
    gate = new Promise<void>((resolve) => (release = resolve));
    const ex = await kernel.client().create("waiter", { n: 5, gated: true });
    let rec = recordFetch();
    const timedOut = (await kernel.client().wait(ex.id, { timeout: 300 }).catch((e: unknown) => e)) as Error;
    expect(timedOut.name).toBe("TimeoutError");
    expect(timedOut.message).toContain(ex.id);
    expect(rec.calls()).toEqual([["GET", `/v0/executions/${ex.id}`, "300ms"]]);
    vi.restoreAllMocks();

    rec = recordFetch();
    const client = new Client(kernel.url, { waitSlice: 50 });
    const waiting = client.wait(ex.id);
    await rec.sent(3);
    release();
    const done = await waiting;
    expect(done).toMatchObject({ status: "completed", output: { doubled: 10 } });
    const calls = rec.calls();
    expect(calls.length).toBeGreaterThanOrEqual(3);
    expect(new Set(calls.map((c) => c.join(" ")))).toEqual(new Set([`GET /v0/executions/${ex.id} 50ms`]));
    // A terminal execution: one request, answered at once.
    expect((await client.wait(ex.id)).output).toEqual({ doubled: 10 });
    expect(rec.calls()).toHaveLength(calls.length + 1);
  });

  it("pauses between requests to a kernel that does not hold them", async () => {
    let count = 0;
    vi.spyOn(globalThis, "fetch").mockImplementation(async () => {
      count++;
      return new Response(JSON.stringify({ id: "e1", agent_id: "a", status: "running" }), { status: 200 });
    });
    const err = (await new Client("http://kernel.test").wait("e1", { timeout: 1000 }).catch((e: unknown) => e)) as Error;
    expect(err.name).toBe("TimeoutError");
    expect(count).toBeGreaterThanOrEqual(2);
    expect(count).toBeLessThanOrEqual(12);
  });

  it("bounds the wait slice", () => {
    for (const waitSlice of [0, -1, 60_001]) expect(() => new Client("http://kernel.test", { waitSlice })).toThrow(RangeError);
  });
});
