// An execution's timeline: its event log, a window at a time, then live.
//
// It opens on the newest WINDOW events (a long history is never read whole),
// loads earlier ones on request, and follows the SSE tail from the last event
// it has. Steps' arguments and results live on the steps, not the events: each
// step in the window is read once, and again when it ends. Live output of a
// running step (LLM tokens) comes from the delta stream.

import { call, seg } from "../api.js";
import { fill, h, link } from "../dom.js";
import { clock, plural, shortId } from "../format.js";
import { display, isNull, member, parse } from "../json.js";
import { follow } from "../live.js";
import { openFork } from "./fork.js";

/** Events read per page. */
export const WINDOW = 200;
/** Characters of a value shown before "Show all". */
const SHOW = 4000;
/** Step reads at once. */
const STEP_READS = 4;
/** Events that end a step. */
const ENDS = ["step.succeeded", "step.failed", "step.denied", "step.cancelled"];

/**
 * @typedef {object} WireEvent
 * @property {string} execution_id
 * @property {number} event_seq
 * @property {string} type
 * @property {Record<string, any>} payload
 * @property {string} occurred_at
 */

/**
 * @typedef {object} TimelineOptions
 * @property {{id: string, status: string, created_at: string, forked_from?: string}} execution
 * @property {number} lastSeq the log's last event_seq when the page opened
 * @property {boolean} canFork
 * @property {(path: string) => void} go
 * @property {(ev: WireEvent) => void} onEvent called for every event that arrives live
 */

/**
 * @param {TimelineOptions} o
 * @returns {{node: HTMLElement, dispose: () => void}}
 */
