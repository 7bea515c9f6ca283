/**
 * `Client`: the bearer-token API for operators, UIs, scripts and tests.
 *
 *     const client = new Client("http://localhost:8080");
 *     const answer = await client.run("researcher", { prompt: "hi" }); // the output
 *     const ex = await client.create("researcher", { prompt: "hi" });
 *     for await (const event of client.streamEvents(ex.id)) console.log(event.eventSeq, event.type);
 *
 * Errors are classes by the envelope's code (`NotFoundError`,
 * `ConflictError`, ...). Connection errors and `503` are retried with
 * backoff; a create or fork is retried under the same `Idempotency-Key`, so
 * a lost answer never makes a second one.
 *
 * Awaiting a result costs one request: the kernel holds a read with `wait=`
 * until the execution ends (docs/protocol/executions.md §3.1), so `wait` and
 * `run` never poll.
 */

import { randomUUID } from "node:crypto";
import { setTimeout as sleep } from "node:timers/promises";
import { apiError, ExecutionFailedError, ExecutionTerminalError, UnavailableError } from "./errors.js";
import {
  type AgentInfo, agentFromWire, type Approval, approvalFromWire, type CoveragePoint, coveragePointFromWire, type CoverageRanges,
  coverageRangesFromWire, deltaFromWire, type Event, eventFromWire, type Execution, executionFromWire, type ExecutionPage,
  pageFromWire, type Step, stepFromWire, type StreamDelta,
} from "./types.js";

/**
 * The longest the kernel holds one request of `wait` or `run` by default
 * (ms): it holds one for `MAX_WAIT` at most, and proxies often cut idle
 * requests at 60 s. A longer wait is a sequence of such requests.
 */
export const WAIT_SLICE = 30_000;
export const MAX_WAIT = 60_000;

/** The options `create` and `run` share. */
export interface CreateOptions {
  agentVersion?: string;
  idempotencyKey?: string;
  parentExecutionId?: string;
  onBehalfOf?: string;
}

export interface ClientOptions {
  /** Default `REBUNO_BEARER_TOKEN` (dev kernels without a token accept any). */
  token?: string | undefined;
  /** Per request, in milliseconds; default 30,000. */
  timeout?: number | undefined;
  /** Retries of transport failures and `503`; default 4. */
  retries?: number | undefined;
  /** The longest one held request of `wait` or `run` (ms); default `WAIT_SLICE`, at most `MAX_WAIT`. */
  waitSlice?: number | undefined;
}

type Query = Record<string, string | number | boolean | undefined>;

interface RequestInitish {
  body?: unknown;
  query?: Query | undefined;
  headers?: Record<string, string> | undefined;
  /** How long the kernel may hold the request (`wait=`, ms), added to the timeout. */
  held?: number | undefined;
}

/** Parses `text/event-stream` lines into (event, data) frames. */
class SseParser {
  private event = "";
  private data: string[] = [];

  feed(line: string): { event: string; data: string } | undefined {
    if (line === "") {
      if (!this.data.length && !this.event) return undefined;
      const frame = { event: this.event || "message", data: this.data.join("\n") };
      this.event = "";
      this.data = [];
      return frame;
    }
    if (line.startsWith(":")) return undefined;
    const colon = line.indexOf(":");
    const name = colon < 0 ? line : line.slice(0, colon);
    let value = colon < 0 ? "" : line.slice(colon + 1);
    if (value.startsWith(" ")) value = value.slice(1);
    if (name === "data") this.data.push(value);
    else if (name === "event") this.event = value;
    return undefined;
  }
}

/** Bearer client of the kernel's `/v0` API. */
export class Client {
  readonly baseUrl: string;
  private readonly headers: Record<string, string>;
  private readonly timeout: number;
  private readonly retries: number;
  private readonly waitSlice: number;

