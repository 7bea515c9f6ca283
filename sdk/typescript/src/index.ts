/**
 * Rebuno: durable execution for AI agents — the TypeScript SDK.
 *
 *     import { Agent, defineTool, rebunoFetch, resource, step } from "rebuno";
 *
 *     const search = defineTool({ name: "web_search", execute: async ({ query }: { query: string }) => ... });
 *     async function process(input: { prompt: string }) {
 *       return { answer: await search({ query: input.prompt }) };
 *     }
 *     await new Agent("researcher").serve({ port: 5000 }, process);
 */

export { Agent, failureReason, MAX_WEBHOOK_BODY, type AgentOptions, type Handler, type HandlerOptions, type ServeOptions } from "./agent.js";
export { Client, MAX_WAIT, WAIT_SLICE, type ClientOptions, type CreateOptions } from "./client.js";
export {
  APIError, apiError, Blocked, CheckpointUnavailable, ConflictError, ExecutionFailedError, ExecutionTerminalError, ForbiddenError, InternalServerError,
  LeaseSupersededError, MethodNotAllowedError, NotFoundError, PayloadTooLargeError, PolicyError, raiseForRefusal, RateLimited,
  RebunoError, Terminated, ToolError, UnauthorizedError, UnavailableError, UnsupportedMediaTypeError, ValidationError,
} from "./errors.js";
export { currentContext, execution, type ExecutionContext } from "./execution.js";
export type { Idempotency } from "./effects.js";
export type { StandardSchemaV1 } from "./input.js";
export { createRebunoFetch, rebunoFetch, type LlmRecord } from "./llm.js";
export { setLogger, type Logger } from "./log.js";
export { resource, type CheckpointPolicy, type Created, type ResourceDriver, type ResourceOptions } from "./resources.js";
export { step, type StepOptions } from "./step.js";
export { defineTool, wrapTool, type Tool, type ToolDefinition, type ToolOptions } from "./tool.js";
export type {
  AgentInfo, Approval, CoveragePoint, CoverageRanges, Decision, DecisionResource, Event, Execution, ExecutionPage, Resource,
  ResourceCoverage, ResourceRanges, Step, StreamDelta,
} from "./types.js";
export { isCovered } from "./types.js";

export const VERSION = "0.1.0";