export function timeline(o) {
  const id = o.execution.id;
  const base = `/v0/executions/${seg(id)}`;
  const list = h("ol", { class: "timeline", "aria-label": "Events" });
  const earlier = h("button", { type: "button", class: "quiet", onclick: () => void loadEarlier() }, "Load earlier events");
  const status = h("p", { class: "muted small" });
  const header = h("div", { class: "timeline-head" }, status);
  /** @type {import("../live.js").Live | null} */
  let tail = null;
  /** @type {import("../live.js").Live | null} */
  let deltas = null;
  let first = 0; // lowest seq shown
  let last = 0; // highest seq shown
  let disposed = false;

  /** @type {Map<string, Promise<import("../json.js").JsonNode | null>>} */
  const steps = new Map();
  /** Slots waiting for a step's arguments or result, by step id. */
  /** @type {Map<string, Array<{part: "args" | "result", el: HTMLElement}>>} */
  const slots = new Map();
  /** @type {Map<string, HTMLElement>} */
  const streams = new Map();
  const reads = limiter(STEP_READS);

  /**
   * Reads events after a seq and shows them at the start or the end.
   * @param {number} after
   * @param {number} limit
   * @param {"start" | "end"} where
   */
  async function load(after, limit, where) {
    const { data, text } = await call("GET", `${base}/events?after_seq=${after}&limit=${limit}`);
    const nodes = parse(text);
    /** @type {WireEvent[]} */
    const evs = data;
    const rows = evs.map((ev, i) => row(ev, member(nodes.kind === "array" ? nodes.elems[i] : undefined, "payload"), false));
    if (where === "start") list.prepend(...rows);
    else list.append(...rows);
    const lo = evs[0]?.event_seq;
    const hi = evs[evs.length - 1]?.event_seq;
    if (lo !== undefined && hi !== undefined) {
      first = first === 0 ? lo : Math.min(first, lo);
      last = Math.max(last, hi);
    }
    return evs.length;
  }

  async function loadEarlier() {
    earlier.disabled = true;
    const after = Math.max(0, first - 1 - WINDOW);
    await load(after, first - 1 - after, "start");
    showHead();
  }

  function showHead() {
    fill(header, first > 1 ? earlier : null, status, tail ? [h("span", { class: "small muted" }, "events"), tail.indicator] : null,
      deltas ? [h("span", { class: "small muted" }, "live output"), deltas.indicator] : null);
    earlier.disabled = false;
    status.textContent = showing();
  }

  function showing() {
    return last ? `Showing events ${first}–${last}` + (first > 1 ? ` of the log (${plural(first - 1, "earlier event")} not loaded)` : "") : "No events.";
  }

  async function open() {
    const start = Math.max(0, o.lastSeq - WINDOW);
    await load(start, WINDOW, "end");
    showHead();
    if (disposed) return;
    const terminal = ["completed", "failed", "cancelled"].includes(o.execution.status);
    if (terminal && last >= o.lastSeq) return;
    tail = follow(`${base}/events/stream?after_seq=${last}`, { onMessage: (m) => onFrame(m.data), onEnd: () => deltas?.close() });
    tail.indicator.dataset.stream = "events";
    if (!terminal) {
      deltas = follow(`${base}/stream`, { onMessage: (m) => onDelta(m.data) });
      deltas.indicator.dataset.stream = "deltas";
    }
    showHead();
    onScroll();
  }

  // Whether the reader is at the end of the page, kept up to date as they
  // scroll rather than measured per event: measuring would lay the page out
  // again before every new row.
  let atEnd = false;
  let scrollPending = false;
  const onScroll = () => { atEnd = window.innerHeight + window.scrollY >= document.body.scrollHeight - 40; };
  window.addEventListener("scroll", onScroll, { passive: true });

  /** @param {string} data */
  function onFrame(data) {
    /** @type {WireEvent} */
    const ev = JSON.parse(data);
    if (ev.event_seq <= last) return;
    list.append(row(ev, member(parse(data), "payload"), true));
    if (first === 0) first = ev.event_seq;
    last = ev.event_seq;
    status.textContent = showing();
    if (atEnd && !scrollPending) {
      scrollPending = true;
      requestAnimationFrame(() => {
        scrollPending = false;
        window.scrollTo({ top: document.body.scrollHeight });
      });
    }
    o.onEvent(ev);
  }

  /** @param {string} data */
  function onDelta(data) {
    /** @type {{step_id: string, seq: number, data: string}} */
    const d = JSON.parse(data);
    const box = streams.get(d.step_id);
    if (!box) return;
    const text = (box.dataset.raw ?? "") + d.data;
    box.dataset.raw = text;
    box.hidden = false;
    const tokens = tokensOf(text);
    const pre = box.querySelector("pre");
    if (pre) pre.textContent = tokens ?? text;
  }

  /**
   * One event.
   * @param {WireEvent} ev
   * @param {import("../json.js").JsonNode | undefined} payload the payload as sent
   * @param {boolean} live whether it arrived on the tail
   */
  function row(ev, payload, live) {
    const p = ev.payload ?? {};
    /** @type {import("../dom.js").Child[]} */
    const marks = [];
    if (o.execution.forked_from && ev.event_seq > 2 && ev.occurred_at < o.execution.created_at) {
      marks.push(h("span", { class: "mark", title: "copied from the source: this step replays in the fork" }, "copied"));
    }
    if (p.retry === true) marks.push(h("span", { class: "mark", title: "re-run of a step that was executing when its attempt ended" }, "retry"));
    const body = h("div", { class: "ev-body" });
    const li = h("li", { class: `event ev-${ev.type.split(".")[0]}`, id: `event-${ev.event_seq}`, "data-seq": ev.event_seq, "data-type": ev.type },
      h("div", { class: "ev-head" },
        h("a", { class: "seq", href: `#event-${ev.event_seq}` }, `#${ev.event_seq}`),
        h("time", { datetime: ev.occurred_at, title: ev.occurred_at }, clock(ev.occurred_at)),
        h("span", { class: "ev-type" }, ev.type),
        h("span", { class: "ev-summary" }, summary(ev)),
        marks,
        o.canFork ? h("button", { type: "button", class: "fork-here", onclick: () => openFork({ executionId: id, seq: ev.event_seq, go: o.go }) }, "Fork here") : null),
      body);
    details(ev, payload, body, live);
    return li;
  }

  /**
   * The line that says what happened.
   * @param {WireEvent} ev
   * @returns {import("../dom.js").Child}
   */
  function summary(ev) {
    const p = ev.payload ?? {};
    const step = () => [h("span", { class: "kind" }, p.step_type), " ", h("strong", { class: "target" }, p.target)];
    switch (ev.type) {
      case "execution.created": return ["agent ", link(`/ui/agents/${seg(p.agent_id)}`, p.agent_id), p.agent_version ? ` version ${p.agent_version}` : ""];
      case "execution.forked": return ["forked from ", h("a", { href: `/ui/executions/${seg(p.source_execution_id)}`, class: "mono" }, shortId(p.source_execution_id)), ` at #${p.fork_seq}`];
      case "execution.started": case "execution.blocked": case "execution.resumed": case "execution.completed":
        return p.status;
      case "execution.failed": case "execution.cancelled": return [p.status, p.reason ? `: ${p.reason}` : ""];
      case "step.proposed": return step();
      case "step.allowed": return [step(), " ", p.approval_id ? "allowed by an approval" : `allowed by rule ${p.rule_id ?? ""}`];
      case "step.executing": return [step(), " executing", p.generations ? ` (generations ${Object.entries(p.generations).map(([k, g]) => `${k} ${g}`).join(", ")})` : ""];
      case "step.awaiting_approval": return [step(), ` awaiting approval (rule ${p.rule_id})`];
      case "step.denied": return [step(), p.rule_id ? ` denied by rule ${p.rule_id}` : " denied"];
      case "step.succeeded": return [step(), " succeeded"];
      case "step.failed": return [step(), " failed"];
      case "step.cancelled": return [step(), " cancelled"];
      case "step.rate_limited": return [step(), ` rate limited by rule ${p.rule_id}: ${p.reason}`, p.retry_after_ms ? ` (retry after ${p.retry_after_ms} ms)` : ""];
      case "approval.requested": return ["approval ", link("/ui/approvals", shortId(p.approval_id)), " requested"];
      case "approval.granted": case "approval.denied":
        return [`approval ${shortId(p.approval_id)} ${p.status}`, p.decided_by ? [" by ", h("strong", { class: "decider" }, p.decided_by)] : ""];
      case "approval.expired": return [`approval ${shortId(p.approval_id)} expired: ${p.rationale}`];
      case "dispatch.queued": return "delivery queued";
      case "dispatch.acked": return `delivered (attempt ${p.attempt})`;
      case "dispatch.failed": return [`delivery failed (attempt ${p.attempt})`, p.http_status ? `: HTTP ${p.http_status}` : ""];
      case "dispatch.lease_expired": return `lease expired (attempt ${p.attempt}), dispatch ${p.status}`;
      case "resource.registered": return ["resource ", h("strong", null, p.key), ` registered (driver ${p.driver_id})`];
      case "resource.bound": return ["resource ", h("strong", null, p.key), " bound"];
      case "resource.checkpointed": return ["resource ", h("strong", null, p.key), " checkpoint ", h("code", null, p.checkpoint_ref), ` covers from #${p.covered_seq}`];
      case "resource.checkpoint_failed": return ["resource ", h("strong", null, p.key), " capture refused"];
      case "resource.initialized": return ["resource ", h("strong", null, p.key), p.checkpoint_ref ? [" restored from ", h("code", null, p.checkpoint_ref)] : " starts from its initial environment"];
      default: return "";
    }
  }

  /**
   * What an event carries beyond its line: user JSON verbatim, step
   * arguments and results, live output.
   * @param {WireEvent} ev
   * @param {import("../json.js").JsonNode | undefined} payload
   * @param {HTMLElement} body
   * @param {boolean} live
   */
  function details(ev, payload, body, live) {
    const p = ev.payload ?? {};
    const stepId = typeof p.step_id === "string" ? p.step_id : "";
    // A step read before it ended lacks its result: read it again.
    if (live && ENDS.includes(ev.type)) steps.delete(stepId);
    const verbatim = (/** @type {string} */ label, /** @type {string} */ key) => {
      const v = member(payload, key);
      if (v && !isNull(v)) body.append(block(label, v));
    };
    switch (ev.type) {
      case "execution.completed": verbatim("output", "output"); break;
      case "execution.forked": verbatim("restoration", "restoration"); break;
      case "step.proposed": want(stepId, "args", body, "arguments"); break;
      case "step.executing": {
        const box = h("div", { class: "block stream", hidden: true }, h("div", { class: "block-label" }, "live output"), h("pre", { class: "json" }));
        streams.set(stepId, box);
        body.append(box);
        break;
      }
      case "step.succeeded":
        want(stepId, "args", body, "arguments", true);
        want(stepId, "result", body, "result");
        break;
      case "step.failed": case "step.denied": case "step.cancelled":
        want(stepId, "args", body, "arguments", true);
        verbatim("error", "error");
        break;
      case "approval.granted": case "approval.denied":
        if (p.rationale) body.append(h("p", { class: "rationale" }, "reason: ", p.rationale));
        break;
      case "dispatch.failed":
        if (p.error) body.append(h("p", { class: "muted" }, p.error));
        break;
      case "resource.registered": verbatim("configuration", "configuration"); break;
      case "resource.bound": verbatim("binding", "binding"); break;
      case "resource.checkpoint_failed": verbatim("error", "error"); break;
    }
  }

  /**
   * Shows a part of a step in body once the step is read.
   * @param {string} stepId
   * @param {"args" | "result"} part
   * @param {HTMLElement} body
   * @param {string} label
   * @param {boolean} [folded] inside a closed disclosure
   */
  function want(stepId, part, body, label, folded = false) {
    if (!stepId) return;
    const el = h("div", { class: "slot", "data-part": part });
    body.append(folded ? h("details", null, h("summary", null, label), el) : el);
    const list = slots.get(stepId) ?? [];
    list.push({ part, el });
    slots.set(stepId, list);
    el.dataset.label = folded ? "" : label;
    void readStep(stepId);
  }

  /** @param {string} stepId */
  async function readStep(stepId) {
    let p = steps.get(stepId);
    if (!p) {
      p = reads(() => call("GET", `${base}/steps/${seg(stepId)}`).then((a) => parse(a.text), () => null));
      steps.set(stepId, p);
    }
    const node = await p;
    for (const { part, el } of slots.get(stepId) ?? []) {
      const v = member(node ?? undefined, part);
      if (!v || isNull(v)) {
        fill(el, part === "args" && el.dataset.label ? h("p", { class: "muted small" }, "no arguments") : null);
        continue;
      }
      fill(el, block(el.dataset.label ?? "", v));
    }
  }

  void open().catch((e) => { status.textContent = e instanceof Error ? e.message : String(e); });
  return {
    node: h("section", { class: "timeline-section" }, h("h2", null, "Timeline"), header, list),
    dispose: () => {
      disposed = true;
      tail?.close();
      deltas?.close();
      window.removeEventListener("scroll", onScroll);
    },
  };
}

