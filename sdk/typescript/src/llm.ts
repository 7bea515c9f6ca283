/**
 * LLM calls as governed steps: `rebunoFetch`, a `fetch` for provider SDKs.
 *
 *     const openai = createOpenAI({ fetch: rebunoFetch });      // AI SDK
 *     const client = new OpenAI({ fetch: rebunoFetch });        // openai
 *
 * Every request through it is an `llm_call` step:
 *
 * - **target** is the request's `model` (empty when it has none); **args** is
 *   the JSON body exactly as sent (numbers as written), so a streamed and a
 *   plain call of the same request are two steps;
 * - on `proceed` the request goes to the provider and the whole response is
 *   recorded as `{"status", "headers": {"content-type"}, "body": <text>}`,
 *   the record the Python SDK writes, so either SDK replays the other's; on
 *   `replay` the recorded response is returned without touching the provider;
 * - a streamed response (`text/event-stream`) is passed through as it
 *   arrives, teed to the kernel's live side channel, and recorded whole when
 *   it ends (read to the end even when the caller stops early);
 * - kernel refusals never throw here: they come back as synthetic `403`/`429`
 *   responses carrying the `rebuno_refusal` marker and `x-should-retry:
 *   false`, which `raiseForRefusal()` turns back into `PolicyError`,
 *   `RateLimited`, `Blocked` or `Terminated`.
 */

import { performance } from "node:perf_hooks";
import { errorMessage, errorValue, report } from "./effects.js";
import { Blocked, refusalMessage, Terminated, ToolError } from "./errors.js";
import { type ExecutionContext, requireContext } from "./execution.js";
import { canonicalJson, parseJson } from "./identity.js";
import { log } from "./log.js";
import { isRecord } from "./errors.js";
import type { Decision } from "./types.js";

/** The most bytes of UTF-8 one stream delta carries. */
export const DELTA_MAX_BYTES = 7000;
/** Deltas are posted at most this often. */
export const DELTA_INTERVAL_MS = 50;
const DROPPED_HEADERS = new Set(["content-encoding", "content-length", "transfer-encoding"]);
const NULL_BODY_STATUSES = new Set([101, 204, 205, 304]);

type Fetch = typeof globalThis.fetch;

/** What an LLM call records: the provider's status, content type and body text. */
export interface LlmRecord {
  status: number;
  headers: { "content-type": string };
  body: string;
}

/** (target, args) of an LLM request: the model and the whole JSON body; other requests are described by method, path and body. */
export function llmStepArgs(request: Request, body: string): [string, unknown] {
  let parsed: unknown;
  try {
    parsed = body.trim() ? parseJson(body) : undefined;
  } catch {
    parsed = undefined;
  }
  if (isRecord(parsed)) return [typeof parsed.model === "string" ? parsed.model : "", parsed];
  const url = new URL(request.url);
  return ["", { method: request.method, path: url.pathname + url.search, body }];
}

/** The synthetic response for a kernel refusal. */
export function refusalResponse(code: string, details: { reason?: string | undefined; ruleId?: string | undefined; retryAfterMs?: number | undefined } = {}): Response {
  const status = code === "rate_limited" ? 429 : 403;
  const payload = {
    error: {
      type: "rebuno_refusal", code, message: refusalMessage(code, details.reason),
      rule_id: details.ruleId ?? null, retry_after_ms: details.retryAfterMs ?? null,
    },
  };
  const headers: Record<string, string> = { "content-type": "application/json", "x-should-retry": "false", "Rebuno-Refusal": code };
  if (details.retryAfterMs !== undefined) headers["retry-after-ms"] = String(details.retryAfterMs);
  return new Response(JSON.stringify(payload), { status, headers });
}

function recordOf(status: number, headers: Headers, body: string): LlmRecord {
  return { status, headers: { "content-type": headers.get("content-type") ?? "application/json" }, body };
}

