/**
 * `rebuno/mcp` without a kernel: the value of a call result, and the wrappers
 * against the MCP SDK's real `Client` and `Server` joined in memory (a server
 * that lists its tools two to a page).
 */

import { Client } from "@modelcontextprotocol/sdk/client/index.js";
import { InMemoryTransport } from "@modelcontextprotocol/sdk/inMemory.js";
import { Server } from "@modelcontextprotocol/sdk/server/index.js";
import { CallToolRequestSchema, ListToolsRequestSchema } from "@modelcontextprotocol/sdk/types.js";
import { jsonSchema, tool } from "ai";
import { afterEach, beforeEach, describe, expect, it } from "vitest";
import { RebunoError } from "../src/errors.js";
import { type McpArguments, type McpClient, type McpInputSchema, McpToolError, mcpResultValue, wrapMcpTool, wrapMcpTools } from "../src/mcp.js";

describe("mcpResultValue", () => {
  const text = (t: string) => ({ type: "text", text: t });
  const image = { type: "image", data: "aGk=", mimeType: "image/png" };

  it("is the structured content when the server sent one, whatever the text says", () => {
    expect(mcpResultValue({ content: [text('{"sum":6}')], structuredContent: { sum: 6 } })).toEqual({ sum: 6 });
    expect(mcpResultValue({ content: [text("plain")], structuredContent: null })).toBe("plain");
  });

  it("is the text of the content, several blocks joined by a blank line", () => {
    expect(mcpResultValue({ content: [text("one")] })).toBe("one");
    expect(mcpResultValue({ content: [text("one"), text("two"), text("")] })).toBe("one\n\ntwo\n\n");
  });

  it("is the content blocks themselves when any is not text", () => {
    expect(mcpResultValue({ content: [image] })).toEqual([image]);
    expect(mcpResultValue({ content: [text("caption"), image] })).toEqual([text("caption"), image]);
    expect(mcpResultValue({ content: [] })).toEqual([]);
  });

  it("is the toolResult of a result in the 2024-10-07 shape", () => {
    expect(mcpResultValue({ toolResult: { ok: true } })).toEqual({ ok: true });
  });

  it("throws McpToolError with the content's text for an isError result", () => {
    expect(() => mcpResultValue({ content: [text("no such file"), text("try again")], isError: true })).toThrow(new McpToolError("no such file\n\ntry again"));
    expect(() => mcpResultValue({ content: [text("bad")], structuredContent: { x: 1 }, isError: true })).toThrow(McpToolError);
    expect(() => mcpResultValue({ content: [image], isError: true })).toThrow(/^MCP tool call failed$/);
    const err = (() => {
      try {
        mcpResultValue({ content: [], isError: true });
      } catch (e) {
        return e;
      }
    })();
    expect(err).toBeInstanceOf(RebunoError);
    expect((err as Error).name).toBe("McpToolError");
  });
});

const SCHEMA: McpInputSchema = { type: "object", properties: { x: { type: "number" } }, required: ["x"] };
const LISTED = ["alpha", "beta", "gamma", "delta", "epsilon"].map((name) => ({
  name,
  inputSchema: SCHEMA,
  ...(name === "delta" ? {} : { description: `The ${name} tool.` }),
}));

