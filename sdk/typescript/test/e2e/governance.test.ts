/**
 * Policy outcomes end to end: approvals (blocked → grant → resumed; deny →
 * the tool returns the denial), denials, rate limits, and refusals of LLM
 * calls through the AI SDK, turned back into the SDK's errors.
 */

import { createOpenAI } from "@ai-sdk/openai";
import { generateText } from "ai";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { ConflictError, defineTool, ForbiddenError, PolicyError, raiseForRefusal, RateLimited, rebunoFetch, step } from "../../src/index.js";
import { serveAgent } from "../support/agents.js";
import { eventually, Kernel } from "../support/kernel.js";
import { ScriptServer } from "../support/script-server.js";

const BUNDLE = `
default_action: allow
rules:
  - id: mail-needs-approval
    priority: 1
    when: {target: send_email}
    then:
      decision: require_approval
      approval_config: {approvers: [alice], timeout: 10m, message: "send this mail?"}
  - id: no-shell
    priority: 2
    when: {target: "shell*"}
    then: {decision: deny, reason: "no shell access"}
  - id: local-budget
    priority: 3
    when: {step_kind: local}
    then:
      decision: allow
      rate_limit: {max_calls: 1, window: 1m}
  - id: no-llm
    priority: 4
    when: {step_kind: llm_call}
    then: {decision: deny, reason: "llm budget spent"}
`;

let kernel: Kernel;
let llm: ScriptServer;
beforeAll(async () => {
  kernel = await new Kernel().start();
  llm = new ScriptServer();
  await llm.start();
});
afterAll(async () => {
  await llm.stop();
  await kernel.destroy();
});

describe("approvals", () => {
  it.each(["grant", "deny"] as const)("%s: the execution blocks, the handler unwinds, and the decision resumes it", async (decide) => {
    const sent: string[] = [];
    let dispatches = 0;
    const sendEmail = defineTool({
      name: "send_email",
      execute: ({ to }: { to: string; text: string }) => {
        sent.push(to);
        return `sent to ${to}`;
      },
    });
    const id = `mailer-${decide}`;
    const served = await serveAgent(kernel, id, async (input: { to: string }) => {
      dispatches++;
      return { result: await sendEmail({ to: input.to, text: "hello" }) };
    });
    const client = kernel.client();
    try {
      await client.setPolicy(id, BUNDLE);
      const ex = await client.create(id, { to: "ops@example.com" });
      await eventually(async () => (await client.get(ex.id)).status === "blocked", "blocked");
      await eventually(() => served.agent.running.size === 0, "the first dispatch to end");
      const [approval] = await client.approvals({ executionId: ex.id });
      expect(approval).toMatchObject({ status: "pending", target: "send_email", approvers: ["alice"], message: "send this mail?" });
      expect(sent).toEqual([]);
      await expect(client.grant(approval!.id, { decidedBy: "mallory" })).rejects.toThrow(ForbiddenError);
      if (decide === "grant") await client.grant(approval!.id, { decidedBy: "alice", rationale: "fine" });
      else await client.deny(approval!.id, { decidedBy: "alice", rationale: "not today" });
      await expect(client.deny(approval!.id, { decidedBy: "alice" })).rejects.toThrow(ConflictError);
      const done = await client.wait(ex.id, { timeout: 20_000 });
      expect(done.status, done.failureReason).toBe("completed");
      expect(dispatches).toBe(2);
      if (decide === "grant") {
        expect(done.output).toEqual({ result: "sent to ops@example.com" });
        expect(sent).toEqual(["ops@example.com"]);
      } else {
        expect(sent).toEqual([]);
        expect((done.output as { result: string }).result).toMatch(/^Tool 'send_email' was denied: .*not today.*Do not retry this call\.$/);
      }
      expect((await client.approval(approval!.id)).status).toBe(decide === "grant" ? "granted" : "denied");
    } finally {
      await served.close();
    }
  });
});