  /** `baseUrl` defaults to `REBUNO_URL`, else `http://localhost:8080`. */
  constructor(baseUrl?: string, options: ClientOptions = {}) {
    const waitSlice = options.waitSlice ?? WAIT_SLICE;
    if (!(waitSlice > 0 && waitSlice <= MAX_WAIT)) throw new RangeError(`waitSlice must be above 0 and at most ${MAX_WAIT} ms`);
    this.waitSlice = waitSlice;
    this.baseUrl = (baseUrl || process.env.REBUNO_URL || "http://localhost:8080").replace(/\/+$/, "");
    const token = options.token ?? process.env.REBUNO_BEARER_TOKEN;
    this.headers = token ? { Authorization: `Bearer ${token}` } : {};
    this.timeout = options.timeout ?? 30_000;
    this.retries = Math.max(0, options.retries ?? 4);
  }

  private url(path: string, query?: Query): string {
    const params = new URLSearchParams();
    for (const [k, v] of Object.entries(query ?? {})) if (v !== undefined) params.set(k, String(v));
    const qs = params.toString();
    return this.baseUrl + path + (qs ? `?${qs}` : "");
  }

  /** Send a request, retrying transport errors and `503`; throw the typed error for any other non-2xx answer. */
  private async request(method: string, path: string, init: RequestInitish = {}): Promise<Response> {
    const body = init.body === undefined ? null : JSON.stringify(init.body);
    let delay = 100;
    for (let attempt = 0; ; attempt++) {
      const last = attempt >= this.retries;
      let resp: Response;
      try {
        resp = await fetch(this.url(path, init.query), {
          method, body, redirect: "manual", signal: AbortSignal.timeout(Math.ceil(this.timeout + (init.held ?? 0))),
          headers: { "Content-Type": "application/json", ...this.headers, ...init.headers },
        });
      } catch (e) {
        if (last) throw e;
        await sleep(Math.min(5000, delay * (0.5 + Math.random() / 2)));
        delay = Math.min(5000, delay * 2);
        continue;
      }
      if (resp.status < 300) return resp;
      const err = apiError(resp.status, await resp.text());
      // The first try of a retried cancel cancelled it.
      if (attempt > 0 && err instanceof ExecutionTerminalError && path.endsWith("/cancel")) return resp;
      if (!(err instanceof UnavailableError) || last) throw err;
      await sleep(Math.min(5000, delay * (0.5 + Math.random() / 2)));
      delay = Math.min(5000, delay * 2);
    }
  }

  private async json(method: string, path: string, init?: RequestInitish): Promise<unknown> {
    const text = await (await this.request(method, path, init)).text();
    return text ? (JSON.parse(text) as unknown) : null;
  }

  private async list<T>(path: string, query: Query, from: (v: unknown) => T): Promise<T[]> {
    const data = await this.json("GET", path, { query });
    return Array.isArray(data) ? data.map(from) : [];
  }

  // --------------------------------------------------------- executions

  /** Start an execution. A fresh `Idempotency-Key` is used per call (or the one given) and reused on retries. */
  async create(agentId: string, input: unknown = null, options: CreateOptions = {}): Promise<Execution> {
    return this.createWaiting(agentId, input, options, 0);
  }

  /** Create an execution; with `wait` (ms) the kernel answers once it has ended or `wait` has passed. */
  private async createWaiting(agentId: string, input: unknown, options: CreateOptions, wait: number): Promise<Execution> {
    const body: Record<string, unknown> = { agent_id: agentId, input };
    if (options.agentVersion !== undefined) body.agent_version = options.agentVersion;
    if (options.parentExecutionId !== undefined) body.parent_execution_id = options.parentExecutionId;
    if (options.onBehalfOf !== undefined) body.on_behalf_of = options.onBehalfOf;
    const key = options.idempotencyKey ?? randomUUID().replaceAll("-", "");
    return executionFromWire(await this.json("POST", "/v0/executions", {
      body, headers: { "Idempotency-Key": key }, query: waitQuery(wait), held: wait,
    }));
  }

  async get(executionId: string): Promise<Execution> {
    return executionFromWire(await this.json("GET", `/v0/executions/${executionId}`));
  }

