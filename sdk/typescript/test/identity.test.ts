import { createHash } from "node:crypto";
import { describe, expect, it } from "vitest";
import { argsHash, canonicalJson, canonicalText, compareUtf8, JsonNumber, NotJsonError, NULL_ARGS_HASH, parseJson, stepId, stepIdPreimage } from "../src/identity.js";
import { type CanonicalCase, loadVectors, type StepIdCase } from "./vectors.js";

const canonical = loadVectors<{ absent_args_hash: string; cases: CanonicalCase[] }>("canonical-json");
const steps = loadVectors<{ execution_id: string; cases: StepIdCase[] }>("step-ids");

describe("canonical JSON and args_hash (shared vectors)", () => {
  it("has every vector", () => expect(canonical.cases.length).toBeGreaterThanOrEqual(15));
  it.each(canonical.cases.map((c) => [c.name, c] as const))("%s", (_name, c) => {
    const want = Buffer.from(c.canonical_hex, "hex");
    expect(createHash("sha256").update(want).digest("hex")).toBe(c.args_hash);
    const got = canonicalText(c.args);
    expect(Buffer.from(got, "utf8").toString("hex")).toBe(c.canonical_hex);
    expect(argsHash(got)).toBe(c.args_hash);
  });
  it("hashes absent args like null", () => {
    expect(NULL_ARGS_HASH).toBe(canonical.absent_args_hash);
    expect(argsHash(canonicalText(undefined))).toBe(NULL_ARGS_HASH);
    expect(argsHash(canonicalText("  "))).toBe(NULL_ARGS_HASH);
    expect(argsHash(canonicalJson(null))).toBe(NULL_ARGS_HASH);
    expect(argsHash(canonicalJson(undefined))).toBe(NULL_ARGS_HASH);
  });
});

describe("step ids (shared vectors)", () => {
  it.each(steps.cases.map((c) => [c.name, c] as const))("%s", (_name, c) => {
    const h = argsHash(canonicalText(c.args));
    expect(h).toBe(c.args_hash);
    expect(stepIdPreimage(steps.execution_id, c.kind, c.target, h, c.occurrence)).toBe(c.preimage);
    expect(stepId(steps.execution_id, c.kind, c.target, h, c.occurrence)).toBe(c.step_id);
    // The execution id is hashed in lowercase whatever the caller passes.
    expect(stepId(steps.execution_id.toUpperCase(), c.kind, c.target, h, c.occurrence)).toBe(c.step_id);
  });
});

describe("JavaScript values", () => {
  it("hash like their JSON text", () => {
    expect(canonicalJson({ b: "<&>", a: "é\u2028" })).toBe(canonicalText('{"b":"<&>","a":"é\\u2028"}'));
    expect(canonicalJson({ path: "/tmp" })).toBe('{"path":"/tmp"}');
    expect(canonicalJson({ x: "\ud800" })).toBe(canonicalText('{"x":"\\ud800"}'));
    expect(canonicalJson({ "\u{1F600}": 2, "\uff41": 1 })).toBe('{"\uff41":1,"\u{1F600}":2}');
  });
  it("follow JSON.stringify leniently: toJSON, undefined members, non-finite numbers", () => {
    expect(canonicalJson({ d: new Date(0), u: undefined, n: NaN, a: [undefined, () => 1] })).toBe('{"a":[null,null],"d":"1970-01-01T00:00:00.000Z","n":null}');
  });
  it("refuse what plain JSON cannot hold when strict", () => {
    for (const bad of [{ m: new Map() }, { f: () => 1 }, { n: Infinity }, { b: 1n }, { u: undefined }]) {
      expect(() => canonicalJson(bad, "strict")).toThrow(NotJsonError);
    }
    const loop: Record<string, unknown> = {};
    loop.self = loop;
    expect(() => canonicalJson(loop)).toThrow(/circular/);
  });
  it("sorts keys by UTF-8 bytes, not UTF-16 units", () => {
    expect(["\u{1F600}", "\uff41", "a", "é"].sort(compareUtf8)).toEqual(["a", "é", "\uff41", "\u{1F600}"]);
  });
});

describe("parseJson", () => {
  it("keeps number literals and the last of duplicate keys", () => {
    const v = parseJson('{"a":1.0,"a":[1E2,-0]}') as Record<string, unknown>;
    expect(canonicalJson(v)).toBe('{"a":[1E2,-0]}');
    expect(parseJson("1.50")).toEqual(new JsonNumber("1.50"));
  });
  it.each(['{"x": NaN}', "[1,]", '{"a" 1}', "01", '"\u0001"', "1 2", "", '"\\x"'])("refuses %j", (text) => {
    expect(() => parseJson(text)).toThrow(SyntaxError);
  });
  it("takes a __proto__ key as data", () => {
    expect(canonicalText('{"__proto__":1}')).toBe('{"__proto__":1}');
  });
});