describe("denials and rate limits", () => {
  it("a denied tool returns the denial; a rate-limited step fails the execution with its reason", async () => {
    const ran: string[] = [];
    const shell = defineTool({ name: "shell", execute: ({ cmd }: { cmd: string }) => (ran.push(cmd), "ran") });
    const served = await serveAgent(kernel, "denied", async (input: { escape: boolean }) => {
      const answer = await shell({ cmd: "rm -rf /" });
      if (input.escape) {
        await step("boom", () => 1);
        await step("boom2", () => 2); // rate limited: escapes the handler
      }
      return { answer };
    });
    const client = kernel.client();
    try {
      await client.setPolicy("denied", BUNDLE);
      let done = await client.wait((await client.create("denied", { escape: false })).id, { timeout: 20_000 });
      expect(done.status).toBe("completed");
      expect(ran).toEqual([]);
      expect(done.output).toEqual({ answer: "Tool 'shell' was denied: no shell access (rule no-shell). Do not retry this call." });
      const ex = await client.create("denied", { escape: true });
      done = await client.wait(ex.id, { timeout: 20_000 });
      expect([done.status, done.failureReason]).toEqual(["failed", "rate_limited: rate_limit_exceeded"]);
      const limited = (await client.allEvents(ex.id)).filter((e) => e.type === "step.rate_limited");
      expect(limited.map((e) => e.payload.target)).toEqual(["boom2"]);
    } finally {
      await served.close();
    }
  });

  it("a handler can catch RateLimited; nothing is recorded for the refusal", async () => {
    const served = await serveAgent(kernel, "limited", async () => {
      const first = await step("one", () => 1);
      try {
        await step("two", () => 2);
      } catch (e) {
        if (!(e instanceof RateLimited)) throw e;
        return { first, reason: e.reason, retryAfterMs: e.retryAfterMs };
      }
      return { first };
    });
    const client = kernel.client();
    try {
      await client.setPolicy("limited", BUNDLE);
      const ex = await client.create("limited", null);
      const done = await client.wait(ex.id, { timeout: 20_000 });
      const out = done.output as { first: number; reason: string; retryAfterMs: number };
      expect(out.first).toBe(1);
      expect(out.reason).toBe("rate_limit_exceeded");
      expect(out.retryAfterMs).toBeGreaterThan(0);
      expect(out.retryAfterMs).toBeLessThanOrEqual(60_000);
      expect((await client.steps(ex.id)).map((s) => s.target)).toEqual(["one"]);
    } finally {
      await served.close();
    }
  });

  it("a denied LLM call reaches the AI SDK as a 403 that raiseForRefusal turns into PolicyError; uncaught, it fails the execution", async () => {
    const caught: unknown[] = [];
    const served = await serveAgent(kernel, "llm-denied", async (input: { rethrow: boolean }) => {
      const openai = createOpenAI({ fetch: rebunoFetch, baseURL: llm.url, apiKey: "test" });
      try {
        await generateText({ model: openai("scripted"), prompt: "hi", maxRetries: 0 });
      } catch (e) {
        if (input.rethrow) throw e;
        try {
          raiseForRefusal(e);
        } catch (refusal) {
          caught.push(refusal);
        }
      }
      return { ok: true };
    });
    const client = kernel.client();
    try {
      await client.setPolicy("llm-denied", BUNDLE);
      const before = llm.requests.length;
      let done = await client.wait((await client.create("llm-denied", { rethrow: false })).id, { timeout: 20_000 });
      expect(done.status).toBe("completed");
      expect(caught).toHaveLength(1);
      expect(caught[0]).toBeInstanceOf(PolicyError);
      expect((caught[0] as PolicyError).reason).toBe("llm budget spent");
      expect((caught[0] as PolicyError).ruleId).toBe("no-llm");
      done = await client.wait((await client.create("llm-denied", { rethrow: true })).id, { timeout: 20_000 });
      expect([done.status, done.failureReason]).toEqual(["failed", "policy_denied: llm budget spent"]);
      expect(llm.requests.length).toBe(before); // the provider never saw a request
    } finally {
      await served.close();
    }
  });
});

