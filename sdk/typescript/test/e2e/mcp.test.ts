/**
 * MCP tools end to end: a real MCP server over stdio (agents/mcp-server.ts),
 * the SDK's `Client`, and the real kernel. Wrapped tools are recorded as
 * `tool_call` steps, replayed without reaching the server, fail the step on
 * `isError`, and return the denial when a policy denies them.
 */

import fs from "node:fs";
import os from "node:os";
import path from "node:path";
import { fileURLToPath } from "node:url";
import { Client as McpSdkClient } from "@modelcontextprotocol/sdk/client/index.js";
import { StdioClientTransport } from "@modelcontextprotocol/sdk/client/stdio.js";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { defineTool, execution, ToolError } from "../../src/index.js";
import { type McpTool, wrapMcpTools } from "../../src/mcp.js";
import { serveAgent } from "../support/agents.js";
import { Kernel, markers, REPO } from "../support/kernel.js";

const SERVER = fileURLToPath(new URL("./agents/mcp-server.ts", import.meta.url));
const TSX = path.join(REPO, "sdk/typescript/node_modules/tsx/dist/loader.mjs");
// A bound on waits for what normally takes a second or two, so that a broken run fails instead of
// hanging; generous, because a loaded machine starts the server processes slowly.
const PATIENCE = 90_000;

let kernel: Kernel;
let dir: string;
beforeAll(async () => {
  kernel = await new Kernel().start();
  dir = fs.mkdtempSync(path.join(os.tmpdir(), "rebuno-ts-mcp-"));
});
afterAll(async () => {
  await kernel.destroy();
  fs.rmSync(dir, { recursive: true, force: true });
});

/** A client connected to a fresh server process that marks its calls in `markerFile`. */
async function connect(markerFile: string): Promise<McpSdkClient> {
  const client = new McpSdkClient({ name: "rebuno-e2e", version: "1.0.0" });
  // node with tsx's loader, as AgentProcess runs TypeScript scripts: one process to kill on close.
  await client.connect(new StdioClientTransport({ command: process.execPath, args: ["--import", TSX, SERVER], env: { MCP_MARKERS: markerFile } }));
  return client;
}

function gate(): { wait: Promise<void>; open: () => void } {
  let open!: () => void;
  const wait = new Promise<void>((resolve) => (open = resolve));
  return { wait, open };
}

/** Rejects when the dispatch stops (superseded, closed or terminal). */
const stopped = (signal: AbortSignal): Promise<never> =>
  new Promise((_, reject) => signal.addEventListener("abort", () => reject(signal.reason as Error), { once: true }));

const byId = (tools: McpTool[]): Record<string, McpTool> => Object.fromEntries(tools.map((t) => [t.toolName, t]));

