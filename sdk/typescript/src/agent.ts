/**
 * `Agent`: serves the kernel's signed webhook and runs the handler once per
 * dispatch.
 *
 * 1. Read at most {@link MAX_WEBHOOK_BODY} bytes (`413` beyond, checked on
 *    `Content-Length` before reading), then verify `Rebuno-Signature`
 *    (`401` when missing or wrong), and only then parse the JSON.
 * 2. Answer at once (`200`) and run the handler in the background.
 * 3. Stop a handler still running for the execution when a newer webhook
 *    supersedes it; ignore repeats and attempts the kernel has moved past.
 * 4. Skip terminal executions.
 * 5. Fetch the input, validate it (with a schema, when given), and run the
 *    handler inside the execution context, heartbeating every
 *    `min(30 s, lease / 3)`.
 *
 * The handler's outcome maps onto the execution: a return value completes
 * it; `Blocked` and `Terminated` leave the kernel's state standing; anything
 * else fails it with the reason {@link failureReason} gives.
 */

import http from "node:http";
import type { AddressInfo } from "node:net";
import { setTimeout as sleep } from "node:timers/promises";
import { type DispatchKey, DispatchTracker } from "./dispatch.js";
import { encodeResult } from "./effects.js";
import { APIError, Blocked, isRecord, PolicyError, raiseForRefusal, RateLimited, RebunoError, Terminated, ToolError } from "./errors.js";
import { ExecutionContext, runInContext } from "./execution.js";
import { NotJsonError, typeName } from "./identity.js";
import { bindInput, BindingError, inputJsonSchema, isStandardSchema, type SchemaOutput, type StandardSchemaV1 } from "./input.js";
import { KernelClient, type Lease, LeaseClock } from "./kernel.js";
import { log } from "./log.js";
import { completionCaptures } from "./resources.js";
import { verifyWebhook } from "./signing.js";

export const DEFAULT_BASE_URL = "http://localhost:8080";
export const DEFAULT_LEASE_TIMEOUT_SECONDS = 120;
export const DEFAULT_KERNEL_TIMEOUT_MS = 35_000;
/** The largest webhook body read; the kernel's are about 200 bytes. */
export const MAX_WEBHOOK_BODY = 64 * 1024;
/** How much of a refused body is read and dropped before the agent stops reading it. */
const DISCARD_MAX = 1024 * 1024;
/**
 * How long a connection whose refused body went past DISCARD_MAX stays open,
 * half-closed and unread, before it is dropped. Dropping it at once resets it,
 * and a reset can discard the 413 from the client's receive buffer before the
 * client has read it; a client that reads its answer closes well before this.
 */
const LINGER_MS = 5_000;

const UUID = /^[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}$/;

/** At least every `min(30 s, lease / 3)`. */
export function heartbeatIntervalMs(leaseSeconds: number): number {
  return Math.max(50, Math.min(30_000, (leaseSeconds * 1000) / 3));
}

/** How long a superseding handler waits for the old one: `min(10 s, lease / 3)`. */
export function supersedeWaitMs(leaseSeconds: number): number {
  return Math.min(10_000, (leaseSeconds * 1000) / 3);
}

/**
 * The execution's failure reason for an error escaping the handler, or
 * undefined for a control-flow signal (the kernel's state stands).
 */
export function failureReason(err: unknown): string | undefined {
  if (err instanceof Blocked || err instanceof Terminated) return undefined;
  if (err instanceof PolicyError) return `policy_denied: ${err.reason}`;
  if (err instanceof RateLimited) return `rate_limited: ${err.reason}`;
  if (err instanceof ToolError) return `tool_error: ${err.toolId}: ${err.message}`;
  return `agent_error: ${typeName(err)}: ${err instanceof Error ? err.message : String(err)}`;
}

export interface AgentOptions {
  /** The agent's secret; default `REBUNO_AGENT_SECRET`. */
  secret?: string | undefined;
  /** The kernel's URL; default `REBUNO_URL`, else `http://localhost:8080`. */
  baseUrl?: string | undefined;
  /** Where the webhook is served; default `/webhook`. */
  webhookPath?: string | undefined;
  /** Bound on each agent → kernel request, in milliseconds; default 35,000. */
  kernelTimeout?: number | undefined;
}

export interface ServeOptions {
  port: number;
  /** Default `127.0.0.1`. */
  host?: string | undefined;
  /** Close the agent on SIGINT and SIGTERM, then exit; default true. */
  handleSignals?: boolean | undefined;
}

