/**
 * The agent's signed client to the kernel.
 *
 * Every request is signed with a fresh `v1` signature. Requests made for a
 * dispatch carry `Rebuno-Dispatch-Id` and `Rebuno-Dispatch-Attempt`
 * (mutations only: the kernel ignores them on reads); submits carry
 * `Rebuno-Step-Occurrence` bound by `Rebuno-Occurrence-Signature`.
 * Transport failures and `503` are retried with jittered backoff until a
 * whole lease has passed since the last renewal; then the attempt is
 * abandoned (`Terminated("abandoned")`) without reporting anything.
 *
 * A submit, execution complete or fail may carry the outcome of an earlier
 * step (docs/protocol/steps.md §13) once the kernel has advertised the
 * extension, so that a step costs one round trip.
 *
 * It speaks node:http over keep-alive connections: this is the SDK's hot
 * path.
 */

import http from "node:http";
import https from "node:https";
import { performance } from "node:perf_hooks";
import { setTimeout as sleep } from "node:timers/promises";
import { apiError, errorCode, Terminated, type APIError } from "./errors.js";
import { log } from "./log.js";
import { signOccurrence, signV1 } from "./signing.js";
import { decisionFromWire, executionFromWire, resourceFromWire, type Decision, type Execution, type Resource } from "./types.js";

export const BACKOFF_START_MS = 100;
export const BACKOFF_MAX_MS = 5_000;
/** Retry budget of requests made outside any dispatch (metadata at start-up). */
export const NO_LEASE_BUDGET_MS = 10_000;

/**
 * When the current attempt's lease was last renewed. The SDK cannot see the
 * kernel's clock; it uses the send time of the last request whose answer
 * renewed the lease, which is never later than the kernel's renewal.
 */
export class LeaseClock {
  renewedAt = performance.now();
  constructor(readonly leaseTimeoutMs: number) {}
  renewed(at: number): void {
    if (at > this.renewedAt) this.renewedAt = at;
  }
  get deadline(): number {
    return this.renewedAt + this.leaseTimeoutMs;
  }
}

/** What an agent request carries of its dispatch. */
export interface Lease {
  dispatchId: string;
  attempt: number | undefined;
  clock: LeaseClock;
  /**
   * Whether the kernel echoes `Rebuno-Step-Occurrence`, learnt from the first
   * submit answer that carries a step id; undefined until known.
   */
  occurrenceSupported?: boolean | undefined;
  /** Whether the kernel accepts carried outcomes, learnt from the first submit answer. */
  carriedOutcomes?: boolean | undefined;
}

/** The extension token of docs/protocol/steps.md §13, advertised in `Rebuno-Extensions`. */
export const CARRIED_OUTCOME = "carried-outcome";

/** A step's outcome as reported: its value as JSON text and the captures taken after its body. */
export class Outcome {
  constructor(
    readonly stepId: string,
    readonly succeeded: boolean,
    readonly valueJson: string,
    readonly captures: readonly Capture[] = [],
    readonly captureFailures: readonly CaptureFailure[] = [],
  ) {}

  /** The body members of a step complete or fail, without braces. */
  members(): string {
    let text = `${this.succeeded ? '"result":' : '"error":'}${this.valueJson}`;
    if (this.captures.length) text += `,"captures":${JSON.stringify(this.captures)}`;
    if (this.captureFailures.length) text += `,"capture_failures":${JSON.stringify(this.captureFailures)}`;
    return text;
  }

  /** `,"outcome":{…}`: the member a carrier appends to its body. */
  carried(): string {
    return `,"outcome":{"step_id":"${this.stepId}",${this.members()}}`;
  }
}

/** Which failures a request may be re-sent after. */
export type Retry = "never" | "always" | "submit";

export interface KernelResponse {
  status: number;
  headers: http.IncomingHttpHeaders;
  body: string;
  sentAt: number;
}

const ok = (r: KernelResponse): boolean => r.status >= 200 && r.status < 300;

