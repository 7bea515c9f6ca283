/** Units without a kernel: dispatch ordering, refusals, result encoding, and the bytes the kernel client sends. */

import http from "node:http";
import type { AddressInfo } from "node:net";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { failureReason } from "../src/agent.js";
import { DispatchTracker, isNewer } from "../src/dispatch.js";
import { encodeResult } from "../src/effects.js";
import { apiError, Blocked, ConflictError, NotFoundError, PolicyError, raiseForRefusal, RateLimited, Terminated, ToolError, UnavailableError } from "../src/errors.js";
import { NotJsonError } from "../src/identity.js";
import { KernelClient, type Lease, LeaseClock, Outcome } from "../src/kernel.js";
import { refusalResponse, splitUtf8 } from "../src/llm.js";
import { signOccurrence, signV1 } from "../src/signing.js";

const D1 = "01930000-0000-7000-8000-000000000001";
const D2 = "01930000-0000-7000-8000-000000000002";

describe("DispatchTracker", () => {
  it("orders by dispatch id, then attempt; unknown attempts run only after the handler ended", () => {
    expect(isNewer({ dispatchId: D2, attempt: 1 }, { dispatchId: D1, attempt: 5 })).toBe(true);
    expect(isNewer({ dispatchId: D1, attempt: 2 }, { dispatchId: D1, attempt: 1 })).toBe(true);
    expect(isNewer({ dispatchId: D1, attempt: 1 }, { dispatchId: D1, attempt: 1 })).toBe(false);
    expect(isNewer({ dispatchId: D1, attempt: undefined }, { dispatchId: D1, attempt: 1 })).toBeUndefined();
    let now = 0;
    const t = new DispatchTracker(3, () => now);
    expect(t.offer("e", { dispatchId: D1, attempt: 1 })).toBe(true);
    expect(t.offer("e", { dispatchId: D1, attempt: 1 })).toBe(false); // a repeat
    expect(t.offer("e", { dispatchId: D1, attempt: undefined })).toBe(false); // unknown while running
    expect(t.offer("e", { dispatchId: D1, attempt: 2 })).toBe(true);
    t.finished("e", { dispatchId: D1, attempt: 2 }, 1000);
    expect(t.offer("e", { dispatchId: D1, attempt: 1 })).toBe(false); // stale
    now = 2001; // kept for 2 × lease, then forgotten
    expect(t.newest("e")).toBeUndefined();
  });

  it("keeps at most its limit, forgetting finished executions first", () => {
    const t = new DispatchTracker(2);
    t.offer("a", { dispatchId: D1, attempt: 1 });
    t.offer("b", { dispatchId: D1, attempt: 1 });
    t.finished("a", { dispatchId: D1, attempt: 1 }, 60_000);
    t.offer("c", { dispatchId: D1, attempt: 1 });
    expect(t.size).toBe(2);
    expect(t.newest("a")).toBeUndefined();
    expect(t.newest("b")).toBeDefined();
  });
});

describe("errors", () => {
  it("are typed by the envelope's code, then the status", () => {
    expect(apiError(409, '{"code":"conflict","message":"conflict: x","details":{"f":1}}')).toBeInstanceOf(ConflictError);
    expect(apiError(404, "not json")).toBeInstanceOf(NotFoundError);
    const e = apiError(503, '{"code":"unavailable","message":"draining"}');
    expect(e).toBeInstanceOf(UnavailableError);
    expect([e.status, e.code, e.message]).toEqual([503, "unavailable", "503 unavailable: draining"]);
  });

  it("map to the failure reasons of the Python SDK", () => {
    class WidgetError extends Error {}
    expect(failureReason(new PolicyError("no"))).toBe("policy_denied: no");
    expect(failureReason(new RateLimited("rate_limit_exceeded", { retryAfterMs: 5 }))).toBe("rate_limited: rate_limit_exceeded");
    expect(failureReason(new ToolError("t", "broke"))).toBe("tool_error: t: broke");
    expect(failureReason(new WidgetError("boom"))).toBe("agent_error: WidgetError: boom");
    expect(failureReason(new Blocked())).toBeUndefined();
    expect(failureReason(new Terminated())).toBeUndefined();
  });

  it("raiseForRefusal finds a refusal in provider errors, their bodies, headers and causes", async () => {
    const body = await refusalResponse("rate_limited", { reason: "rate_limit_exceeded", ruleId: "r1", retryAfterMs: 250 }).text();
    const apiCallError = Object.assign(new Error("Forbidden"), { statusCode: 429, responseBody: body });
    const caught = (e: unknown): unknown => {
      try {
        raiseForRefusal(e);
      } catch (x) {
        return x;
      }
      return undefined;
    };
    const limited = caught(new Error("retries exhausted", { cause: apiCallError })) as RateLimited;
    expect(limited).toBeInstanceOf(RateLimited);
    expect([limited.reason, limited.ruleId, limited.retryAfterMs]).toEqual(["rate_limit_exceeded", "r1", 250]);
    expect(caught(Object.assign(new Error("x"), { errors: [new Error("403 rebuno_refusal: denied reason=no shell")] }))).toMatchObject({ reason: "no shell" });
    expect(caught(Object.assign(new Error("x"), { headers: new Headers({ "rebuno-refusal": "blocked" }) }))).toBeInstanceOf(Blocked);
    expect(caught(new Error("an ordinary failure"))).toBeUndefined();
  });

  it("refusal responses are what provider clients do not retry", async () => {
    const r = refusalResponse("denied", { reason: "no", ruleId: "r" });
    expect([r.status, r.headers.get("x-should-retry"), r.headers.get("rebuno-refusal")]).toEqual([403, "false", "denied"]);
    expect(await r.json()).toEqual({ error: { type: "rebuno_refusal", code: "denied", message: "rebuno_refusal: denied reason=no", rule_id: "r", retry_after_ms: null } });
  });
});