  /** One page of executions, newest first; pass `nextCursor` back as `cursor`. */
  async listExecutions(options: { agentId?: string; status?: string; cursor?: string; limit?: number } = {}): Promise<ExecutionPage> {
    return pageFromWire(await this.json("GET", "/v0/executions", {
      query: { agent_id: options.agentId, status: options.status, cursor: options.cursor, limit: options.limit },
    }));
  }

  /** Every matching execution, newest first, across pages. */
  async *iterExecutions(options: { agentId?: string; status?: string; pageSize?: number } = {}): AsyncGenerator<Execution> {
    let cursor: string | undefined;
    for (;;) {
      const page = await this.listExecutions({ ...options, ...(cursor ? { cursor } : {}), ...(options.pageSize ? { limit: options.pageSize } : {}) });
      yield* page.executions;
      if (!page.nextCursor) return;
      cursor = page.nextCursor;
    }
  }

  async cancel(executionId: string): Promise<void> {
    await this.request("POST", `/v0/executions/${executionId}/cancel`);
  }

  /**
   * The execution once it is terminal; rejects with an `Error` named
   * `TimeoutError` after `timeout` ms (the execution goes on). Each request
   * is held by the kernel until the execution ends, at most `waitSlice` ms:
   * no polling.
   */
  async wait(executionId: string, options: { timeout?: number } = {}): Promise<Execution> {
    const deadline = options.timeout === undefined ? Infinity : performance.now() + options.timeout;
    return this.waitFrom(await this.getWaiting(executionId, this.slice(deadline)), deadline);
  }

  /**
   * Run an agent to its end and resolve to the execution's output. One
   * request creates the execution and waits for it (more only when it runs
   * longer than `waitSlice`). Rejects with `ExecutionFailedError` when it
   * fails or is cancelled, with an `Error` named `TimeoutError` after
   * `timeout` ms (the execution goes on; its id is in the message). A fresh
   * `Idempotency-Key` per call (or the one given) makes retries safe.
   */
  async run(agentId: string, input: unknown = null, options: CreateOptions & { timeout?: number } = {}): Promise<unknown> {
    const deadline = options.timeout === undefined ? Infinity : performance.now() + options.timeout;
    const ex = await this.waitFrom(await this.createWaiting(agentId, input, options, this.slice(deadline)), deadline);
    if (ex.status !== "completed") throw new ExecutionFailedError(ex);
    return ex.output;
  }

  /** The next kernel-side wait, whole ms: the slice, or what is left until `deadline` (a `performance.now()` instant). */
  private slice(deadline: number): number {
    return Math.max(0, Math.round(Math.min(this.waitSlice, deadline - performance.now())));
  }

  private async getWaiting(executionId: string, wait: number): Promise<Execution> {
    return executionFromWire(await this.json("GET", `/v0/executions/${executionId}`, { query: waitQuery(wait), held: wait }));
  }

  /** Wait on from `ex`, as last read, until it is terminal or `deadline` passes. */
  private async waitFrom(ex: Execution, deadline: number): Promise<Execution> {
    // A kernel that answers before the wait is over without an end (one
    // older than waiting reads, or one shutting down) is asked again only
    // after a pause, so that such a kernel is not asked in a loop.
    let pause = 100;
    while (!ex.terminal) {
      if (performance.now() >= deadline) {
        const err = new Error(`execution ${ex.id} is still ${ex.status}`);
        err.name = "TimeoutError";
        throw err;
      }
      const wait = this.slice(deadline);
      const started = performance.now();
      ex = await this.getWaiting(ex.id, wait);
      const took = performance.now() - started;
      if (!ex.terminal && took < wait / 2) {
        await sleep(Math.min(pause * (0.5 + Math.random() / 2), wait - took));
        pause = Math.min(1000, pause * 2);
      } else {
        pause = 100;
      }
    }
    return ex;
  }

  // ------------------------------------------------------------- events

  /** One page of the event log (events with `eventSeq > afterSeq`). */
  async events(executionId: string, options: { afterSeq?: number; limit?: number } = {}): Promise<Event[]> {
    return this.list(`/v0/executions/${executionId}/events`, { after_seq: options.afterSeq ?? 0, limit: options.limit }, eventFromWire);
  }