// Errors raised before the request could reach the kernel: re-sending is safe.
const CONNECT_ERRORS = new Set(["ECONNREFUSED", "ENOTFOUND", "EAI_AGAIN", "EHOSTUNREACH", "ENETUNREACH", "EADDRNOTAVAIL"]);

class TransportError extends Error {
  constructor(message: string, readonly connectPhase: boolean, options?: ErrorOptions) {
    super(message, options);
  }
}

export interface RequestOptions {
  body?: string | undefined;
  lease?: Lease | undefined;
  occurrence?: number | undefined;
  retry?: Retry | undefined;
}

/** Signed HTTP client of one agent. */
export class KernelClient {
  private readonly origin: URL;
  private readonly basePath: string;
  private readonly agent: http.Agent;
  private readonly transport: typeof http | typeof https;

  constructor(baseUrl: string, readonly agentId: string, private readonly secret: string, private readonly timeoutMs: number) {
    this.origin = new URL(baseUrl);
    this.basePath = this.origin.pathname.replace(/\/+$/, "");
    this.transport = this.origin.protocol === "https:" ? https : http;
    this.agent = new this.transport.Agent({ keepAlive: true, maxSockets: Infinity, scheduling: "lifo" });
  }

  close(): void {
    this.agent.destroy();
  }

  private send(method: string, path: string, body: Buffer, lease: Lease | undefined, occurrence: number | undefined): Promise<KernelResponse> {
    const target = this.basePath + path;
    const timestamp = String(Math.floor(Date.now() / 1000));
    const headers: Record<string, string> = {
      "Content-Type": "application/json",
      "Content-Length": String(body.length),
      "Rebuno-Agent-Id": this.agentId,
      "Rebuno-Timestamp": timestamp,
    };
    let dispatchId: string | null = null;
    let attempt: string | null = null;
    if (lease && method !== "GET") {
      dispatchId = lease.dispatchId;
      headers["Rebuno-Dispatch-Id"] = dispatchId;
      if (lease.attempt !== undefined) {
        attempt = String(lease.attempt);
        headers["Rebuno-Dispatch-Attempt"] = attempt;
      }
    }
    const signature = signV1(this.secret, method, target, timestamp, dispatchId, attempt, body);
    headers["Rebuno-Signature"] = signature;
    if (occurrence !== undefined && dispatchId !== null) {
      const value = String(occurrence);
      headers["Rebuno-Step-Occurrence"] = value;
      headers["Rebuno-Occurrence-Signature"] = signOccurrence(this.secret, signature, value);
    }
    const sentAt = performance.now();
    return new Promise((resolve, reject) => {
      let settled = false;
      const req = this.transport.request(
        { protocol: this.origin.protocol, hostname: this.origin.hostname, port: this.origin.port, method, path: target, headers, agent: this.agent },
        (res) => {
          const chunks: Buffer[] = [];
          res.on("data", (c: Buffer) => chunks.push(c));
          res.on("end", () => {
            clearTimeout(timer);
            settled = true;
            resolve({ status: res.statusCode ?? 0, headers: res.headers, body: Buffer.concat(chunks).toString("utf8"), sentAt });
          });
          res.on("error", (e) => fail(e, false));
        },
      );
      const fail = (e: Error & { code?: string }, connect: boolean): void => {
        if (settled) return;
        settled = true;
        clearTimeout(timer);
        req.destroy();
        reject(new TransportError(`${method} ${path}: ${e.message}`, connect || CONNECT_ERRORS.has(e.code ?? ""), { cause: e }));
      };
      const timer = setTimeout(() => fail(new Error(`no answer within ${this.timeoutMs} ms`), false), this.timeoutMs);
      req.on("error", (e) => fail(e, false));
      req.end(body);
    });
  }

