/** The operator `Client` against the real kernel: typed results, pages, the SSE tail, errors as classes. */

import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { Client, ConflictError, type Event, isCovered, NotFoundError, step, UnauthorizedError, ValidationError } from "../../src/index.js";
import { type Served, serveAgent } from "../support/agents.js";
import { Kernel } from "../support/kernel.js";

let kernel: Kernel;
let served: Served;
let release!: () => void;
let gate = new Promise<void>((resolve) => (release = resolve));

beforeAll(async () => {
  kernel = await new Kernel().start();
  served = await serveAgent(kernel, "clienttest", async (input: { wait?: boolean; n?: number }) => {
    const a = await step("a", () => input.n ?? 0);
    if (input.wait) await gate;
    return { a };
  });
});
afterAll(async () => {
  await served.close();
  await kernel.destroy();
});

describe("Client", () => {
  it("creates, reads, lists and pages executions", async () => {
    const client = kernel.client();
    const ids: string[] = [];
    for (let n = 0; n < 3; n++) ids.push((await client.create("clienttest", { n })).id);
    for (const id of ids) expect((await client.wait(id, { timeout: 20_000 })).status).toBe("completed");
    const ex = await client.get(ids[2]!);
    expect(ex).toMatchObject({ id: ids[2], agentId: "clienttest", status: "completed", input: { n: 2 }, output: { a: 2 }, terminal: true, resourceKeys: [] });
    const page = await client.listExecutions({ agentId: "clienttest", limit: 2 });
    expect(page.executions).toHaveLength(2);
    expect(page.nextCursor).toBeTruthy();
    const all: string[] = [];
    for await (const e of client.iterExecutions({ agentId: "clienttest", pageSize: 2 })) all.push(e.id);
    expect(all).toEqual([...ids].reverse());
    const steps = await client.steps(ids[0]!);
    expect(steps.map((s) => [s.kind, s.target, s.status, s.result])).toEqual([["local", "a", "succeeded", 0]]);
    expect((await client.step(ids[0]!, steps[0]!.stepId)).argsHash).toBe(steps[0]!.argsHash);
  });

  it("tails the event log over SSE until the execution ends, and reads it in pages", async () => {
    const client = kernel.client();
    gate = new Promise<void>((resolve) => (release = resolve));
    const ex = await client.create("clienttest", { wait: true });
    const tailed: Event[] = [];
    const tail = (async () => {
      for await (const e of client.streamEvents(ex.id)) {
        tailed.push(e);
        if (e.type === "step.succeeded") release();
      }
    })();
    await tail;
    expect(tailed.at(-1)!.type).toBe("execution.completed");
    expect(tailed.map((e) => e.eventSeq)).toEqual(tailed.map((_, i) => i + 1));
    expect((await client.allEvents(ex.id)).map((e) => e.type)).toEqual(tailed.map((e) => e.type));
    expect((await client.events(ex.id, { afterSeq: 2, limit: 2 })).map((e) => e.eventSeq)).toEqual([3, 4]);
    // A finished execution's tail ends at once after the backlog.
    const again: number[] = [];
    for await (const e of client.streamEvents(ex.id, { afterSeq: tailed.length - 1 })) again.push(e.eventSeq);
    expect(again).toEqual([tailed.length]);
    const ranges = await client.coverage(ex.id);
    expect(isCovered(ranges, 1)).toBe(true); // no resources: every point is covered
  });

  it("cancels, and answers errors with their classes", async () => {
    const client = kernel.client();
    gate = new Promise<void>((resolve) => (release = resolve));
    const ex = await client.create("clienttest", { wait: true });
    await client.cancel(ex.id);
    expect((await client.wait(ex.id, { timeout: 20_000 })).status).toBe("cancelled");
    release();
    await expect(client.get("01930000-0000-7000-8000-000000000000")).rejects.toThrow(NotFoundError);
    await expect(client.get("not-a-uuid")).rejects.toThrow(ValidationError);
    await expect(client.create("no-such-agent", null)).rejects.toThrow(NotFoundError);
    await expect(client.fork(ex.id, { atSeq: 0 })).rejects.toThrow(ValidationError);
    const key = "same-key-0123";
    const first = await client.create("clienttest", { n: 1 }, { idempotencyKey: key });
    expect((await client.create("clienttest", { n: 1 }, { idempotencyKey: key })).id).toBe(first.id);
    await expect(client.create("clienttest", { n: 2 }, { idempotencyKey: key })).rejects.toThrow(ConflictError);
  });

  it("manages agents and policies, and says whether the kernel is ready", async () => {
    const client = kernel.client();
    const agent = await client.registerAgent("temp-agent", "http://127.0.0.1:9/webhook", "temp-secret-0123456789", { leaseTimeoutSeconds: 45 });
    expect(agent).toMatchObject({ id: "temp-agent", webhookUrl: "http://127.0.0.1:9/webhook", leaseTimeoutSeconds: 45 });
    await client.setPolicy("temp-agent", "default_action: allow\n");
    expect((await client.agent("temp-agent")).policyBundle).toContain("default_action: allow");
    await expect(client.setPolicy("temp-agent", "rules: 3")).rejects.toThrow(ValidationError);
    expect((await client.agents()).map((a) => a.id)).toContain("temp-agent");
    await client.deleteAgent("temp-agent");
    await expect(client.agent("temp-agent")).rejects.toThrow(NotFoundError);
    expect(await client.health()).toBe(true);
    expect(await new Client("http://127.0.0.1:9", { retries: 0 }).health()).toBe(false);
  });

  it("sends the bearer token", async () => {
    const guarded = await new Kernel(["--bearer-token", "tok-0123456789"], false).start();
    try {
      await expect(new Client(guarded.url, { token: "wrong" }).agents()).rejects.toThrow(UnauthorizedError);
      expect(await new Client(guarded.url, { token: "tok-0123456789" }).agents()).toEqual([]);
    } finally {
      await guarded.destroy();
    }
  });
});
