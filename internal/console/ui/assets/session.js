// Who the console is: the answer of GET /v0/whoami. The console offers only
// what the role may do; the API checks every request anyway.

import { call } from "./api.js";

/**
 * @typedef {object} Session
 * @property {string} role viewer, approver, operator or admin
 * @property {boolean} key whether an API key (through the session cookie) says who
 * @property {string} [name] the key's name
 * @property {boolean} auth whether the kernel requires credentials
 */

/** Roles, least to most powerful, as docs/protocol/auth.md §2.1 orders them. */
export const ROLES = ["viewer", "approver", "operator", "admin"];

/**
 * Whether a session's role allows what needs role.
 * @param {Session} s
 * @param {string} role
 */
export function can(s, role) {
  const have = ROLES.indexOf(s.role);
  return have >= 0 && have >= ROLES.indexOf(role);
}

/**
 * The current session; null when the kernel wants a sign-in.
 * @returns {Promise<Session | null>}
 */
export async function whoami() {
  try {
    return (await call("GET", "/v0/whoami", { quiet401: true })).data;
  } catch (e) {
    if (e instanceof Error && "status" in e && e.status === 401) return null;
    throw e;
  }
}

/**
 * Exchanges an API key for the session cookie. The key travels in this one
 * request's header and is kept nowhere.
 * @param {string} key
 */
export async function signIn(key) {
  await call("POST", "/v0/session", { headers: { Authorization: `Bearer ${key}` }, quiet401: true });
}

export async function signOut() {
  await call("DELETE", "/v0/session", { quiet401: true });
}
