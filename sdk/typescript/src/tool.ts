/**
 * `defineTool` and `wrapTool`: functions whose calls are governed, recorded
 * steps of kind `tool_call`. The step's args are the call's argument (the
 * one object a tool takes, as the AI SDK passes it). A policy denial is
 * caught and returned as a string the model can read; every other outcome is
 * the step's.
 */

import { PolicyError } from "./errors.js";
import { type Idempotency, runEffect, validateIdempotency, validateResources } from "./effects.js";

/** The string a denied tool returns to its caller (usually a model). */
export function denialMessage(toolId: string, err: PolicyError): string {
  const rule = err.ruleId ? ` (rule ${err.ruleId})` : "";
  return `Tool '${toolId}' was denied: ${err.reason}${rule}. Do not retry this call.`;
}

export interface ToolOptions {
  /** The tool id (the step's target). */
  name: string;
  /** Resource keys the tool may change (each opened with `resource()` in this dispatch). */
  resources?: readonly string[] | undefined;
  /** `at_most_once`: the kernel never runs a call again when an earlier run's outcome is unknown. */
  idempotency?: Idempotency | undefined;
}

export interface ToolDefinition<Args, Result> extends ToolOptions {
  /** The body: runs on the first call; replays return its recorded result. */
  execute: (args: Args) => Result | Promise<Result>;
}

/** A governed tool: resolves to the (recorded) result, or to the denial text. */
export type Tool<Args, Result> = ((args: Args) => Promise<Awaited<Result> | string>) & { readonly toolName: string };

/** The callable behind every governed tool (`defineTool`, `wrapTool`, the MCP wrappers). `what` names it in errors. */
export function makeTool<Args, Result>(name: string, idempotency: Idempotency, resources: string[],
  body: (args: Args, rest: unknown[]) => Result | Promise<Result>, what = `tool ${JSON.stringify(name)}`): Tool<Args, Result> {
  const call = async (args: Args, ...rest: unknown[]): Promise<Awaited<Result> | string> => {
    try {
      return (await runEffect("tool_call", name, args === undefined ? {} : args, () => body(args, rest), { idempotency, resources, what })) as Awaited<Result>;
    } catch (e) {
      if (e instanceof PolicyError) return denialMessage(name, e);
      throw e;
    }
  };
  Object.defineProperty(call, "name", { value: name });
  Object.defineProperty(call, "toolName", { value: name, enumerable: true });
  return call as Tool<Args, Result>;
}

export function checkName(name: unknown): string {
  if (typeof name !== "string" || !name) throw new TypeError("a tool name must be a non-empty string");
  return name;
}

/**
 * Define a governed tool:
 *
 *     const writeFile = defineTool({
 *       name: "write_file",
 *       resources: ["workspace"],
 *       execute: async ({ path, content }: { path: string; content: string }) => { ... },
 *     });
 *
 * Each call submits a `tool_call` step whose args are the object passed; on
 * replay the recorded result is returned without running `execute`.
 */
export function defineTool<Args, Result>(definition: ToolDefinition<Args, Result>): Tool<Args, Result> {
  const name = checkName(definition.name);
  if (typeof definition.execute !== "function") throw new TypeError("defineTool needs an execute function");
  const execute = definition.execute;
  return makeTool(name, validateIdempotency(definition.idempotency ?? "safe_to_retry"),
    validateResources(definition.resources), (args) => execute(args));
}

/**
 * Wrap an existing function (sync or async) as a governed tool. The step's
 * args are its first argument (`{}` when called without one); further
 * arguments (such as the AI SDK's call options) are passed through but not
 * recorded. `name` defaults to the function's name.
 */
export function wrapTool<Args, Result>(fn: (args: Args, ...rest: never[]) => Result | Promise<Result>,
  options: Partial<ToolOptions> = {}): Tool<Args, Result> {
  if (typeof fn !== "function") throw new TypeError("wrapTool needs a function");
  const name = checkName(options.name ?? fn.name);
  const call = fn as (args: Args, ...rest: unknown[]) => Result | Promise<Result>;
  return makeTool(name, validateIdempotency(options.idempotency ?? "safe_to_retry"),
    validateResources(options.resources), (args, rest) => call(args, ...rest));
}
