import { describe, expect, it } from "vitest";
import { signLegacy, signOccurrence, signV1, v1Message, verifyWebhook } from "../src/signing.js";
import { loadVectors, type OccurrenceCase, type RequestCase } from "./vectors.js";

const vectors = loadVectors<{ requests: RequestCase[]; occurrences: OccurrenceCase[] }>("signatures");

describe("request signatures (shared vectors)", () => {
  it.each(vectors.requests.map((c) => [c.name, c] as const))("%s", (_name, c) => {
    const body = Buffer.from(c.body, "utf8");
    const msg = v1Message(c.method, c.target, c.timestamp, c.dispatch_id, c.dispatch_attempt, body);
    expect(msg.toString("utf8")).toBe(c.message);
    expect(msg.length).toBe(c.message_length);
    expect(signV1(c.secret, c.method, c.target, c.timestamp, c.dispatch_id, c.dispatch_attempt, body)).toBe(c.signature);
    if (c.legacy_signature) expect(signLegacy(c.secret, body)).toBe(c.legacy_signature);
  });
});

describe("occurrence signatures (shared vectors)", () => {
  it("has both vectors", () => expect(vectors.occurrences).toHaveLength(2));
  it.each(vectors.occurrences.map((c) => [c.occurrence, c] as const))("occurrence %s", (_o, c) => {
    expect(c.message).toBe(`rebuno-occurrence-v1\n${c.request_signature}\n${c.occurrence}`);
    expect(signOccurrence(c.secret, c.request_signature, c.occurrence)).toBe(c.signature);
  });
});

describe("verifyWebhook", () => {
  const secret = vectors.requests[0]!.secret;
  const body = Buffer.from('{"execution_id":"x"}');
  const good = signLegacy(secret, body);
  it("accepts the body-only signature of the exact bytes", () => expect(verifyWebhook(secret, body, good)).toBe(true));
  it.each([
    ["another body", secret, Buffer.concat([body, Buffer.from(" ")]), good],
    ["another secret", "other", body, good],
    ["no header", secret, body, undefined],
    ["uppercase hex", secret, body, "sha256=" + good.slice(7).toUpperCase()],
    ["a v1 value", secret, body, "v1=" + good.slice(7)],
    ["a short value", secret, body, good.slice(0, -1)],
  ] as const)("refuses %s", (_what, s, b, header) => {
    expect(verifyWebhook(s, b, header)).toBe(false);
  });
});
