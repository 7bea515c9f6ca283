/**
 * The agent's webhook against bad input, and handler outcomes against the
 * real kernel: bodies over the limit are refused before they are read whole
 * (413), unsigned or wrongly signed webhooks get 401, and bad input values,
 * outputs and errors fail the execution with the reasons Python gives.
 */

import net from "node:net";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { z } from "zod";
import { Agent, defineTool, execution, MAX_WEBHOOK_BODY, step, ToolError } from "../../src/index.js";
import { signLegacy } from "../../src/signing.js";
import { SECRET, serveAgent } from "../support/agents.js";
import { Kernel } from "../support/kernel.js";

let kernel: Kernel;
let agent: Agent;
let port: number;
let ran = 0;

beforeAll(async () => {
  kernel = await new Kernel().start();
  agent = new Agent("hooked", { secret: SECRET, baseUrl: kernel.url });
  await agent.serve({ port: 0, handleSignals: false }, () => {
    ran++;
    return null;
  });
  port = agent.address!.port;
});
afterAll(async () => {
  await agent.close();
  await kernel.destroy();
});

/**
 * Send a head and then `repeat` writes of `chunk` to the agent, without
 * ending the body, and read the answer (the agent answers before the body
 * is complete, or never).
 */
function raw(head: string, chunk?: Buffer, repeat = 0): Promise<{ status: number; text: string }> {
  return new Promise((resolve, reject) => {
    const socket = net.connect(port, "127.0.0.1");
    let text = "";
    const timer = setTimeout(() => socket.destroy(), 10_000);
    socket.on("data", (c) => {
      text += c.toString("utf8");
      const m = /^HTTP\/1\.1 (\d+)[^]*?\r\n\r\n/.exec(text);
      if (m) {
        clearTimeout(timer);
        socket.destroy();
        resolve({ status: Number(m[1]), text });
      }
    });
    socket.on("error", () => undefined);
    socket.on("close", () => reject(new Error(`no answer: ${text}`)));
    socket.write(head);
    for (let i = 0; i < repeat; i++) socket.write(chunk!);
  });
}

const hook = (body: string, headers: Record<string, string> = {}): Promise<Response> =>
  fetch(`http://127.0.0.1:${port}/webhook`, { method: "POST", body, headers: { "content-type": "application/json", ...headers } });

const EXEC = "01930000-0000-7000-8000-00000000000a";
const webhookBody = (dispatch = "01930000-0000-7000-8000-0000000000d1", attempt = 1): string =>
  JSON.stringify({ execution_id: EXEC, dispatch_id: dispatch, dispatch_attempt: attempt, lease_timeout_seconds: 120 });

describe("the webhook", () => {
  it("answers 413 to a declared length over the limit without reading the body", async () => {
    const r = await raw(`POST /webhook HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: ${10 * 1024 * 1024}\r\n\r\n`);
    expect(r.status).toBe(413);
    expect(r.text).toContain('"code":"payload_too_large"');
  });

  it("answers 413 to a chunked body once it passes the limit, before the body is complete", async () => {
    const slice = Buffer.alloc(16 * 1024, "a");
    const chunk = Buffer.concat([Buffer.from(`${slice.length.toString(16)}\r\n`), slice, Buffer.from("\r\n")]);
    // Five times the limit, and never the terminating chunk: only an agent
    // that stops at the limit can answer.
    const r = await raw("POST /webhook HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n",
      chunk, (5 * MAX_WEBHOOK_BODY) / slice.length);
    expect(r.status).toBe(413);
    expect(ran).toBe(0);
  });

  it.each([
    ["no signature", {}],
    ["another secret's signature", { "Rebuno-Signature": signLegacy("another-secret", Buffer.from(webhookBody())) }],
    ["a v1 value", { "Rebuno-Signature": "v1=" + signLegacy(SECRET, Buffer.from(webhookBody())).slice(7) }],
    ["uppercase hex", { "Rebuno-Signature": "sha256=" + signLegacy(SECRET, Buffer.from(webhookBody())).slice(7).toUpperCase() }],
  ])("answers 401 to %s and runs nothing", async (_what, headers) => {
    const r = await hook(webhookBody(), headers);
    expect(r.status).toBe(401);
    expect(await r.json()).toEqual({ code: "unauthorized", message: "unauthorized" });
    expect(ran).toBe(0);
  });

  it("answers 401 to a signature of other bytes (a replayed signature on a new body)", async () => {
    const old = signLegacy(SECRET, Buffer.from(webhookBody("01930000-0000-7000-8000-0000000000d0")));
    expect((await hook(webhookBody(), { "Rebuno-Signature": old })).status).toBe(401);
  });

  it("answers 401 to two signature headers", async () => {
    const body = webhookBody();
    const sig = signLegacy(SECRET, Buffer.from(body));
    const r = await raw(`POST /webhook HTTP/1.1\r\nHost: x\r\nContent-Length: ${body.length}\r\nRebuno-Signature: ${sig}\r\nRebuno-Signature: ${sig}\r\n\r\n${body}`);
    expect(r.status).toBe(401);
  });

  it("parses JSON only after verifying, and checks the ids", async () => {
    const signed = (body: string): Promise<Response> => hook(body, { "Rebuno-Signature": signLegacy(SECRET, Buffer.from(body)) });
    expect((await hook("{not json")).status).toBe(401);
    expect((await signed("{not json")).status).toBe(400);
    expect((await signed("[]")).status).toBe(400);
    expect((await signed(JSON.stringify({ execution_id: "x", dispatch_id: "y" }))).status).toBe(400);
  });

  it("answers 404 elsewhere and 405 to other methods", async () => {
    expect((await fetch(`http://127.0.0.1:${port}/other`, { method: "POST" })).status).toBe(404);
    const r = await fetch(`http://127.0.0.1:${port}/webhook`);
    expect(r.status).toBe(405);
    expect(r.headers.get("allow")).toBe("POST");
  });
});