  /**
   * Send one signed request, retrying transport failures and `503`.
   * Returns every other answer except `409 lease_superseded`, which throws
   * `Terminated("lease_superseded")`. Throws `Terminated("abandoned")` when
   * retrying must stop.
   */
  async request(method: string, path: string, options: RequestOptions = {}): Promise<KernelResponse> {
    const { lease, occurrence, retry = "always" } = options;
    const body = Buffer.from(options.body ?? "", "utf8");
    const started = performance.now();
    let delay = BACKOFF_START_MS;
    for (;;) {
      let failure: Error;
      let connectPhase = false;
      try {
        const resp = await this.send(method, path, body, lease, occurrence);
        if (resp.status === 409 && errorCode(resp.body) === "lease_superseded") throw new Terminated("lease_superseded");
        if (resp.status !== 503) return resp;
        failure = apiError(503, resp.body);
      } catch (e) {
        if (!(e instanceof TransportError)) throw e;
        failure = e;
        connectPhase = e.connectPhase;
      }
      if (retry === "never") {
        if (failure instanceof TransportError) throw new Terminated("abandoned");
        throw failure;
      }
      if (retry === "submit" && !connectPhase && lease?.occurrenceSupported !== true) {
        // The answer may be lost after the kernel recorded the submit; a
        // re-send without a trusted occurrence could make a second step.
        log.warn(`rebuno: submit answer lost (${failure.message}); abandoning the attempt`);
        throw new Terminated("abandoned");
      }
      const deadline = lease ? lease.clock.deadline : started + NO_LEASE_BUDGET_MS;
      const remaining = deadline - performance.now();
      if (remaining <= 0) {
        log.warn(`rebuno: kernel unreachable for a whole lease (${failure.message}); abandoning the attempt`);
        throw new Terminated("abandoned");
      }
      // Jittered exponential backoff; the last try happens at the deadline.
      const wait = Math.min(BACKOFF_MAX_MS, delay * (0.5 + Math.random() / 2), remaining);
      log.info(`rebuno: ${method} ${path} failed (${failure.message}); retrying in ${Math.round(wait)} ms`);
      await sleep(wait);
      delay = Math.min(BACKOFF_MAX_MS, delay * 2);
    }
  }

  private json(resp: KernelResponse): unknown {
    if (!ok(resp)) throw apiError(resp.status, resp.body);
    return resp.body ? (JSON.parse(resp.body) as unknown) : null;
  }

  // ------------------------------------------------------------- routes

  async getExecution(executionId: string, lease?: Lease): Promise<Execution> {
    return executionFromWire(this.json(await this.request("GET", `/v0/executions/${executionId}`, { lease })));
  }

  async submit(executionId: string, lease: Lease, body: string, occurrence: number): Promise<Decision> {
    const resp = await this.request("POST", `/v0/executions/${executionId}/steps`, { body, lease, occurrence, retry: "submit" });
    const decision = decisionFromWire(this.json(resp));
    if (decision.stepId !== undefined && lease.occurrenceSupported === undefined) {
      lease.occurrenceSupported = resp.headers["rebuno-step-occurrence"] !== undefined;
    }
    if (!lease.carriedOutcomes) {
      const offered = resp.headers["rebuno-extensions"];
      lease.carriedOutcomes = typeof offered === "string" && offered.split(",").some((t) => t.trim() === CARRIED_OUTCOME);
    }
    if (decision.decision !== "execution_terminal") lease.clock.renewed(resp.sentAt);
    return decision;
  }

  /** Record a step's outcome with the captures taken after its body, which the kernel commits with it. */
  async stepOutcome(executionId: string, lease: Lease, outcome: Outcome): Promise<Decision> {
    const verb = outcome.succeeded ? "complete" : "fail";
    const resp = await this.request("POST", `/v0/executions/${executionId}/steps/${outcome.stepId}/${verb}`, { body: `{${outcome.members()}}`, lease });
    const decision = decisionFromWire(this.json(resp));
    if (decision.decision === "recorded") lease.clock.renewed(resp.sentAt);
    return decision;
  }

  async streamDelta(executionId: string, stepId: string, lease: Lease, seq: number, data: string): Promise<void> {
    const resp = await this.request("POST", `/v0/executions/${executionId}/steps/${stepId}/stream`, {
      body: JSON.stringify({ seq, data }), lease, retry: "never",
    });
    if (!ok(resp)) throw apiError(resp.status, resp.body);
  }