describe("MCP tools", () => {
  it("are recorded as tool_call steps and replayed on the next attempt without reaching the server", async () => {
    const markerFile = path.join(dir, "replay-calls");
    const attempts: (number | undefined)[] = [];
    const shapes: Record<string, unknown>[] = [];
    const parked = gate();
    const hold = defineTool({
      name: "hold",
      execute: async () => {
        const ctx = execution();
        if (ctx.dispatchAttempt === 1) {
          // This step's submit carried the outcomes of every MCP call before it.
          parked.open();
          await stopped(ctx.abortSignal); // superseded: the second attempt replays everything before
        }
        return "held";
      },
    });
    const served = await serveAgent(kernel, "mcp", async () => {
      attempts.push(execution().dispatchAttempt);
      const mcp = await connect(markerFile);
      try {
        const tools = byId(await wrapMcpTools(mcp, { prefix: "calc." }));
        const shout = tools["calc.shout"]!;
        shapes.push({ ids: Object.keys(tools).sort(), name: shout.name, description: shout.description, schema: shout.inputSchema });
        const total = await tools["calc.add"]!({ a: 2, b: 3 });
        const loud = await shout({ text: "hi", times: 2 });
        const stats = await tools["calc.stats"]!({ numbers: [1, 2, 3] });
        let failure: unknown;
        try {
          await tools["calc.explode"]!({ reason: "test" });
        } catch (e) {
          if (!(e instanceof ToolError)) throw e;
          failure = { toolId: e.toolId, message: e.message, error: e.error };
        }
        return { total, loud, stats, failure, hold: await hold({}) };
      } finally {
        await mcp.close();
      }
    });
    const client = kernel.client();
    try {
      const ex = await client.create("mcp", null);
      const ended = client.wait(ex.id, { timeout: PATIENCE });
      // An attempt that fails before it parks ends the execution: say so instead of waiting out the timeout.
      expect(await Promise.race([parked.wait.then(() => undefined), ended]), "the execution ended before the first attempt parked").toBeUndefined();
      expect(markers(markerFile).sort()).toEqual(["add", "explode", "shout", "stats"]);
      await kernel.advance(121); // the lease lapses: the kernel dispatches a second attempt
      const done = await ended;
      expect(done.status, done.failureReason).toBe("completed");
      expect(attempts).toEqual([1, 2]);
      expect(done.output).toEqual({
        total: "5",
        loud: "HI\n\nHI",
        stats: { sum: 6, count: 3 },
        failure: { toolId: "calc.explode", message: "exploded: test", error: { message: "exploded: test", type: "McpToolError" } },
        hold: "held",
      });
      // Each tool reached the server once: the second attempt replayed them all.
      expect(markers(markerFile).sort()).toEqual(["add", "explode", "shout", "stats"]);
      const steps = await client.steps(ex.id);
      expect(steps.map((s) => [s.kind, s.target, s.status])).toEqual([
        ["tool_call", "calc.add", "succeeded"], ["tool_call", "calc.shout", "succeeded"], ["tool_call", "calc.stats", "succeeded"],
        ["tool_call", "calc.explode", "failed"], ["tool_call", "hold", "succeeded"],
      ]);
      expect(steps.slice(0, 4).map((s) => s.args)).toEqual([{ a: 2, b: 3 }, { text: "hi", times: 2 }, { numbers: [1, 2, 3] }, { reason: "test" }]);
      expect(steps[1]!.result).toBe("HI\n\nHI");
      const shape = {
        ids: ["calc.add", "calc.explode", "calc.shout", "calc.stats"],
        name: "calc.shout",
        description: "Upper-case a text.",
        schema: expect.objectContaining({ type: "object", properties: { text: expect.any(Object), times: expect.any(Object) }, required: ["text"] }) as unknown,
      };
      expect(shapes).toEqual([shape, shape]);
    } finally {
      await served.close();
    }
  }, PATIENCE + 10_000);

  it("return the denial when a policy denies them, and the server never sees the call", async () => {
    const markerFile = path.join(dir, "denial-calls");
    const served = await serveAgent(kernel, "mcp-denied", async () => {
      const mcp = await connect(markerFile);
      try {
        const tools = await wrapMcpTools(mcp, { prefix: "calc.", names: ["shout", "add"] });
        const [shout, add] = tools;
        return { ids: tools.map((t) => t.toolName), loud: await shout!({ text: "hi" }), total: await add!({ a: 1, b: 1 }) };
      } finally {
        await mcp.close();
      }
    });
    const client = kernel.client();
    try {
      await client.setPolicy("mcp-denied", `
default_action: allow
rules:
  - id: no-shouting
    priority: 1
    when: {target: calc.shout}
    then: {decision: deny, reason: "too loud"}
`);
      const done = await client.wait((await client.create("mcp-denied", null)).id, { timeout: PATIENCE });
      expect(done.status, done.failureReason).toBe("completed");
      expect(done.output).toEqual({
        ids: ["calc.shout", "calc.add"],
        loud: "Tool 'calc.shout' was denied: too loud (rule no-shouting). Do not retry this call.",
        total: "2",
      });
      expect(markers(markerFile)).toEqual(["add"]);
    } finally {
      await served.close();
    }
  }, PATIENCE + 10_000);

  it("names with tools the server lacks throws, naming them", async () => {
    const mcp = await connect(path.join(dir, "names-calls"));
    try {
      await expect(wrapMcpTools(mcp, { names: ["add", "nope", "gone"] })).rejects.toThrow(/^the MCP server has no tool named nope, gone$/);
    } finally {
      await mcp.close();
    }
  });
});
