/**
 * Errors the SDK throws. Two families:
 *
 * - **Step outcomes and control flow**, inside a handler: `PolicyError`,
 *   `RateLimited`, `ToolError`, `Blocked`, `Terminated`, and
 *   `CheckpointUnavailable` from resource drivers.
 * - **API errors**, from `Client` and from agent requests the kernel
 *   refuses: `APIError` and one subclass per envelope `code`.
 *
 * `ExecutionFailedError` is thrown by `Client.run` when the execution it ran
 * ended without an output.
 *
 * `raiseForRefusal()` turns a kernel refusal that reached a provider SDK as a
 * synthetic HTTP response back into one of the first family.
 */

import type { Execution } from "./types.js";

export const REFUSAL_MARKER = "rebuno_refusal";

/** Base class of every error the SDK throws. */
export class RebunoError extends Error {
  constructor(message?: string, options?: ErrorOptions) {
    super(message, options);
    this.name = new.target.name;
  }
}

/**
 * The kernel denied a step: a policy rule, a human denial, an approval
 * timeout, or an `at_most_once` retry after an unknown outcome.
 */
export class PolicyError extends RebunoError {
  readonly reason: string;
  readonly ruleId: string | undefined;
  readonly stepId: string | undefined;
  constructor(reason: string, options: { ruleId?: string | undefined; stepId?: string | undefined; cause?: unknown } = {}) {
    super(reason, { cause: options.cause });
    this.reason = reason;
    this.ruleId = options.ruleId;
    this.stepId = options.stepId;
  }
}

/** A rate limit refused a step. Nothing was recorded: the same call made later gets the same step id. */
export class RateLimited extends RebunoError {
  readonly reason: string;
  readonly retryAfterMs: number | undefined;
  readonly ruleId: string | undefined;
  constructor(reason: string, options: { retryAfterMs?: number | undefined; ruleId?: string | undefined; cause?: unknown } = {}) {
    super(options.retryAfterMs === undefined ? reason : `${reason} (retry after ${options.retryAfterMs} ms)`, { cause: options.cause });
    this.reason = reason;
    this.retryAfterMs = options.retryAfterMs;
    this.ruleId = options.ruleId;
  }
}

/** A tool, local step or LLM call failed: live (its body threw) or on replay (its recorded outcome is an error). */
export class ToolError extends RebunoError {
  readonly toolId: string;
  readonly error: unknown;
  readonly stepId: string | undefined;
  constructor(toolId: string, message: string, options: { error?: unknown; stepId?: string | undefined; cause?: unknown } = {}) {
    super(message, { cause: options.cause });
    this.toolId = toolId;
    this.error = options.error;
    this.stepId = options.stepId;
  }
}

/**
 * Control flow: a step awaits approval, or the execution is blocked by one.
 * The dispatch unwinds; the kernel dispatches again once the approval is decided.
 */
export class Blocked extends RebunoError {
  readonly approvalId: string | undefined;
  readonly stepId: string | undefined;
  constructor(message = "execution is blocked awaiting approval", options: { approvalId?: string | undefined; stepId?: string | undefined } = {}) {
    super(message);
    this.approvalId = options.approvalId;
    this.stepId = options.stepId;
  }
}

/**
 * Control flow: this dispatch must stop. `reason` is `execution_terminal`
 * (completed, failed or cancelled), `lease_superseded` (a newer attempt owns
 * the execution), `abandoned` (the kernel was unreachable for a whole lease,
 * or did not record a step outcome), `outcome_conflict` (another run of a
 * step recorded a different outcome than the one this handler went on with;
 * the next attempt replays it) or `closed` (the agent is shutting down).
 */
export class Terminated extends RebunoError {
  readonly reason: string;
  constructor(reason = "execution_terminal") {
    super(reason);
    this.reason = reason;
  }
}

/**
 * Thrown by a resource driver's `create(checkpointRef)` when the checkpoint
 * is missing, expired or damaged. `resource()` then fails the execution at
 * once with `checkpoint_unavailable: resource "<key>": <message>`.
 */
export class CheckpointUnavailable extends RebunoError {}

/**
 * `Client.run` ran an execution that ended `failed` or `cancelled`.
 * `execution` is the execution as it ended; `status` and `reason` (its
 * `failureReason`: the agent's text, `dispatch_exhausted`,
 * `client_cancelled`, `deadline_exceeded`, ...) are copied from it.
 */
export class ExecutionFailedError extends RebunoError {
  readonly execution: Execution;
  readonly executionId: string;
  readonly status: string;
  readonly reason: string | undefined;
  constructor(execution: Execution) {
    super(`execution ${execution.id} ${execution.status}` + (execution.failureReason ? `: ${execution.failureReason}` : ""));
    this.execution = execution;
    this.executionId = execution.id;
    this.status = execution.status;
    this.reason = execution.failureReason;
  }
}