export interface HandlerOptions<S extends StandardSchemaV1 | undefined = undefined> {
  /**
   * A Standard Schema (zod, valibot, ...) the input must satisfy. With one,
   * the input must be a JSON object (`null` counts as `{}`), and a failure
   * fails the execution with `input validation failed: ...`.
   */
  input?: S;
  /** Published as the agent's description. */
  description?: string | undefined;
}

export type Handler<Input = any, Output = unknown> = (input: Input) => Output | Promise<Output>; // eslint-disable-line @typescript-eslint/no-explicit-any

interface Run {
  ctx: ExecutionContext;
  key: DispatchKey;
  done: boolean;
  promise: Promise<void>;
}

const json = (res: http.ServerResponse, status: number, body: unknown, headers: Record<string, string> = {}): void => {
  const text = JSON.stringify(body);
  res.writeHead(status, { "Content-Type": "application/json", "Content-Length": Buffer.byteLength(text), ...headers });
  res.end(text);
};

/** A Rebuno agent: `await new Agent("coder").serve({ port: 5000 }, process)`. */
export class Agent {
  readonly agentId: string;
  readonly baseUrl: string;
  readonly webhookPath: string;
  readonly kernelTimeout: number;
  private readonly secret: string;
  private readonly kernel: KernelClient;
  private readonly tracker = new DispatchTracker();
  private readonly runs = new Map<string, Run>();
  private readonly pending = new Set<Promise<void>>();
  private handler: Handler | undefined;
  private schema: StandardSchemaV1 | undefined;
  private description: string | undefined;
  private closing = false;
  private metadataPublished = false;
  private metadataTry: Promise<void> | undefined;
  private server: http.Server | undefined;

  constructor(agentId: string, options: AgentOptions = {}) {
    if (typeof agentId !== "string" || !agentId) throw new TypeError("agentId must be a non-empty string");
    const secret = options.secret ?? process.env.REBUNO_AGENT_SECRET;
    if (!secret) throw new TypeError("an agent secret is required: pass secret or set REBUNO_AGENT_SECRET");
    const webhookPath = options.webhookPath ?? "/webhook";
    if (!webhookPath.startsWith("/")) throw new TypeError("webhookPath must start with '/'");
    const kernelTimeout = options.kernelTimeout ?? DEFAULT_KERNEL_TIMEOUT_MS;
    if (!(kernelTimeout > 0)) throw new RangeError("kernelTimeout must be positive (milliseconds)");
    this.agentId = agentId;
    this.baseUrl = (options.baseUrl || process.env.REBUNO_URL || DEFAULT_BASE_URL).replace(/\/+$/, "");
    this.webhookPath = webhookPath;
    this.kernelTimeout = kernelTimeout;
    this.secret = secret;
    this.kernel = new KernelClient(this.baseUrl, agentId, secret, kernelTimeout);
  }

  // ------------------------------------------------------------- public

  /** Attach the handler (and optionally its input schema); returns the handler unchanged. */
  bind<S extends StandardSchemaV1 | undefined, H extends Handler<S extends StandardSchemaV1 ? SchemaOutput<S> : any>>( // eslint-disable-line @typescript-eslint/no-explicit-any
    handler: H, options: HandlerOptions<S> = {}): H {
    if (typeof handler !== "function") throw new TypeError("the handler must be a function");
    if (options.input !== undefined && !isStandardSchema(options.input)) throw new TypeError("input must be a Standard Schema (zod, valibot, ...)");
    this.handler = handler;
    this.schema = options.input;
    this.description = options.description;
    return handler;
  }

  /**
   * Bind the handler and serve the webhook on `host:port` (default host
   * `127.0.0.1`). Resolves once listening, with the server.
   */
  async serve<S extends StandardSchemaV1 | undefined = undefined>(listen: ServeOptions,
    handler?: Handler<S extends StandardSchemaV1 ? SchemaOutput<S> : any>, options: HandlerOptions<S> = {}): Promise<http.Server> { // eslint-disable-line @typescript-eslint/no-explicit-any
    if (handler !== undefined) this.bind(handler, options);
    if (this.handler === undefined) throw new TypeError("serve() needs a handler");
    const server = http.createServer(this.requestListener);
    server.keepAliveTimeout = 65_000;
    this.server = server;
    await new Promise<void>((resolve, reject) => {
      server.once("error", reject);
      server.listen(listen.port, listen.host ?? "127.0.0.1", () => {
        server.off("error", reject);
        resolve();
      });
    });
    if (listen.handleSignals ?? true) {
      const stop = (signal: NodeJS.Signals): void => {
        log.info(`rebuno: ${signal}: closing agent ${this.agentId}`);
        void this.close().finally(() => process.exit(0));
      };
      process.once("SIGINT", stop);
      process.once("SIGTERM", stop);
    }
    this.metadataTry = this.publishMetadata();
    return server;
  }