/** The response a record describes: what a live call returns and every replay. */
function replayed(result: unknown): Response {
  if (!isRecord(result) || typeof result.status !== "number") {
    throw new ToolError("llm_call", "the recorded LLM response has an unknown shape", { error: result });
  }
  const headers = new Headers();
  const recorded = isRecord(result.headers) ? result.headers : { "content-type": "application/json" };
  for (const [k, v] of Object.entries(recorded)) headers.set(k, String(v));
  const body = typeof result.body === "string" ? result.body : JSON.stringify(result.body ?? "");
  return new Response(NULL_BODY_STATUSES.has(result.status) ? null : body, { status: result.status, headers });
}

/** Split text into pieces of at most `limit` bytes of UTF-8, at character boundaries. */
export function splitUtf8(text: string, limit = DELTA_MAX_BYTES): string[] {
  const out: string[] = [];
  let data = Buffer.from(text, "utf8");
  while (data.length) {
    let cut = Math.min(limit, data.length);
    while (cut < data.length && (data[cut]! & 0xc0) === 0x80) cut--;
    out.push(data.subarray(0, cut).toString("utf8"));
    data = data.subarray(cut);
  }
  return out;
}

/** Posts the live deltas of one step, at most every 50 ms, one request at a time. */
class DeltaSender {
  private pending: string[] = [];
  private seq = 0;
  private last = 0;
  private inFlight: Promise<void> | undefined;

  constructor(private readonly ctx: ExecutionContext, private readonly stepId: string) {}

  add(text: string): void {
    if (text) this.pending.push(text);
    if (this.pending.length && performance.now() - this.last >= DELTA_INTERVAL_MS && !this.inFlight) this.flush();
  }

  private flush(): void {
    const data = this.pending.join("");
    this.pending = [];
    this.last = performance.now();
    this.inFlight = this.post(data).finally(() => (this.inFlight = undefined));
  }

  private async post(data: string): Promise<void> {
    for (const piece of splitUtf8(data)) {
      const seq = this.seq++;
      try {
        await this.ctx.kernel.streamDelta(this.ctx.executionId, this.stepId, this.ctx.lease, seq, piece);
      } catch (e) {
        // Deltas are ephemeral: never fail the call for them.
        log.debug(`rebuno: stream delta of ${this.stepId} dropped: ${(e as Error).message}`);
      }
    }
  }

  async close(): Promise<void> {
    if (this.inFlight) await this.inFlight;
    if (this.pending.length) {
      this.flush();
      await this.inFlight;
    }
  }
}

/**
 * Pass a streamed provider response through, posting live deltas, and
 * record the whole response when it ends. The caller sees the end of the
 * stream only once the step is recorded.
 */
function teeStream(ctx: ExecutionContext, stepId: string, upstream: Response): ReadableStream<Uint8Array> {
  const reader = upstream.body!.getReader();
  const chunks: Uint8Array[] = [];
  const decoder = new TextDecoder("utf-8");
  const deltas = new DeltaSender(ctx, stepId);
  let done = false;
  const take = (chunk: Uint8Array): void => {
    chunks.push(chunk);
    deltas.add(decoder.decode(chunk, { stream: true }));
  };
  const finish = async (error: unknown): Promise<void> => {
    if (done) return;
    done = true;
    deltas.add(decoder.decode());
    await deltas.close();
    if (ctx.stopping) return;
    const value = error === undefined
      ? JSON.stringify(recordOf(upstream.status, upstream.headers, Buffer.concat(chunks).toString("utf8")))
      : JSON.stringify(errorValue(error));
    try {
      await report(ctx, "llm_call", stepId, error === undefined, value, undefined, true);
    } catch (e) {
      // The caller already has the response; a signal is sticky on the context.
      log.warn(`rebuno: could not record streamed LLM call ${stepId}: ${(e as Error).message}`);
    }
  };
  return new ReadableStream<Uint8Array>({
    async pull(controller) {
      let next: Awaited<ReturnType<typeof reader.read>>;
      try {
        next = await reader.read();
      } catch (e) {
        await finish(e);
        controller.error(e);
        return;
      }
      if (next.done) {
        await finish(undefined);
        controller.close();
        return;
      }
      take(next.value);
      controller.enqueue(next.value);
    },
    async cancel() {
      // Record the whole response, not the part the caller read.
      if (!done && !ctx.stopping) {
        try {
          for (let next = await reader.read(); !next.done; next = await reader.read()) take(next.value);
          await finish(undefined);
        } catch (e) {
          await finish(e);
        }
      }
      await reader.cancel().catch(() => undefined);
    },
  });
}

