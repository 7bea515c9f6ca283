// The console's only way to the kernel: the /v0 API, same origin, with the
// session cookie the browser sends by itself. The key a user signs in with
// is sent once, in a header, and kept nowhere.

/** An error answer of the API (the JSON envelope of docs/protocol/errors.md §1). */
export class ApiError extends Error {
  /**
   * @param {number} status
   * @param {string} code
   * @param {string} message
   * @param {Record<string, unknown> | undefined} details
   */
  constructor(status, code, message, details) {
    super(message);
    this.status = status;
    this.code = code;
    this.details = details;
  }
}

/** Fired on window when the API answers 401: the session has ended. */
export const UNAUTHORIZED = "rebuno:unauthorized";

/**
 * @typedef {object} Answer
 * @property {any} data the parsed JSON (null for 204)
 * @property {string} text the body as sent, for showing user JSON verbatim
 */

/**
 * Calls the API.
 * @param {string} method
 * @param {string} path
 * @param {{body?: unknown, json?: string, headers?: Record<string, string>, quiet401?: boolean}} [opts]
 *   body is sent as JSON; json is JSON text sent as it is
 * @returns {Promise<Answer>}
 */
export async function call(method, path, opts = {}) {
  /** @type {Record<string, string>} */
  const headers = { Accept: "application/json", ...opts.headers };
  /** @type {RequestInit} */
  const init = { method, headers, credentials: "same-origin", cache: "no-store" };
  if (opts.body !== undefined || opts.json !== undefined) {
    headers["Content-Type"] = "application/json";
    init.body = opts.json ?? JSON.stringify(opts.body);
  }
  let r;
  try {
    r = await fetch(path, init);
  } catch (e) {
    throw new ApiError(0, "network", `the kernel did not answer (${e instanceof Error ? e.message : e})`, undefined);
  }
  const text = r.status === 204 ? "" : await r.text();
  let data = null;
  try {
    data = text ? JSON.parse(text) : null;
  } catch {
    data = null;
  }
  if (!r.ok) {
    if (r.status === 401 && !opts.quiet401) window.dispatchEvent(new Event(UNAUTHORIZED));
    throw new ApiError(r.status, data?.code ?? "", data?.message ?? `${r.status} ${r.statusText}`, data?.details);
  }
  return { data, text };
}

/**
 * GET, answering the parsed JSON.
 * @param {string} path
 */
export async function get(path) {
  return (await call("GET", path)).data;
}

/**
 * Builds a query string from the values that are set.
 * @param {Record<string, string | number | undefined | null>} params
 */
export function query(params) {
  const q = new URLSearchParams();
  for (const [k, v] of Object.entries(params)) {
    if (v !== undefined && v !== null && v !== "") q.set(k, String(v));
  }
  const s = q.toString();
  return s ? `?${s}` : "";
}

/** @param {string} s */
export const seg = (s) => encodeURIComponent(s);
