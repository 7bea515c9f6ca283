/**
 * A small MCP server over stdio for the end-to-end tests. Each tool call
 * appends the tool's name to the file named by `MCP_MARKERS`, so that tests
 * can count the calls that reached it (a replay must not).
 */

import fs from "node:fs";
import { McpServer } from "@modelcontextprotocol/sdk/server/mcp.js";
import { StdioServerTransport } from "@modelcontextprotocol/sdk/server/stdio.js";
import { z } from "zod";

const server = new McpServer({ name: "rebuno-test-tools", version: "1.0.0" });

function mark(name: string): void {
  fs.appendFileSync(process.env.MCP_MARKERS!, `${name}\n`);
}

const text = (t: string) => ({ content: [{ type: "text" as const, text: t }] });

server.registerTool("add", { description: "Add two integers.", inputSchema: { a: z.number().int(), b: z.number().int() } }, ({ a, b }) => {
  mark("add");
  return text(String(a + b));
});

server.registerTool("shout", {
  description: "Upper-case a text.",
  inputSchema: { text: z.string(), times: z.number().int().optional() },
}, ({ text: t, times = 1 }) => {
  mark("shout");
  // Two blocks when repeated: the wrapper joins text blocks with a blank line.
  return { content: Array.from({ length: times }, () => ({ type: "text" as const, text: t.toUpperCase() })) };
});

server.registerTool("explode", { description: "Always fails.", inputSchema: { reason: z.string() } }, ({ reason }) => {
  mark("explode");
  return { ...text(`exploded: ${reason}`), isError: true };
});

server.registerTool("stats", {
  description: "Sum and count of some numbers.",
  inputSchema: { numbers: z.array(z.number()) },
  outputSchema: { sum: z.number(), count: z.number() },
}, ({ numbers }) => {
  mark("stats");
  const result = { sum: numbers.reduce((s, n) => s + n, 0), count: numbers.length };
  return { ...text(JSON.stringify(result)), structuredContent: result };
});

await server.connect(new StdioServerTransport());