  async heartbeat(executionId: string, lease: Lease): Promise<void> {
    const resp = await this.request("POST", `/v0/executions/${executionId}/heartbeat`, { lease });
    this.terminalOr(resp);
    lease.clock.renewed(resp.sentAt);
  }

  /**
   * Complete (with `outputJson`) or fail (with `reason`) the execution,
   * carrying the last step's outcome when given. Returns false when it was already terminal (`409 execution_terminal`,
   * also the answer to a retry whose first try was recorded).
   */
  async finishExecution(executionId: string, lease: Lease, outcome: { outputJson: string } | { reason: string }, carried?: Outcome): Promise<boolean> {
    const verb = "outputJson" in outcome ? "complete" : "fail";
    const resp = await this.request("POST", `/v0/executions/${executionId}/${verb}`, { body: finishBody(outcome, carried), lease });
    if (resp.status === 409 && errorCode(resp.body) === "execution_terminal") return false;
    if (!ok(resp)) throw apiError(resp.status, resp.body);
    return true;
  }

  // ---------------------------------------------------------- resources

  /** Register a key, or confirm an identical registration; returns the resource view. */
  async registerResource(executionId: string, lease: Lease, registration: Record<string, unknown>): Promise<Resource> {
    const resp = await this.request("POST", `/v0/executions/${executionId}/resources`, { body: JSON.stringify(registration), lease });
    this.terminalOr(resp);
    lease.clock.renewed(resp.sentAt);
    return resourceFromWire(JSON.parse(resp.body));
  }

  /** Record the binding of a resource created in this dispatch. */
  async bindResource(executionId: string, lease: Lease, key: string, bindingJson: string): Promise<void> {
    const resp = await this.request("POST", `/v0/executions/${executionId}/resources/${key}/binding`, { body: `{"binding":${bindingJson}}`, lease });
    this.terminalOr(resp);
    lease.clock.renewed(resp.sentAt);
  }

  /** Publish captures taken outside a step (baselines, completion). */
  async publishCheckpoints(executionId: string, lease: Lease, captures: readonly Capture[], failures: readonly CaptureFailure[]): Promise<void> {
    const payload: Record<string, unknown> = {};
    if (captures.length) payload.captures = captures;
    if (failures.length) payload.capture_failures = failures;
    const resp = await this.request("POST", `/v0/executions/${executionId}/resources/checkpoints`, { body: JSON.stringify(payload), lease });
    this.terminalOr(resp);
    lease.clock.renewed(resp.sentAt);
  }

  async putMetadata(metadata: { description?: string | undefined; inputSchema?: unknown }): Promise<void> {
    const payload: Record<string, unknown> = {};
    if (metadata.description) payload.description = metadata.description.slice(0, 4096);
    if (metadata.inputSchema !== undefined) payload.input_schema = metadata.inputSchema;
    const resp = await this.request("PUT", `/v0/agents/${encodeURIComponent(this.agentId)}/metadata`, { body: JSON.stringify(payload) });
    if (!ok(resp)) throw apiError(resp.status, resp.body);
  }

  private terminalOr(resp: KernelResponse): void {
    if (resp.status === 409 && errorCode(resp.body) === "execution_terminal") throw new Terminated("execution_terminal");
    if (!ok(resp)) throw apiError(resp.status, resp.body) as APIError;
  }
}

/**
 * The body of an execution complete or fail, with the carried outcome when
 * there is one; the member order is the one of
 * docs/protocol/vectors/carried-outcomes.json.
 */
export function finishBody(outcome: { outputJson: string } | { reason: string }, carried?: Outcome): string {
  const text = "outputJson" in outcome ? `{"output":${outcome.outputJson}` : `{"error":${JSON.stringify(outcome.reason)}`;
  return `${text}${carried ? carried.carried() : ""}}`;
}

/** A capture sent with a step outcome or in a publish. */
export interface Capture {
  key: string;
  generation: number;
  checkpoint_ref: string;
}

/** A capture that failed: the driver's message, cut to 4 KiB. */
export interface CaptureFailure {
  key: string;
  generation: number;
  error: string;
}