// ------------------------------------------------------------- API errors

/** A non-2xx answer of the kernel, typed by the envelope's `code`. */
export class APIError extends RebunoError {
  static readonly code: string = "";
  readonly status: number;
  readonly code: string;
  readonly details: Record<string, unknown>;
  readonly body: string;
  constructor(status: number, code: string, message: string, details?: Record<string, unknown>) {
    super(`${status} ${code}: ${message}`);
    this.status = status;
    this.code = code;
    this.body = message;
    this.details = details ?? {};
  }
}

export class ValidationError extends APIError { static override readonly code = "validation_error"; }
export class UnauthorizedError extends APIError { static override readonly code = "unauthorized"; }
export class ForbiddenError extends APIError { static override readonly code = "forbidden"; }
export class NotFoundError extends APIError { static override readonly code = "not_found"; }
export class MethodNotAllowedError extends APIError { static override readonly code = "method_not_allowed"; }
export class ConflictError extends APIError { static override readonly code = "conflict"; }
export class ExecutionTerminalError extends APIError { static override readonly code = "execution_terminal"; }
export class LeaseSupersededError extends APIError { static override readonly code = "lease_superseded"; }
export class PayloadTooLargeError extends APIError { static override readonly code = "payload_too_large"; }
export class UnsupportedMediaTypeError extends APIError { static override readonly code = "unsupported_media_type"; }
export class InternalServerError extends APIError { static override readonly code = "internal_error"; }
export class UnavailableError extends APIError { static override readonly code = "unavailable"; }

type APIErrorClass = typeof APIError;

const BY_CODE = new Map<string, APIErrorClass>(
  [ValidationError, UnauthorizedError, ForbiddenError, NotFoundError, MethodNotAllowedError, ConflictError,
    ExecutionTerminalError, LeaseSupersededError, PayloadTooLargeError, UnsupportedMediaTypeError,
    InternalServerError, UnavailableError].map((c) => [c.code, c]),
);

const BY_STATUS = new Map<number, APIErrorClass>([
  [400, ValidationError], [401, UnauthorizedError], [403, ForbiddenError], [404, NotFoundError],
  [405, MethodNotAllowedError], [409, ConflictError], [413, PayloadTooLargeError],
  [415, UnsupportedMediaTypeError], [500, InternalServerError], [503, UnavailableError],
]);

/** The envelope `code` of an error body, or "". */
export function errorCode(body: string): string {
  try {
    const data = JSON.parse(body) as unknown;
    if (isRecord(data) && typeof data.code === "string") return data.code;
  } catch {
    // not JSON
  }
  return "";
}

/**
 * The typed error of a non-2xx answer. Clients branch on `code`; the status
 * picks a class only when the body has none.
 */
export function apiError(status: number, body: string): APIError {
  let code = "";
  let message = "";
  let details: Record<string, unknown> | undefined;
  try {
    const data = JSON.parse(body) as unknown;
    if (isRecord(data)) {
      if (typeof data.code === "string") code = data.code;
      if (typeof data.message === "string") message = data.message;
      if (isRecord(data.details)) details = data.details;
    }
  } catch {
    // not JSON: the text itself is the message
  }
  if (!message) message = body.slice(0, 200) || `HTTP ${status}`;
  const cls = BY_CODE.get(code) ?? BY_STATUS.get(status) ?? APIError;
  return new cls(status, code || cls.code, message, details);
}

export function isRecord(v: unknown): v is Record<string, unknown> {
  return typeof v === "object" && v !== null && !Array.isArray(v);
}

// ----------------------------------------------- refusals through providers

/** The message of a synthetic refusal: `rebuno_refusal: <code>[ reason=<reason>]`. */
export function refusalMessage(code: string, reason?: string | null): string {
  return `${REFUSAL_MARKER}: ${code}` + (reason ? ` reason=${reason}` : "");
}

interface Refusal {
  code: string;
  reason?: string | undefined;
  message?: string | undefined;
  ruleId?: string | undefined;
  retryAfterMs?: number | undefined;
}

const MARKER_TEXT = /rebuno_refusal: ([a-z_]+)(?: reason=(.*))?/;

