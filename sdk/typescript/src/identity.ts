/**
 * Step identity (docs/protocol/vectors): canonical JSON, `args_hash` and
 * `step_id`, bit-exact with the kernel's.
 *
 * The SDK computes `args_hash` itself to count occurrences and send
 * `Rebuno-Step-Occurrence`, and it sends the canonical text as the step's
 * `args`, so what it hashes is byte for byte what it sends. The canonical
 * form:
 *
 * - numbers keep the literal text they were written with (`1.0` stays
 *   `1.0`): parsed JSON keeps them as {@link JsonNumber};
 * - object members are sorted by the UTF-8 bytes of their keys (code point
 *   order, not JavaScript's UTF-16 order);
 * - strings are escaped HTML-safely (`<`, `>`, `&`, U+2028, U+2029), lone
 *   surrogates become U+FFFD, everything else non-ASCII stays raw.
 */

import { createHash } from "node:crypto";

/** A JSON number kept as the literal text it was written with. */
export class JsonNumber {
  constructor(readonly text: string) {}
  toJSON(): number {
    return Number(this.text);
  }
}

// ---------------------------------------------------------------- parsing

const NUMBER = /-?(?:0|[1-9]\d*)(?:\.\d+)?(?:[eE][+-]?\d+)?/y;
const PLAIN_RUN = /[^"\\\u0000-\u001f]*/y;
const WS = /[ \t\n\r]*/y;

/**
 * Parse JSON text keeping number literals verbatim ({@link JsonNumber}).
 * Objects come back with a null prototype; a duplicate key keeps its last
 * value. Throws `SyntaxError` on anything that is not strict JSON.
 */
export function parseJson(text: string): unknown {
  let i = 0;
  const fail = (what: string): never => {
    throw new SyntaxError(`${what} at position ${i} of JSON text`);
  };
  const skip = (): void => {
    WS.lastIndex = i;
    WS.exec(text);
    i = WS.lastIndex;
  };
  const string = (): string => {
    i++; // the opening quote
    let out = "";
    for (;;) {
      PLAIN_RUN.lastIndex = i;
      PLAIN_RUN.exec(text);
      out += text.slice(i, PLAIN_RUN.lastIndex);
      i = PLAIN_RUN.lastIndex;
      const c = text[i];
      if (c === '"') {
        i++;
        return out;
      }
      if (c !== "\\") fail(c === undefined ? "unterminated string" : "control character in string");
      const e = text[i + 1];
      i += 2;
      switch (e) {
        case '"': out += '"'; break;
        case "\\": out += "\\"; break;
        case "/": out += "/"; break;
        case "b": out += "\b"; break;
        case "f": out += "\f"; break;
        case "n": out += "\n"; break;
        case "r": out += "\r"; break;
        case "t": out += "\t"; break;
        case "u": {
          const hex = text.slice(i, i + 4);
          if (!/^[0-9a-fA-F]{4}$/.test(hex)) fail("bad \\u escape");
          out += String.fromCharCode(parseInt(hex, 16));
          i += 4;
          break;
        }
        default:
          fail("bad escape");
      }
    }
  };
  const value = (depth: number): unknown => {
    if (depth > 10_000) fail("nesting too deep");
    skip();
    const c = text[i];
    if (c === "{") {
      i++;
      const obj: Record<string, unknown> = Object.create(null) as Record<string, unknown>;
      skip();
      if (text[i] === "}") {
        i++;
        return obj;
      }
      for (;;) {
        skip();
        if (text[i] !== '"') fail("expected a key");
        const key = string();
        skip();
        if (text[i] !== ":") fail("expected ':'");
        i++;
        obj[key] = value(depth + 1);
        skip();
        if (text[i] === ",") {
          i++;
          continue;
        }
        if (text[i] === "}") {
          i++;
          return obj;
        }
        fail("expected ',' or '}'");
      }
    }
    if (c === "[") {
      i++;
      const arr: unknown[] = [];
      skip();
      if (text[i] === "]") {
        i++;
        return arr;
      }
      for (;;) {
        arr.push(value(depth + 1));
        skip();
        if (text[i] === ",") {
          i++;
          continue;
        }
        if (text[i] === "]") {
          i++;
          return arr;
        }
        fail("expected ',' or ']'");
      }
    }
    if (c === '"') return string();
    if (text.startsWith("true", i)) {
      i += 4;
      return true;
    }
    if (text.startsWith("false", i)) {
      i += 5;
      return false;
    }
    if (text.startsWith("null", i)) {
      i += 4;
      return null;
    }
    NUMBER.lastIndex = i;
    const m = NUMBER.exec(text);
    if (m === null) fail(c === undefined ? "unexpected end" : `unexpected ${JSON.stringify(c)}`);
    i = NUMBER.lastIndex;
    return new JsonNumber(m![0]);
  };
  const result = value(0);
  skip();
  if (i !== text.length) fail("trailing text");
  return result;
}

// ---------------------------------------------------------------- writing

const NEEDS_ESCAPE = /["\\\u0000-\u001f<>&\u2028\u2029\ud800-\udfff]/;
const ESCAPES = /["\\\u0000-\u001f<>&\u2028\u2029]|[\ud800-\udbff][\udc00-\udfff]|[\ud800-\udfff]/g;
const NAMED: Record<string, string> = {
  '"': '\\"', "\\": "\\\\", "\b": "\\b", "\f": "\\f", "\n": "\\n", "\r": "\\r", "\t": "\\t",
};

function escapeChar(c: string): string {
  if (c.length === 2) return c; // a valid surrogate pair
  const named = NAMED[c];
  if (named !== undefined) return named;
  const code = c.charCodeAt(0);
  if (code >= 0xd800 && code <= 0xdfff) return "\ufffd";
  return "\\u" + code.toString(16).padStart(4, "0");
}

/** A JSON string literal, escaped the canonical way. */
export function quote(s: string): string {
  return NEEDS_ESCAPE.test(s) ? '"' + s.replace(ESCAPES, escapeChar) + '"' : '"' + s + '"';
}

/** `s` with lone surrogates replaced by U+FFFD, as the kernel decodes them. */
export function wellFormed(s: string): string {
  return /[\ud800-\udfff]/.test(s) ? s.replace(/[\ud800-\udbff][\udc00-\udfff]|[\ud800-\udfff]/g, (c) => (c.length === 2 ? c : "\ufffd")) : s;
}

// UTF-16 code unit order differs from code point (UTF-8 byte) order only
// between surrogates and U+E000..U+FFFF: shift the surrogates above them.
function unitKey(u: number): number {
  return u < 0xd800 ? u : u >= 0xe000 ? u - 0x800 : u + 0x2000;
}

/** Compare two strings by their UTF-8 bytes. */
export function compareUtf8(a: string, b: string): number {
  const n = Math.min(a.length, b.length);
  for (let k = 0; k < n; k++) {
    const x = a.charCodeAt(k);
    const y = b.charCodeAt(k);
    if (x !== y) return unitKey(x) - unitKey(y);
  }
  return a.length - b.length;
}

/** How `canonicalJson` treats values plain JSON cannot hold. */
export type Strictness = "lenient" | "strict";

/** Thrown by strict canonicalisation and by result encoding: names the type. */
export class NotJsonError extends TypeError {
  constructor(readonly typeName: string, detail?: string) {
    super(detail ?? `${typeName} is not JSON-serializable`);
    this.name = "NotJsonError";
  }
}

/** The plain type name of a value, as failure reasons show it. */
export function typeName(value: unknown): string {
  if (value === null) return "null";
  if (typeof value === "object" || typeof value === "function") {
    const ctor = (value as { constructor?: { name?: unknown } }).constructor;
    if (ctor && typeof ctor.name === "string" && ctor.name) return ctor.name;
    return typeof value === "function" ? "Function" : "Object";
  }
  return typeof value;
}

function isPlainObject(v: object): boolean {
  const proto = Object.getPrototypeOf(v) as unknown;
  return proto === Object.prototype || proto === null;
}

function write(v: unknown, out: string[], strict: boolean, seen: Set<object>, inArray: boolean): boolean {
  switch (typeof v) {
    case "string":
      out.push(quote(v));
      return true;
    case "boolean":
      out.push(v ? "true" : "false");
      return true;
    case "number":
      if (!Number.isFinite(v)) {
        if (strict) throw new NotJsonError("number", `${v} is not JSON-serializable`);
        out.push("null");
        return true;
      }
      out.push(JSON.stringify(v));
      return true;
    case "bigint":
      if (strict) throw new NotJsonError("bigint");
      out.push(v.toString());
      return true;
    case "undefined":
    case "function":
    case "symbol":
      if (strict) throw new NotJsonError(v === undefined ? "undefined" : typeName(v));
      if (inArray) out.push("null");
      return inArray;
  }
  if (v === null) {
    out.push("null");
    return true;
  }
  const obj = v as object;
  if (obj instanceof JsonNumber) {
    out.push(obj.text);
    return true;
  }
  const toJSON = (obj as { toJSON?: unknown }).toJSON;
  if (typeof toJSON === "function") {
    return write((toJSON as () => unknown).call(obj), out, strict, seen, inArray);
  }
  if (seen.has(obj)) throw new NotJsonError(typeName(obj), "a circular structure is not JSON-serializable");
  seen.add(obj);
  try {
    if (Array.isArray(obj)) {
      out.push("[");
      for (let k = 0; k < obj.length; k++) {
        if (k) out.push(",");
        write(obj[k], out, strict, seen, true);
      }
      out.push("]");
      return true;
    }
    if (strict && !isPlainObject(obj)) throw new NotJsonError(typeName(obj));
    const keys = Object.keys(obj).map((k) => [wellFormed(k), k] as const);
    keys.sort((a, b) => compareUtf8(a[0], b[0]));
    out.push("{");
    let first = true;
    for (const [clean, key] of keys) {
      const mark = out.length;
      out.push(first ? "" : ",", quote(clean), ":");
      if (write((obj as Record<string, unknown>)[key], out, strict, seen, false)) first = false;
      else out.length = mark;
    }
    out.push("}");
    return true;
  } finally {
    seen.delete(obj);
  }
}

/**
 * Canonical text of a JavaScript value (or of a value from {@link parseJson}).
 *
 * Lenient (the default, for step args) follows `JSON.stringify`: `toJSON` is
 * used, `undefined` members are left out, non-finite numbers become `null`.
 * Strict (driver configurations and bindings) throws {@link NotJsonError}
 * for anything plain JSON cannot hold, including class instances without
 * `toJSON`.
 */
export function canonicalJson(value: unknown, strictness: Strictness = "lenient"): string {
  const out: string[] = [];
  if (!write(value, out, strictness === "strict", new Set(), false)) return "null";
  return out.join("");
}

/** Canonical text of raw JSON; empty or absent text is `null`. */
export function canonicalText(text: string | null | undefined): string {
  if (text == null || text.trim() === "") return "null";
  return canonicalJson(parseJson(text));
}

/** Lowercase hex SHA-256 of canonical args text. */
export function argsHash(canonical: string): string {
  return createHash("sha256").update(canonical, "utf8").digest("hex");
}

export const NULL_ARGS_HASH = argsHash("null");

/** The length-prefixed fields a step id hashes. */
export function stepIdPreimage(executionId: string, kind: string, target: string, hashHex: string, occurrence: number): string {
  return [executionId.toLowerCase(), kind, target, hashHex, String(occurrence)]
    .map((f) => `${Buffer.byteLength(f, "utf8")}:${f}`)
    .join("");
}

/** The kernel's step id: SHA-256 over the length-prefixed fields. */
export function stepId(executionId: string, kind: string, target: string, hashHex: string, occurrence: number): string {
  return createHash("sha256").update(stepIdPreimage(executionId, kind, target, hashHex, occurrence), "utf8").digest("hex");
}
