/**
 * HMAC signatures (docs/protocol/vectors/signatures.json).
 *
 * - Agent → kernel requests carry a request-bound `v1` signature over six
 *   lines (constant, method, request target, timestamp, dispatch id,
 *   dispatch attempt) followed by the raw body.
 * - Submits also carry `Rebuno-Occurrence-Signature`, which binds the
 *   `Rebuno-Step-Occurrence` value to the request's own `v1` signature.
 * - Kernel → agent webhooks carry the body-only `sha256=` signature.
 *
 * Every MAC is HMAC-SHA256 keyed with the agent secret's UTF-8 bytes, written
 * as 64 lowercase hex digits, and compared in constant time.
 */

import { createHmac, timingSafeEqual } from "node:crypto";

export const V1_PREFIX = "rebuno-request-v1";
export const OCCURRENCE_PREFIX = "rebuno-occurrence-v1";
const LEGACY = /^sha256=[0-9a-f]{64}$/;

function mac(secret: string, ...parts: (string | Uint8Array)[]): string {
  const h = createHmac("sha256", Buffer.from(secret, "utf8"));
  for (const p of parts) h.update(p);
  return h.digest("hex");
}

/** The head of a v1 request's signed message: six LF-terminated lines. */
export function v1Head(method: string, target: string, timestamp: string, dispatchId: string | null, attempt: string | null): string {
  return [V1_PREFIX, method.toUpperCase(), target, timestamp, dispatchId ?? "", attempt ?? ""].join("\n") + "\n";
}

/** The signed message of a v1 request: the six lines, then the body. */
export function v1Message(method: string, target: string, timestamp: string, dispatchId: string | null, attempt: string | null, body: Uint8Array): Buffer {
  return Buffer.concat([Buffer.from(v1Head(method, target, timestamp, dispatchId, attempt), "utf8"), body]);
}

/**
 * The `Rebuno-Signature` value of a v1 request (`v1=<hex>`). `target` is the
 * request target exactly as sent: the escaped path, plus `?query` if any.
 */
export function signV1(secret: string, method: string, target: string, timestamp: string, dispatchId: string | null, attempt: string | null, body: Uint8Array): string {
  return "v1=" + mac(secret, v1Head(method, target, timestamp, dispatchId, attempt), body);
}

/** The `Rebuno-Occurrence-Signature` value binding an occurrence to a request's v1 signature. */
export function signOccurrence(secret: string, requestSignature: string, occurrence: string): string {
  return "v1=" + mac(secret, `${OCCURRENCE_PREFIX}\n${requestSignature}\n${occurrence}`);
}

/** The body-only signature (`sha256=<hex>`) the kernel puts on webhooks. */
export function signLegacy(secret: string, body: Uint8Array): string {
  return "sha256=" + mac(secret, body);
}

/** Check a webhook's `Rebuno-Signature` over the exact body bytes. */
export function verifyWebhook(secret: string, body: Uint8Array, header: string | undefined): boolean {
  if (header === undefined || !LEGACY.test(header)) return false;
  return timingSafeEqual(Buffer.from(header, "ascii"), Buffer.from(signLegacy(secret, body), "ascii"));
}
