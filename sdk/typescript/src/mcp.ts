/**
 * MCP tools as governed tool steps: `import { wrapMcpTools } from "rebuno/mcp"`.
 *
 *     const client = new Client({ name: "my-agent", version: "1.0.0" });
 *     await client.connect(new StdioClientTransport({ command: "my-server" }));
 *     const tools = await wrapMcpTools(client, { prefix: "fs." });
 *
 * A wrapped tool is what `defineTool` returns, plus the tool's `description`
 * and `inputSchema`. A call is a `tool_call` step whose target is the tool id
 * and whose args are the call's arguments: the first run calls the server,
 * replays return the recorded value. A result the server flags `isError`
 * fails the step (`ToolError`); a denial returns a string, as with
 * `defineTool`.
 *
 * The client is typed by shape only, so that the core has no dependency on
 * `@modelcontextprotocol/sdk`: its `Client` fits as it is.
 */

import { type Idempotency, validateIdempotency, validateResources } from "./effects.js";
import { RebunoError } from "./errors.js";
import { checkName, makeTool, type Tool } from "./tool.js";

/** A tool's input schema as MCP sends it: a JSON Schema for an object. */
export interface McpInputSchema {
  readonly type: "object";
  readonly properties?: Readonly<Record<string, object>> | undefined;
  readonly required?: readonly string[] | undefined;
  readonly [key: string]: unknown;
}

/** One entry of a `tools/list` answer. */
export interface McpToolInfo {
  readonly name: string;
  readonly description?: string | undefined;
  readonly inputSchema: McpInputSchema;
}

/** A page of a `tools/list` answer. */
export interface McpToolList {
  readonly tools: readonly McpToolInfo[];
  readonly nextCursor?: string | undefined;
}

/** A content block of a `tools/call` result (`text`, `image`, `resource`, …). */
export interface McpContentBlock {
  readonly type: string;
  readonly [key: string]: unknown;
}

/**
 * A `tools/call` result. `toolResult` is the shape servers of protocol
 * 2024-10-07 answer with, which the MCP SDK's `callTool` may still return.
 */
export interface McpCallToolResult {
  readonly content?: readonly McpContentBlock[] | undefined;
  readonly structuredContent?: unknown;
  readonly isError?: boolean | undefined;
  readonly toolResult?: unknown;
}

/** What the wrappers need of an MCP client; `Client` of `@modelcontextprotocol/sdk` has it. */
export interface McpClient {
  listTools(params?: { cursor?: string }): Promise<McpToolList>;
  callTool(params: { name: string; arguments?: Record<string, unknown> }): Promise<McpCallToolResult>;
}

/** The arguments of an MCP tool call: one object, as the tool's input schema describes. */
export type McpArguments = Record<string, unknown>;

/** A wrapped MCP tool: a governed `Tool` with the server's description and input schema. */
export type McpTool = Tool<McpArguments, unknown> & {
  readonly description: string;
  readonly inputSchema: McpInputSchema;
};

export interface McpToolOptions {
  /** The tool id (the step's target); defaults to the tool's name. */
  id?: string | undefined;
  /** `at_most_once`: the kernel never runs a call again when an earlier run's outcome is unknown. */
  idempotency?: Idempotency | undefined;
  /** Resource keys the tool may change (each opened with `resource()` in this dispatch). */
  resources?: readonly string[] | undefined;
}

export interface McpToolsOptions extends Omit<McpToolOptions, "id"> {
  /** Wrap only these tools, in this order. */
  names?: readonly string[] | undefined;
  /** Prepended to each tool id (e.g. `"github."`), which keeps ids unique across servers. */
  prefix?: string | undefined;
}

/** The MCP server answered a call with `isError`. Inside a wrapped tool it fails the step. */
export class McpToolError extends RebunoError {}

function contentText(result: McpCallToolResult): string | undefined {
  const texts = (result.content ?? []).map((block) => block.text);
  if (texts.length === 0 || texts.some((t) => typeof t !== "string")) return undefined;
  return texts.join("\n\n");
}

/**
 * The value a wrapped tool returns: the structured content when the server
 * sent one, else the text of its content (several blocks joined by blank
 * lines), else the content blocks. Throws {@link McpToolError} for an
 * `isError` result.
 */
export function mcpResultValue(result: McpCallToolResult): unknown {
  if (result.isError) throw new McpToolError(contentText(result) || "MCP tool call failed");
  if (result.structuredContent != null) return result.structuredContent;
  const text = contentText(result);
  if (text !== undefined) return text;
  if (result.content === undefined && "toolResult" in result) return result.toolResult;
  return result.content ?? [];
}

/** Wrap one tool of a connected MCP client as a governed tool. */
export function wrapMcpTool(client: McpClient, tool: McpToolInfo, options: McpToolOptions = {}): McpTool {
  const idempotency = validateIdempotency(options.idempotency ?? "safe_to_retry");
  const resources = validateResources(options.resources);
  const name = checkName(tool.name);
  const id = checkName(options.id ?? name);
  const call = makeTool<McpArguments, unknown>(id, idempotency, resources,
    async (args) => mcpResultValue(await client.callTool({ name, arguments: args ?? {} })),
    `MCP tool ${JSON.stringify(id)}`);
  Object.defineProperty(call, "description", { value: tool.description || `MCP tool ${name}.`, enumerable: true });
  // A copy: the wrapped tool's schema does not change with the listing it came from.
  Object.defineProperty(call, "inputSchema", { value: JSON.parse(JSON.stringify(tool.inputSchema ?? { type: "object" })) as McpInputSchema, enumerable: true });
  return call as McpTool;
}

async function listAll(client: McpClient): Promise<McpToolInfo[]> {
  const tools: McpToolInfo[] = [];
  const seen = new Set<string>();
  let page = await client.listTools();
  for (;;) {
    tools.push(...page.tools);
    const cursor = page.nextCursor;
    if (!cursor) return tools;
    // A server that hands out a cursor twice would otherwise be listed forever.
    if (seen.has(cursor)) throw new Error(`the MCP server repeated the tools/list cursor ${JSON.stringify(cursor)}`);
    seen.add(cursor);
    page = await client.listTools({ cursor });
  }
}

/**
 * Wrap every tool the client lists (following `nextCursor`), or those in
 * `names`, in that order; a name the server does not list throws.
 */
export async function wrapMcpTools(client: McpClient, options: McpToolsOptions = {}): Promise<McpTool[]> {
  const { names, prefix = "" } = options;
  // Checked before listing, so that bad options throw whatever the server lists.
  const idempotency = validateIdempotency(options.idempotency ?? "safe_to_retry");
  const resources = validateResources(options.resources);
  let tools = await listAll(client);
  if (names !== undefined) {
    const byName = new Map(tools.map((t) => [t.name, t]));
    const missing = names.filter((n) => !byName.has(n));
    if (missing.length) throw new Error(`the MCP server has no tool named ${missing.join(", ")}`);
    tools = names.map((n) => byName.get(n)!);
  }
  return tools.map((t) => wrapMcpTool(client, t, { id: prefix + t.name, idempotency, resources }));
}