  /** The address the agent serves on, after `serve()`. */
  get address(): AddressInfo | undefined {
    const a = this.server?.address();
    return a && typeof a === "object" ? a : undefined;
  }

  /**
   * A node:http request listener serving the webhook, to mount the agent in
   * your own server (`http.createServer(agent.requestListener)`). Bind the
   * handler first.
   */
  readonly requestListener = (req: http.IncomingMessage, res: http.ServerResponse): void => {
    this.webhook(req, res).catch((e: unknown) => {
      log.error("rebuno: webhook handling failed", e);
      if (!res.headersSent) json(res, 500, { code: "internal_error", message: "internal error" });
    });
  };

  /** Wait for every in-flight handler to finish. */
  async join(): Promise<void> {
    while (this.pending.size) await Promise.allSettled([...this.pending]);
  }

  /**
   * Stop in-flight handlers without reporting anything for them (their
   * leases lapse and the kernel dispatches again), stop serving, and close
   * the kernel client.
   */
  async close(): Promise<void> {
    this.closing = true;
    try {
      for (const run of this.runs.values()) run.ctx.stop("closed");
      await this.join();
      const server = this.server;
      this.server = undefined;
      if (server) {
        server.closeAllConnections();
        await new Promise<void>((resolve) => server.close(() => resolve()));
      }
    } finally {
      this.kernel.close();
      this.closing = false;
    }
  }

  /** Execution id → (dispatch id, attempt) of each handler running now. */
  get running(): Map<string, { dispatchId: string; attempt: number | undefined }> {
    const out = new Map<string, { dispatchId: string; attempt: number | undefined }>();
    for (const [id, run] of this.runs) if (!run.done) out.set(id, { ...run.key });
    return out;
  }

  // ------------------------------------------------------------ webhook

  private async webhook(req: http.IncomingMessage, res: http.ServerResponse): Promise<void> {
    const path = (req.url ?? "").split("?", 1)[0];
    if (path !== this.webhookPath) return json(res, 404, { code: "not_found", message: "route not found" });
    if (req.method !== "POST") return json(res, 405, { code: "method_not_allowed", message: "method not allowed" }, { Allow: "POST" });
    const body = await readBounded(req, res);
    if (body === undefined) return;
    const signatures = req.headersDistinct["rebuno-signature"] ?? [];
    if (signatures.length !== 1 || !verifyWebhook(this.secret, body, signatures[0])) {
      return json(res, 401, { code: "unauthorized", message: "unauthorized" });
    }
    let data: unknown;
    try {
      data = JSON.parse(body.toString("utf8"));
    } catch {
      data = undefined;
    }
    if (!isRecord(data)) return json(res, 400, { code: "validation_error", message: "body must be a JSON object" });
    const { execution_id: executionId, dispatch_id: dispatchId, dispatch_attempt: rawAttempt, lease_timeout_seconds: rawLease } = data;
    if (typeof executionId !== "string" || !UUID.test(executionId) || typeof dispatchId !== "string" || !UUID.test(dispatchId)) {
      return json(res, 400, { code: "validation_error", message: "execution_id and dispatch_id are required" });
    }
    const attempt = Number.isInteger(rawAttempt) && (rawAttempt as number) >= 1 ? (rawAttempt as number) : undefined;
    const leaseSeconds = typeof rawLease === "number" && rawLease > 0 ? rawLease : DEFAULT_LEASE_TIMEOUT_SECONDS;
    if (this.handler === undefined || this.closing) {
      // Not ready: a failed delivery is retried by the kernel.
      return json(res, 503, { code: "unavailable", message: "agent has no handler" });
    }
    const eid = executionId.toLowerCase();
    const key: DispatchKey = { dispatchId: dispatchId.toLowerCase(), attempt };
    if (!this.tracker.offer(eid, key)) {
      log.debug(`rebuno: ignoring webhook ${key.dispatchId} attempt ${String(attempt)} of ${eid} (not newer)`);
      return json(res, 200, { status: "ignored" });
    }
    this.start(eid, key, leaseSeconds);
    if (!this.metadataPublished && this.metadataTry === undefined) this.metadataTry = this.publishMetadata();
    json(res, 200, { status: "accepted" });
  }