describe("handler outcomes", () => {
  const Input = z.object({ prompt: z.string(), limit: z.number().int().default(10) });

  it("validates input with a schema: values, defaults, non-objects and failures", async () => {
    const served = await serveAgent(kernel, "schema", (input: z.infer<typeof Input>) => input, { input: Input });
    const client = kernel.client();
    try {
      const run = async (input: unknown) => client.wait((await client.create("schema", input)).id, { timeout: 20_000 });
      expect((await run({ prompt: "hi", extra: 1 })).output).toEqual({ prompt: "hi", limit: 10 });
      for (const bad of [[1, 2], "text", 42]) {
        const done = await run(bad);
        expect([done.status, done.failureReason]).toEqual(["failed", "input must be a JSON object"]);
      }
      const missing = await run(null);
      expect(missing.status).toBe("failed");
      expect(missing.failureReason).toMatch(/^input validation failed: prompt: /);
      const wrong = await run({ prompt: "x", limit: "ten" });
      expect(wrong.failureReason).toMatch(/^input validation failed: limit: /);
    } finally {
      await served.close();
    }
  });

  it("fails with the Python texts for outputs, thrown errors and tool errors", async () => {
    class WidgetError extends Error {}
    const broken = defineTool({ name: "broken", execute: () => { throw new RangeError("no widgets left"); } });
    const mapper = defineTool({ name: "mapper", execute: () => new Map([["a", 1]]) });
    const served = await serveAgent(kernel, "outcomes", async (input: { kind: string }) => {
      switch (input.kind) {
        case "map": return new Map();
        case "bigint": return { n: 1n };
        case "throw": throw new WidgetError("boom");
        case "tool": return broken({});
        case "tool-result": return mapper({});
        case "caught":
          try {
            await broken({});
          } catch (e) {
            return { caught: e instanceof ToolError ? [e.toolId, e.message, e.error] : null };
          }
          return null;
        default: return undefined;
      }
    });
    const client = kernel.client();
    try {
      const run = async (kind: string) => client.wait((await client.create("outcomes", { kind })).id, { timeout: 20_000 });
      expect((await run("map")).failureReason).toBe("output is not JSON-serializable: Map");
      expect((await run("bigint")).failureReason).toBe("output is not JSON-serializable: bigint");
      expect((await run("throw")).failureReason).toBe("agent_error: WidgetError: boom");
      const tool = await run("tool");
      expect(tool.failureReason).toBe("tool_error: broken: no widgets left");
      const [failed] = await client.steps(tool.id);
      expect([failed!.status, failed!.error]).toEqual(["failed", { message: "no widgets left", type: "RangeError" }]);
      const result = await run("tool-result");
      expect(result.failureReason).toBe("tool_error: mapper: result is not JSON-serializable: Map");
      expect((await client.steps(result.id))[0]!.error).toEqual({ message: "result is not JSON-serializable: Map", type: "TypeError" });
      expect((await run("caught")).output).toEqual({ caught: ["broken", "no widgets left", { message: "no widgets left", type: "RangeError" }] });
      const empty = await run("none");
      expect([empty.status, empty.output]).toEqual(["completed", null]);
    } finally {
      await served.close();
    }
  });

  it("keeps the SDK outside a handler out: tools, steps and execution() throw", async () => {
    await expect(step("x", () => 1)).rejects.toThrow(/inside a Rebuno handler/);
    await expect(defineTool({ name: "t", execute: () => 1 })({})).rejects.toThrow(/inside a Rebuno handler/);
    expect(() => execution()).toThrow(/inside a Rebuno handler/);
  });
});
