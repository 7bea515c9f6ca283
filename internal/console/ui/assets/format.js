// Times, durations and ids as the console shows them.

/**
 * A time as the reader's clock shows it, to the second.
 * @param {string | undefined} iso
 */
export function when(iso) {
  if (!iso) return "";
  const d = new Date(iso);
  return d.toLocaleString(undefined, { year: "numeric", month: "short", day: "numeric", hour: "2-digit", minute: "2-digit", second: "2-digit" });
}

/**
 * A time of day to the millisecond, for timelines.
 * @param {string | undefined} iso
 */
export function clock(iso) {
  if (!iso) return "";
  const d = new Date(iso);
  const pad = (/** @type {number} */ n, w = 2) => String(n).padStart(w, "0");
  return `${pad(d.getHours())}:${pad(d.getMinutes())}:${pad(d.getSeconds())}.${pad(d.getMilliseconds(), 3)}`;
}

/**
 * A duration in words: 850 ms, 4.2 s, 3 m 5 s, 2 h 10 m, 3 d 4 h.
 * @param {number} ms
 */
export function duration(ms) {
  if (!Number.isFinite(ms) || ms < 0) return "";
  if (ms < 1000) return `${Math.round(ms)} ms`;
  const s = ms / 1000;
  if (s < 60) return `${s.toFixed(1)} s`;
  const m = Math.floor(s / 60);
  if (m < 60) return `${m} m ${Math.floor(s % 60)} s`;
  const hours = Math.floor(m / 60);
  if (hours < 48) return `${hours} h ${m % 60} m`;
  return `${Math.floor(hours / 24)} d ${hours % 24} h`;
}

/** Statuses after which nothing changes. */
export const TERMINAL = ["completed", "failed", "cancelled"];

/**
 * How long an execution ran: to its last status change when it ended, to
 * now while it runs.
 * @param {{created_at: string, updated_at: string, status: string}} e
 */
export function runTime(e) {
  const end = TERMINAL.includes(e.status) ? Date.parse(e.updated_at) : Date.now();
  return duration(end - Date.parse(e.created_at));
}

/**
 * A UUIDv7 is time first, so executions made together share their first
 * digits: the short form keeps the random end.
 * @param {string} id
 */
export function shortId(id) {
  return `…${id.slice(-8)}`;
}

/** @param {number} n @param {string} word */
export function plural(n, word) {
  return `${n} ${word}${n === 1 ? "" : "s"}`;
}

/** The UUID form the API answers with. */
export const UUID = /^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$/;