  /** The whole log after `afterSeq`, reading every page. */
  async allEvents(executionId: string, options: { afterSeq?: number } = {}): Promise<Event[]> {
    const out: Event[] = [];
    let after = options.afterSeq ?? 0;
    for (;;) {
      const page = await this.events(executionId, { afterSeq: after, limit: 1000 });
      out.push(...page);
      if (page.length < 1000) return out;
      after = page[page.length - 1]!.eventSeq;
    }
  }

  /**
   * Tail the event log over SSE: backlog first, then live events; ends when
   * the execution is terminal. A dropped connection is resumed with
   * `Last-Event-ID`, losing nothing.
   */
  async *streamEvents(executionId: string, options: { afterSeq?: number; reconnect?: boolean } = {}): AsyncGenerator<Event> {
    let last = options.afterSeq ?? 0;
    let failures = 0;
    for (;;) {
      try {
        for await (const frame of this.sse(`/v0/executions/${executionId}/events/stream`, { "Last-Event-ID": String(last) })) {
          failures = 0;
          if (frame.event === "end") return;
          const event = eventFromWire(JSON.parse(frame.data));
          last = event.eventSeq;
          yield event;
        }
        return; // 204: terminal, nothing after `last`
      } catch (e) {
        const transient = e instanceof UnavailableError || e instanceof TypeError;
        failures++;
        if (!transient || options.reconnect === false || failures > this.retries) throw e;
        await sleep(Math.min(5000, 100 * 2 ** failures));
      }
    }
  }

  /** Live token deltas of the execution's running steps; only those posted while connected. */
  async *streamDeltas(executionId: string): AsyncGenerator<StreamDelta> {
    for await (const frame of this.sse(`/v0/executions/${executionId}/stream`, {})) yield deltaFromWire(JSON.parse(frame.data));
  }

  private async *sse(path: string, headers: Record<string, string>): AsyncGenerator<{ event: string; data: string }> {
    const resp = await fetch(this.baseUrl + path, { headers: { ...this.headers, ...headers, Accept: "text/event-stream" }, redirect: "manual" });
    if (resp.status === 204) return;
    if (resp.status >= 300) throw apiError(resp.status, await resp.text());
    const parser = new SseParser();
    const decoder = new TextDecoder();
    let buffered = "";
    const reader = resp.body!.getReader();
    try {
      for (let next = await reader.read(); !next.done; next = await reader.read()) {
        buffered += decoder.decode(next.value, { stream: true });
        let nl: number;
        while ((nl = buffered.indexOf("\n")) >= 0) {
          const line = buffered.slice(0, nl).replace(/\r$/, "");
          buffered = buffered.slice(nl + 1);
          const frame = parser.feed(line);
          if (frame) yield frame;
        }
      }
    } finally {
      await reader.cancel().catch(() => undefined);
    }
  }

  // -------------------------------------------------------------- steps

  /** Steps in recording order; `status` is a step status, `terminal` or `pending`. */
  async steps(executionId: string, options: { status?: string } = {}): Promise<Step[]> {
    return this.list(`/v0/executions/${executionId}/steps`, { status: options.status }, stepFromWire);
  }

  async step(executionId: string, stepId: string): Promise<Step> {
    return stepFromWire(await this.json("GET", `/v0/executions/${executionId}/steps/${stepId}`));
  }

  // --------------------------------------------------- coverage and forks

  /**
   * Fork an execution at one of its events: a new execution of the same
   * agent and input whose steps up to `atSeq` replay, with each resource
   * restored from the checkpoint that covers the point (or the newest
   * earlier one; see `restoration`). A fresh `Idempotency-Key` per call.
   */
  async fork(executionId: string, options: { atSeq: number }): Promise<Execution> {
    return executionFromWire(await this.json("POST", `/v0/executions/${executionId}/fork`, {
      body: { at_seq: options.atSeq }, headers: { "Idempotency-Key": randomUUID().replaceAll("-", "") },
    }));
  }

