// One execution: what it is, where it sits among its forks, and its
// timeline.

import { ApiError, call, get, seg } from "../api.js";
import { badge, errorBox, fill, h, link } from "../dom.js";
import { TERMINAL, UUID, runTime, shortId, when } from "../format.js";
import { isNull, member, parse } from "../json.js";
import { can } from "../session.js";
import { block, timeline } from "./timeline.js";

/** How far up a chain of forks the lineage reads. */
const ANCESTORS = 20;

/**
 * @typedef {object} Execution
 * @property {string} id
 * @property {string} agent_id
 * @property {string} status
 * @property {string} created_at
 * @property {string} updated_at
 * @property {string} [agent_version]
 * @property {string} [failure_reason]
 * @property {string} [parent_execution_id]
 * @property {string} [on_behalf_of]
 * @property {string} [forked_from]
 * @property {number} [fork_seq]
 * @property {string[]} resource_keys
 */

/** @param {import("../app.js").PageContext} ctx @returns {import("../app.js").Page} */
export function page(ctx) {
  const id = ctx.params.id?.toLowerCase() ?? "";
  const summary = h("div", { class: "summary" });
  const actions = h("div", { class: "actions" });
  const lineage = h("div", { class: "lineage" });
  const holder = h("div");
  const node = h("section", null,
    h("div", { class: "title-row" }, h("h1", null, "Execution ", h("span", { class: "mono id" }, id)), actions),
    summary,
    h("h2", null, "Forks"), lineage,
    holder);
  if (!UUID.test(id)) {
    fill(summary, errorBox("not an execution id"));
    return { title: "Execution", node };
  }
  const base = `/v0/executions/${seg(id)}`;
  /** @type {{dispose: () => void} | null} */
  let tl = null;
  let disposed = false;

  async function refresh() {
    const { data, text } = await call("GET", base);
    /** @type {Execution} */
    const e = data;
    const raw = parse(text);
    /** @type {Array<[string, ...import("../dom.js").Child[]] | null>} */
    const rows = [
      ["agent", link(`/ui/agents/${seg(e.agent_id)}`, e.agent_id), e.agent_version ? ` version ${e.agent_version}` : ""],
      ["status", badge(e.status), e.failure_reason ? ` ${e.failure_reason}` : ""],
      ["created", h("time", { datetime: e.created_at }, when(e.created_at))],
      ["updated", h("time", { datetime: e.updated_at }, when(e.updated_at))],
      ["duration", runTime(e)],
      e.on_behalf_of ? ["on behalf of", e.on_behalf_of] : null,
      e.parent_execution_id ? ["continues", h("a", { href: `/ui/executions/${seg(e.parent_execution_id)}`, class: "mono" }, e.parent_execution_id)] : null,
      e.forked_from ? ["forked from", h("a", { href: `/ui/executions/${seg(e.forked_from)}`, class: "mono" }, e.forked_from), ` at event #${e.fork_seq}`] : null,
      e.resource_keys.length ? ["resources", e.resource_keys.join(", ")] : null,
    ];
    const input = member(raw, "input");
    const output = member(raw, "output");
    fill(summary,
      h("dl", { class: "facts" }, rows.map((r) => r && [h("dt", null, r[0]), h("dd", { "data-fact": r[0] }, r.slice(1))])),
      input && !isNull(input) ? block("input", input) : null,
      output ? block("output", output) : null);
    fill(actions, can(ctx.session, "operator") && !TERMINAL.includes(e.status)
      ? h("button", { type: "button", class: "danger", onclick: () => void cancelExecution() }, "Cancel execution")
      : null);
    return e;
  }

  async function cancelExecution() {
    if (!confirm("Cancel this execution? Its open steps are cancelled and its agent is told nothing more.")) return;
    try {
      await call("POST", `${base}/cancel`);
    } catch (e) {
      actions.append(errorBox(e));
    }
    await refresh().catch(() => {});
  }

  (async () => {
    const e = await refresh();
    const coverage = await get(`${base}/coverage`);
    if (disposed) return;
    const t = timeline({
      execution: e, lastSeq: coverage.last_event_seq, canFork: can(ctx.session, "operator"), go: ctx.go,
      onEvent: (ev) => {
        if (ev.type.startsWith("execution.") || ev.type.startsWith("approval.")) void refresh().catch(() => {});
      },
    });
    tl = t;
    fill(holder, t.node);
    fill(lineage, await tree(e));
  })().catch((err) => fill(summary, errorBox(err instanceof ApiError && err.status === 404 ? "No such execution." : err)));

  return { title: `Execution ${shortId(id)}`, node, dispose: () => { disposed = true; tl?.dispose(); } };
}

/**
 * The chain of forks above an execution and the forks made from it.
 * @param {Execution} e
 */
async function tree(e) {
  /** @type {Execution[]} */
  const chain = [e];
  let cur = e;
  let cut = false;
  for (let i = 0; i < ANCESTORS && cur.forked_from; i++) {
    try {
      cur = await get(`/v0/executions/${seg(cur.forked_from)}`);
    } catch {
      cut = true;
      break;
    }
    chain.unshift(cur);
  }
  const children = await get(`/v0/executions/${seg(e.id)}/forks?limit=50`);
  /** @type {Execution[]} */
  const forks = children.executions;
  if (chain.length === 1 && forks.length === 0) return h("p", { class: "muted" }, "Not a fork, and not forked yet.");
  const item = (/** @type {Execution} */ x, /** @type {boolean} */ here) => [
    here ? h("strong", { class: "mono" }, shortId(x.id), " (this one)") : h("a", { href: `/ui/executions/${seg(x.id)}`, class: "mono", title: x.id }, shortId(x.id)),
    " ", badge(x.status), x.fork_seq ? h("span", { class: "muted small" }, ` forked at #${x.fork_seq}`) : null];
  /** @type {HTMLElement} */
  let inner = h("ul", null, forks.map((f) => h("li", null, item(f, false))),
    children.next_cursor ? h("li", { class: "muted" }, "and more") : null);
  for (let i = chain.length - 1; i >= 0; i--) {
    const x = /** @type {Execution} */ (chain[i]);
    const li = h("li", null, item(x, x.id === e.id), inner.childElementCount ? inner : null);
    inner = h("ul", null, li);
  }
  inner.className = "tree";
  return cut ? h("div", null, h("p", { class: "muted small" }, "Older forks in this chain are gone."), inner) : inner;
}