function fromPayload(payload: unknown): Refusal | undefined {
  if (typeof payload === "string") {
    try {
      return fromPayload(JSON.parse(payload));
    } catch {
      return undefined;
    }
  }
  if (!isRecord(payload)) return undefined;
  if (payload.type === REFUSAL_MARKER && typeof payload.code === "string") {
    return {
      code: payload.code,
      reason: typeof payload.reason === "string" ? payload.reason : undefined,
      message: typeof payload.message === "string" ? payload.message : undefined,
      ruleId: typeof payload.rule_id === "string" ? payload.rule_id : undefined,
      retryAfterMs: typeof payload.retry_after_ms === "number" ? payload.retry_after_ms : undefined,
    };
  }
  return fromPayload(payload.error);
}

function fromText(text: string): Refusal | undefined {
  const m = MARKER_TEXT.exec(text);
  if (!m) return undefined;
  // The message may be embedded in a larger text: cut the reason at a quote.
  const reason = m[2]?.split(/['"]/, 1)[0]?.replace(/[ ,}]+$/, "");
  return { code: m[1]!, reason: reason || undefined };
}

function headerValue(headers: unknown, name: string): string | undefined {
  if (!headers || typeof headers !== "object") return undefined;
  if (typeof (headers as Headers).get === "function") return (headers as Headers).get(name) ?? undefined;
  for (const [k, v] of Object.entries(headers)) if (k.toLowerCase() === name && typeof v === "string") return v;
  return undefined;
}

function findRefusal(err: unknown, seen: Set<unknown>, depth: number): Refusal | undefined {
  if (err === null || err === undefined || seen.has(err) || depth > 8) return undefined;
  seen.add(err);
  if (typeof err === "string") return fromText(err);
  if (typeof err !== "object") return undefined;
  const e = err as Record<string, unknown>;
  // Provider errors: the AI SDK's APICallError (`responseBody`, `data`,
  // `responseHeaders`), the openai client's APIError (`error`, `headers`).
  // The raw body first: parsed copies may have dropped fields such as rule_id.
  let found = fromPayload(e.responseBody) ?? fromPayload(e.body) ?? fromPayload(e.error) ?? fromPayload(e.data);
  if (!found) {
    const header = headerValue(e.responseHeaders, "rebuno-refusal") ?? headerValue(e.headers, "rebuno-refusal");
    if (header) found = { code: header };
  }
  if (!found && typeof e.message === "string") found = fromText(e.message);
  if (found) return found;
  const nested: unknown[] = [e.cause, e.lastError];
  if (Array.isArray(e.errors)) nested.push(...(e.errors as unknown[]));
  for (const inner of nested) {
    const f = findRefusal(inner, seen, depth + 1);
    if (f) return f;
  }
  return undefined;
}

/** The SDK error for a refusal code (a decision or an error code). */
export function refusalError(code: string, reason?: string, ruleId?: string, retryAfterMs?: number, cause?: unknown): RebunoError {
  switch (code) {
    case "denied":
      return new PolicyError(reason || "policy_denied", { ruleId, cause });
    case "rate_limited":
      return new RateLimited(reason || "rate_limit_exceeded", { retryAfterMs, ruleId, cause });
    case "blocked":
    case "execution_blocked":
      return new Blocked();
    case "lease_superseded":
      return new Terminated("lease_superseded");
    default:
      return new Terminated("execution_terminal");
  }
}

/** Finds the control-flow signal already recorded on the running execution, if any. */
let stickySignal: () => Blocked | Terminated | undefined = () => undefined;

/** @internal The execution module installs the lookup of the sticky signal. */
export function installSignalLookup(lookup: () => Blocked | Terminated | undefined): void {
  stickySignal = lookup;
}

/**
 * Re-throw a kernel refusal wrapped in a provider SDK's error as the SDK's
 * own error; return normally when `err` carries none.
 *
 * `rebunoFetch` answers denials, approvals, rate limits and terminal or
 * superseded executions with a synthetic 403/429 whose message starts with
 * `rebuno_refusal`. Provider clients turn it into their own error; this finds
 * the marker in the error, its body, its headers or its causes. `Blocked` and
 * `Terminated` already recorded on the running execution are thrown as
 * recorded.
 *
 *     try { await generateText(...) } catch (e) { raiseForRefusal(e); throw e; }
 */
export function raiseForRefusal(err: unknown): void {
  if (err instanceof RebunoError && !(err instanceof APIError)) {
    if (err instanceof PolicyError || err instanceof RateLimited || err instanceof Blocked || err instanceof Terminated) throw err;
    return;
  }
  const found = findRefusal(err, new Set(), 0);
  if (!found) return;
  let reason = found.reason;
  if (!reason && found.message) reason = fromText(found.message)?.reason;
  if (["blocked", "execution_blocked", "execution_terminal", "lease_superseded"].includes(found.code)) {
    const signal = stickySignal();
    if (signal) throw signal;
  }
  throw refusalError(found.code, reason, found.ruleId, found.retryAfterMs, err);
}