describe("wrapMcpTools with the MCP SDK's Client", () => {
  let client: Client;
  let server: Server;
  let cursors: (string | undefined)[];
  let calls: string[];

  beforeEach(async () => {
    cursors = [];
    calls = [];
    server = new Server({ name: "paged", version: "1.0.0" }, { capabilities: { tools: {} } });
    server.setRequestHandler(ListToolsRequestSchema, (req) => {
      const cursor = req.params?.cursor;
      cursors.push(cursor);
      const start = cursor === undefined ? 0 : Number(cursor);
      const next = start + 2;
      return { tools: LISTED.slice(start, next), ...(next < LISTED.length ? { nextCursor: String(next) } : {}) };
    });
    server.setRequestHandler(CallToolRequestSchema, (req) => {
      calls.push(req.params.name);
      return { content: [{ type: "text", text: "called" }] };
    });
    client = new Client({ name: "test", version: "1.0.0" });
    const [a, b] = InMemoryTransport.createLinkedPair();
    await Promise.all([server.connect(b), client.connect(a)]);
  });
  afterEach(async () => {
    await client.close();
    await server.close();
  });

  it("satisfies McpClient as it is", () => {
    const structural: McpClient = client;
    expect(structural).toBe(client);
  });

  it("follows nextCursor and wraps every listed tool, in order, with the prefix", async () => {
    const tools = await wrapMcpTools(client, { prefix: "p." });
    expect(cursors).toEqual([undefined, "2", "4"]);
    expect(tools.map((t) => [t.toolName, t.name, t.description])).toEqual([
      ["p.alpha", "p.alpha", "The alpha tool."], ["p.beta", "p.beta", "The beta tool."], ["p.gamma", "p.gamma", "The gamma tool."],
      ["p.delta", "p.delta", "MCP tool delta."], ["p.epsilon", "p.epsilon", "The epsilon tool."],
    ]);
    expect(tools[0]!.inputSchema).toEqual(SCHEMA);
    expect(Object.keys(tools[0]!)).toEqual(["toolName", "description", "inputSchema"]);
  });

  it("names picks and orders tools across pages, and throws naming every missing one", async () => {
    const tools = await wrapMcpTools(client, { names: ["epsilon", "alpha"] });
    expect(tools.map((t) => t.toolName)).toEqual(["epsilon", "alpha"]);
    await expect(wrapMcpTools(client, { names: ["alpha", "zeta", "eta"] })).rejects.toThrow(/^the MCP server has no tool named zeta, eta$/);
  });

  it("checks idempotency and resources before listing", async () => {
    await expect(wrapMcpTools(client, { idempotency: "twice" as never })).rejects.toThrow(TypeError);
    await expect(wrapMcpTools(client, { resources: ["no spaces"] })).rejects.toThrow(/invalid resource key/);
    expect(cursors).toEqual([]);
    expect(() => wrapMcpTool(client, LISTED[0]!, { id: "" })).toThrow(TypeError);
  });

  it("keeps its own copy of the input schema", async () => {
    const info = { name: "copy", inputSchema: { type: "object" as const, properties: { x: { type: "number" } } } };
    const wrapped = wrapMcpTool(client, info, { id: "mine" });
    info.inputSchema.properties.x.type = "string";
    expect(wrapped.inputSchema).toEqual({ type: "object", properties: { x: { type: "number" } } });
    expect(wrapped.toolName).toBe("mine");
  });

  it("throws when the server repeats a cursor instead of listing forever", async () => {
    const looping: McpClient = {
      listTools: () => Promise.resolve({ tools: [], nextCursor: "again" }),
      callTool: (params) => client.callTool(params),
    };
    await expect(wrapMcpTools(looping)).rejects.toThrow(/repeated the tools\/list cursor "again"/);
  });

  it("outside a handler, throws before calling the server", async () => {
    const [alpha] = await wrapMcpTools(client, { names: ["alpha"] });
    await expect(alpha!({ x: 1 })).rejects.toThrow(/^MCP tool "alpha" must be called inside a Rebuno handler/);
    expect(calls).toEqual([]);
  });

  it("feeds the AI SDK's tool() as it is", async () => {
    const [alpha] = await wrapMcpTools(client, { names: ["alpha"] });
    const inputSchema = jsonSchema<McpArguments>(alpha!.inputSchema);
    const aiTool = tool({ description: alpha!.description, inputSchema, execute: alpha! });
    expect(aiTool.description).toBe("The alpha tool.");
    expect(aiTool.execute).toBe(alpha);
    expect(await inputSchema.jsonSchema).toEqual(SCHEMA);
  });
});