async function reportQuietly(ctx: ExecutionContext, stepId: string, error: unknown): Promise<void> {
  try {
    await report(ctx, "llm_call", stepId, false, JSON.stringify(errorValue(error)));
  } catch (e) {
    log.warn(`rebuno: could not record the failed LLM call ${stepId}: ${(e as Error).message}`);
  }
}

/**
 * A `fetch` whose requests are recorded LLM steps, sending them on with
 * `inner` (default: the global `fetch` as it was when this module loaded).
 */
export function createRebunoFetch(inner: Fetch = globalThis.fetch.bind(globalThis)): Fetch {
  const decided = async (ctx: ExecutionContext, request: Request, body: Uint8Array | undefined, d: Decision): Promise<Response> => {
    switch (d.decision) {
      case "replay":
        if (d.hasError) throw new ToolError("llm_call", errorMessage(d.error), { error: d.error, stepId: d.stepId });
        return replayed(d.result);
      case "denied":
        return refusalResponse("denied", { reason: d.reason, ruleId: d.ruleId });
      case "rate_limited":
        return refusalResponse("rate_limited", { reason: d.reason, ruleId: d.ruleId, retryAfterMs: d.retryAfterMs });
      case "proceed":
        if (d.stepId !== undefined) return live(ctx, request, body, d.stepId);
    }
    return refusalResponse(d.decision);
  };

  const live = async (ctx: ExecutionContext, request: Request, body: Uint8Array | undefined, stepId: string): Promise<Response> => {
    let upstream: Response;
    try {
      const signal = request.signal ? AbortSignal.any([request.signal, ctx.abortSignal]) : ctx.abortSignal;
      upstream = await inner(request.url, { method: request.method, headers: request.headers, body: body ?? null, signal });
    } catch (e) {
      if (!ctx.stopping) await reportQuietly(ctx, stepId, e);
      throw e;
    }
    const headers = new Headers();
    upstream.headers.forEach((v, k) => { if (!DROPPED_HEADERS.has(k)) headers.append(k, v); });
    if ((upstream.headers.get("content-type") ?? "").startsWith("text/event-stream") && upstream.body) {
      return new Response(teeStream(ctx, stepId, upstream), { status: upstream.status, statusText: upstream.statusText, headers });
    }
    let text: string;
    try {
      text = await upstream.text();
    } catch (e) {
      if (!ctx.stopping) await reportQuietly(ctx, stepId, e);
      throw e;
    }
    const rec = recordOf(upstream.status, upstream.headers, text);
    const stored = await report(ctx, "llm_call", stepId, true, JSON.stringify(rec), undefined, true);
    // Recorded by an earlier try: the stored outcome stands.
    if (stored) return decided(ctx, request, body, stored);
    // Built from the record, so that the live response and every replay are identical.
    return replayed(rec);
  };

  return async function rebunoFetch(input: string | URL | Request, init?: RequestInit): Promise<Response> {
    const ctx = requireContext("rebunoFetch");
    const request = new Request(input, init);
    // The bytes go to the provider unchanged; their text is what the step records.
    const bytes = request.body ? new Uint8Array(await request.arrayBuffer()) : undefined;
    const body = bytes ? new TextDecoder().decode(bytes) : "";
    const [target, args] = llmStepArgs(request, body);
    let decision: Decision;
    try {
      decision = await ctx.submit("llm_call", target, canonicalJson(args), "safe_to_retry", []);
    } catch (e) {
      if (e instanceof Blocked) return refusalResponse("blocked");
      if (e instanceof Terminated) return refusalResponse(e.reason === "lease_superseded" ? "lease_superseded" : "execution_terminal");
      throw e;
    }
    return decided(ctx, request, bytes, decision);
  };
}

/**
 * `fetch` for provider SDKs inside a handler: every request is a recorded
 * `llm_call` step. `createOpenAI({ fetch: rebunoFetch })`, `new OpenAI({ fetch: rebunoFetch })`.
 */
export const rebunoFetch: Fetch = createRebunoFetch();