/**
 * A value from the log, as text, with long ones cut until asked for.
 * @param {string} label
 * @param {import("../json.js").JsonNode} node
 */
export function block(label, node) {
  const text = display(node);
  const pre = h("pre", { class: "json" }, text.length > SHOW ? text.slice(0, SHOW) : text);
  const more = text.length > SHOW
    ? h("button", { type: "button", class: "quiet", onclick: (e) => { pre.textContent = text; /** @type {HTMLElement} */ (e.currentTarget).remove(); } }, `Show all ${text.length} characters`)
    : null;
  return h("div", { class: "block" }, label ? h("div", { class: "block-label" }, label) : null, pre, more);
}

/**
 * The text a model streams, read from a provider's server-sent events as an
 * LLM step passes them on: OpenAI chat chunks (choices[].delta.content), the
 * Responses API (response.output_text.delta) and Anthropic
 * (content_block_delta). Undefined when the stream is none of those, which
 * is then shown as it came.
 * @param {string} raw
 */
export function tokensOf(raw) {
  let out = "";
  let known = false;
  for (const line of raw.split("\n")) {
    if (!line.startsWith("data:")) continue;
    let v;
    try {
      v = JSON.parse(line.slice(5));
    } catch {
      continue; // [DONE], or a line still arriving
    }
    const piece = v?.choices?.[0]?.delta?.content
      ?? (v?.type === "response.output_text.delta" ? v.delta : undefined)
      ?? (v?.type === "content_block_delta" ? v.delta?.text : undefined);
    if (typeof piece === "string") {
      out += piece;
      known = true;
    }
  }
  return known ? out : undefined;
}

/**
 * Runs at most n tasks at a time.
 * @param {number} n
 * @returns {<T>(task: () => Promise<T>) => Promise<T>}
 */
function limiter(n) {
  let active = 0;
  /** @type {Array<() => void>} */
  const waiting = [];
  return async (task) => {
    if (active >= n) await new Promise((/** @type {(v?: unknown) => void} */ r) => waiting.push(r));
    active++;
    try {
      return await task();
    } finally {
      active--;
      waiting.shift()?.();
    }
  };
}