  /** Coverage at one event with `atSeq`, else the covered ranges of the whole log. */
  coverage(executionId: string, options: { atSeq: number }): Promise<CoveragePoint>;
  coverage(executionId: string, options?: { atSeq?: undefined }): Promise<CoverageRanges>;
  async coverage(executionId: string, options: { atSeq?: number | undefined } = {}): Promise<CoveragePoint | CoverageRanges> {
    if (options.atSeq === undefined) return coverageRangesFromWire(await this.json("GET", `/v0/executions/${executionId}/coverage`));
    return coveragePointFromWire(await this.json("GET", `/v0/executions/${executionId}/coverage`, { query: { at_seq: options.atSeq } }));
  }

  /** One page of the execution's direct forks, newest first. */
  async listForks(executionId: string, options: { cursor?: string; limit?: number } = {}): Promise<ExecutionPage> {
    return pageFromWire(await this.json("GET", `/v0/executions/${executionId}/forks`, { query: { cursor: options.cursor, limit: options.limit } }));
  }

  // ---------------------------------------------------------- approvals

  /** Approvals, oldest first; `status` defaults to `pending` on the kernel. */
  async approvals(options: { status?: string; executionId?: string; after?: string; limit?: number } = {}): Promise<Approval[]> {
    return this.list("/v0/approvals", { status: options.status, execution_id: options.executionId, after: options.after, limit: options.limit }, approvalFromWire);
  }

  async approval(approvalId: string): Promise<Approval> {
    return approvalFromWire(await this.json("GET", `/v0/approvals/${approvalId}`));
  }

  async grant(approvalId: string, options: { decidedBy?: string; rationale?: string } = {}): Promise<void> {
    await this.request("POST", `/v0/approvals/${approvalId}/grant`, { body: decisionBody(options) });
  }

  async deny(approvalId: string, options: { decidedBy?: string; rationale?: string } = {}): Promise<void> {
    await this.request("POST", `/v0/approvals/${approvalId}/deny`, { body: decisionBody(options) });
  }

  // ------------------------------------------------------------- agents

  /** Create or update an agent (its policy and metadata are kept). */
  async registerAgent(agentId: string, webhookUrl: string, secret: string, options: { leaseTimeoutSeconds?: number } = {}): Promise<AgentInfo> {
    const body: Record<string, unknown> = { id: agentId, webhook_url: webhookUrl, secret };
    if (options.leaseTimeoutSeconds !== undefined) body.lease_timeout_seconds = options.leaseTimeoutSeconds;
    return agentFromWire(await this.json("POST", "/v0/agents", { body }));
  }

  async agents(): Promise<AgentInfo[]> {
    return this.list("/v0/agents", {}, agentFromWire);
  }

  async agent(agentId: string): Promise<AgentInfo> {
    return agentFromWire(await this.json("GET", `/v0/agents/${encodeURIComponent(agentId)}`));
  }

  async deleteAgent(agentId: string): Promise<void> {
    await this.request("DELETE", `/v0/agents/${encodeURIComponent(agentId)}`);
  }

  /** Load an agent's policy bundle (YAML); null or "" removes it. */
  async setPolicy(agentId: string, bundle: string | null): Promise<void> {
    await this.request("POST", `/v0/policies/${encodeURIComponent(agentId)}`, { body: { bundle: bundle ?? "" } });
  }

  /** Whether the kernel answers `GET /v0/ready` with 200. */
  async health(): Promise<boolean> {
    try {
      return (await fetch(`${this.baseUrl}/v0/ready`, { signal: AbortSignal.timeout(this.timeout) })).status === 200;
    } catch {
      return false;
    }
  }
}

/** The `wait` parameter for a kernel-side wait of `wait` whole ms; none for 0. */
function waitQuery(wait: number): Query | undefined {
  return wait > 0 ? { wait: `${wait}ms` } : undefined;
}

function decisionBody(options: { decidedBy?: string; rationale?: string }): Record<string, string> {
  const body: Record<string, string> = {};
  if (options.decidedBy !== undefined) body.decided_by = options.decidedBy;
  if (options.rationale !== undefined) body.rationale = options.rationale;
  return body;
}