  /**
   * Publish the handler's description and input schema once per process: at
   * start-up, and again on the first webhook, which proves that the agent is
   * registered by then.
   */
  private async publishMetadata(): Promise<void> {
    if (this.metadataPublished || (this.description === undefined && this.schema === undefined)) return;
    try {
      await this.kernel.putMetadata({ description: this.description, inputSchema: inputJsonSchema(this.schema) });
      this.metadataPublished = true;
    } catch (e) {
      log.debug(`rebuno: could not publish agent metadata: ${(e as Error).message}`);
    } finally {
      this.metadataTry = undefined;
    }
  }

  // ----------------------------------------------------------- dispatch

  private start(executionId: string, key: DispatchKey, leaseSeconds: number): void {
    const previous = this.runs.get(executionId);
    const lease: Lease = { dispatchId: key.dispatchId, attempt: key.attempt, clock: new LeaseClock(leaseSeconds * 1000) };
    const ctx = new ExecutionContext({
      executionId, agentId: this.agentId, dispatchId: key.dispatchId, dispatchAttempt: key.attempt,
      leaseTimeoutSeconds: leaseSeconds, kernel: this.kernel, lease,
    });
    if (previous && !previous.done) {
      log.info(`rebuno: dispatch ${key.dispatchId} attempt ${String(key.attempt)} supersedes the running handler of ${executionId}`);
      previous.ctx.stop("lease_superseded");
    }
    const run: Run = { ctx, key, done: false, promise: Promise.resolve() };
    run.promise = this.dispatch(ctx, previous).finally(() => {
      run.done = true;
      this.pending.delete(run.promise);
      if (this.runs.get(executionId) === run) this.runs.delete(executionId);
      this.tracker.finished(executionId, key, leaseSeconds * 1000);
    });
    this.runs.set(executionId, run);
    this.pending.add(run.promise);
  }

  private async dispatch(ctx: ExecutionContext, previous: Run | undefined): Promise<void> {
    const stopBeating = this.heartbeat(ctx);
    try {
      if (previous && !previous.done) {
        const waited = new AbortController();
        await Promise.race([previous.promise, sleep(supersedeWaitMs(ctx.leaseTimeoutSeconds), undefined, { signal: waited.signal }).catch(() => undefined)]);
        waited.abort();
      }
      await runInContext(ctx, () => this.execute(ctx));
    } catch (e) {
      if (e instanceof Terminated) log.info(`rebuno: dispatch ${ctx.dispatchId} of ${ctx.executionId} stopped: ${e.reason}`);
      else if (e instanceof APIError) log.error(`rebuno: dispatch ${ctx.dispatchId} of ${ctx.executionId}: kernel refused a request: ${e.message}`);
      else log.error(`rebuno: dispatch ${ctx.dispatchId} of ${ctx.executionId} crashed`, e);
    } finally {
      // A finished step's outcome still waiting for a carrier is sent
      // alone: whatever ended the dispatch, its effect ran.
      await ctx.outbox.flush();
      stopBeating();
    }
  }

  /** Heartbeat while the handler runs; returns the function that stops it. */
  private heartbeat(ctx: ExecutionContext): () => void {
    const interval = heartbeatIntervalMs(ctx.leaseTimeoutSeconds);
    let timer: NodeJS.Timeout | undefined;
    let stopped = false;
    const beat = async (): Promise<void> => {
      const started = Date.now();
      try {
        await this.kernel.heartbeat(ctx.executionId, ctx.lease);
      } catch (e) {
        if (e instanceof Terminated) {
          log.info(`rebuno: heartbeat of ${ctx.executionId}: ${e.reason}; stopping the handler`);
          ctx.stop(e.reason);
          return;
        }
        log.warn(`rebuno: heartbeat of ${ctx.executionId} failed: ${(e as Error).message}`);
      }
      // Measured from the start of this beat.
      if (!stopped) timer = setTimeout(() => void beat(), Math.max(0, interval - (Date.now() - started)));
    };
    timer = setTimeout(() => void beat(), interval);
    return () => {
      stopped = true;
      clearTimeout(timer);
    };
  }