describe("encodeResult", () => {
  it("keeps insertion order and JSON's conventions", () => {
    expect(encodeResult({ b: 1, a: [undefined, "x"], d: new Date(0), u: undefined })).toBe('{"b":1,"a":[null,"x"],"d":"1970-01-01T00:00:00.000Z"}');
    expect(encodeResult(undefined)).toBe("null");
    expect(encodeResult(Object.create(null))).toBe("{}");
  });
  it.each([[new Map(), "Map"], [new Set([1]), "Set"], [{ n: 1n }, "bigint"], [{ f: () => 1 }, "Function"], [NaN, "number"], [new (class Widget {})(), "Widget"]])(
    "names what JSON cannot hold: %s", (value, name) => {
      expect(() => encodeResult(value)).toThrow(NotJsonError);
      try {
        encodeResult(value);
      } catch (e) {
        expect((e as NotJsonError).typeName).toBe(name);
      }
    });
});

describe("splitUtf8", () => {
  it("cuts at character boundaries within the byte limit", () => {
    const text = "é".repeat(5000) + "😀".repeat(10);
    const pieces = splitUtf8(text, 7000);
    expect(pieces.join("")).toBe(text);
    for (const p of pieces) expect(Buffer.byteLength(p)).toBeLessThanOrEqual(7000);
  });
});

describe("the kernel client's requests", () => {
  const seen: { method: string; url: string; headers: http.IncomingHttpHeaders; body: string }[] = [];
  let server: http.Server;
  let base: string;
  let answers: [number, string][] = [];
  beforeAll(async () => {
    server = http.createServer((req, res) => {
      const chunks: Buffer[] = [];
      req.on("data", (c: Buffer) => chunks.push(c));
      req.on("end", () => {
        seen.push({ method: req.method!, url: req.url!, headers: req.headers, body: Buffer.concat(chunks).toString() });
        const [status, body] = answers.shift() ?? [200, '{"decision":"proceed","step_id":"s1","resources":[]}'];
        res.writeHead(status, { "content-type": "application/json", "rebuno-step-occurrence": "0" }).end(body);
      });
    });
    await new Promise<void>((r) => server.listen(0, "127.0.0.1", r));
    base = `http://127.0.0.1:${(server.address() as AddressInfo).port}/prefix`;
  });
  afterAll(() => new Promise<void>((r) => server.close(() => r())));

  const lease = (): Lease => ({ dispatchId: D1, attempt: 3, clock: new LeaseClock(120_000) });

  it("signs each request with v1 and binds a submit's occurrence to that signature", async () => {
    seen.length = 0;
    const client = new KernelClient(base, "agent-1", "s3cret", 5000);
    const body = '{"kind":"local","target":"x","args":{},"idempotency":"safe_to_retry","resources":[]}';
    const l = lease();
    await client.submit("e1", l, body, 4);
    expect(l.occurrenceSupported).toBe(true);
    await client.heartbeat("e1", l).catch(() => undefined);
    client.close();
    const [submit, beat] = seen;
    const h = submit!.headers;
    expect(submit!.url).toBe("/prefix/v0/executions/e1/steps");
    expect(h["content-type"]).toBe("application/json");
    expect([h["rebuno-agent-id"], h["rebuno-dispatch-id"], h["rebuno-dispatch-attempt"], h["rebuno-step-occurrence"]]).toEqual(["agent-1", D1, "3", "4"]);
    const sig = signV1("s3cret", "POST", submit!.url, h["rebuno-timestamp"] as string, D1, "3", Buffer.from(body));
    expect(h["rebuno-signature"]).toBe(sig);
    expect(h["rebuno-occurrence-signature"]).toBe(signOccurrence("s3cret", sig, "4"));
    expect(beat!.body).toBe("");
    expect(beat!.headers["rebuno-step-occurrence"]).toBeUndefined();
    expect(beat!.headers["rebuno-occurrence-signature"]).toBeUndefined();
  });

  it("retries a 503 with the same body and a fresh signature, and stops on lease_superseded", async () => {
    seen.length = 0;
    answers = [[503, '{"code":"unavailable","message":"draining"}'], [200, '{"decision":"recorded"}']];
    const client = new KernelClient(base, "agent-1", "s3cret", 5000);
    const d = await client.stepOutcome("e1", lease(), new Outcome("s1", true, '{"x":1}', [{ key: "w", generation: 2, checkpoint_ref: "r" }]));
    expect(d.decision).toBe("recorded");
    expect(seen.map((r) => r.body)).toEqual(Array(2).fill('{"result":{"x":1},"captures":[{"key":"w","generation":2,"checkpoint_ref":"r"}]}'));
    answers = [[409, '{"code":"lease_superseded","message":"lease superseded"}']];
    await expect(client.heartbeat("e1", lease())).rejects.toThrow(Terminated);
    client.close();
  });
});