  private async execute(ctx: ExecutionContext): Promise<void> {
    const handler = this.handler!;
    const execution = await this.kernel.getExecution(ctx.executionId, ctx.lease);
    if (execution.terminal) {
      log.debug(`rebuno: execution ${ctx.executionId} is ${execution.status}; nothing to do`);
      return;
    }
    ctx.input = execution.input;
    // Tool calls and local steps run one at a time from the start when the
    // execution already has resources.
    ctx.resources.start(execution.resourceKeys);
    let arg: unknown;
    try {
      arg = await bindInput(this.schema, execution.input);
    } catch (e) {
      if (!(e instanceof BindingError)) throw e;
      await this.finish(ctx, { reason: e.reason });
      return;
    }
    let output: unknown;
    try {
      output = await handler(arg);
    } catch (e) {
      await this.handlerFailed(ctx, e);
      return;
    }
    if (ctx.signal !== undefined) return this.logSignal(ctx, ctx.signal);
    let text: string;
    try {
      text = encodeResult(output);
    } catch (e) {
      await this.finish(ctx, { reason: `output is not JSON-serializable: ${e instanceof NotJsonError ? e.typeName : typeName(output)}` });
      return;
    }
    // Completion captures of uncovered resources come before `complete`.
    await completionCaptures(ctx);
    if (ctx.signal !== undefined) return this.logSignal(ctx, ctx.signal);
    await this.finish(ctx, { outputJson: text });
  }

  private async handlerFailed(ctx: ExecutionContext, err: unknown): Promise<void> {
    // A swallowed or re-thrown Blocked/Terminated: the kernel's state stands.
    if (ctx.signal !== undefined) return this.logSignal(ctx, ctx.signal);
    let cause = err;
    try {
      raiseForRefusal(err);
    } catch (refusal) {
      cause = refusal;
    }
    const reason = failureReason(cause);
    if (reason === undefined) return this.logSignal(ctx, cause);
    if (!(cause instanceof RebunoError)) log.error(`rebuno: handler of ${ctx.executionId} threw`, cause);
    await this.finish(ctx, { reason });
  }

  private logSignal(ctx: ExecutionContext, signal: unknown): void {
    log.info(`rebuno: dispatch ${ctx.dispatchId} of ${ctx.executionId} ends on ${typeName(signal)}: ${(signal as Error).message}`);
  }

  private async finish(ctx: ExecutionContext, outcome: { outputJson: string } | { reason: string }): Promise<void> {
    const recorded = await ctx.finish(outcome);
    if (!recorded) log.info(`rebuno: execution ${ctx.executionId} was already terminal`);
  }
}

/**
 * Read a request body of at most MAX_WEBHOOK_BODY bytes. A larger body is
 * answered `413` before it is read whole (a too large `Content-Length`
 * before anything is read). The rest is discarded, not kept, so that the
 * client can read the answer. Past DISCARD_MAX the agent stops reading and
 * half-closes, so the client's writes stall instead of being reset, and
 * drops the connection after LINGER_MS.
 */
function readBounded(req: http.IncomingMessage, res: http.ServerResponse): Promise<Buffer | undefined> {
  return new Promise((resolve, reject) => {
    const refuse = (): void => {
      req.removeAllListeners("data");
      res.on("finish", () => {
        let discarded = 0;
        req.on("data", (chunk: Buffer) => {
          discarded += chunk.length;
          if (discarded > DISCARD_MAX) linger(req);
        });
      });
      json(res, 413, { code: "payload_too_large", message: "payload too large" });
      resolve(undefined);
    };
    const declared = req.headers["content-length"];
    if (declared !== undefined && Number(declared) > MAX_WEBHOOK_BODY) return refuse();
    const chunks: Buffer[] = [];
    let size = 0;
    req.on("data", (chunk: Buffer) => {
      size += chunk.length;
      if (size > MAX_WEBHOOK_BODY) return refuse();
      chunks.push(chunk);
    });
    req.on("end", () => resolve(Buffer.concat(chunks)));
    req.on("error", reject);
  });
}

/** Stop reading a refused body, half-close, and drop the connection after LINGER_MS. */
function linger(req: http.IncomingMessage): void {
  req.removeAllListeners("data");
  req.pause();
  const socket = req.socket;
  socket.end();
  const timer = setTimeout(() => socket.destroy(), LINGER_MS);
  timer.unref();
  socket.once("close", () => clearTimeout(timer));
}
