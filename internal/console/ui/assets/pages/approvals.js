// The approvals inbox: every pending approval across executions, with the
// step it holds back, and Approve / Deny for the roles that may decide.
// With a key the decider is the key's name; the kernel records it whatever
// a request says (docs/protocol/auth.md §2.1).

import { call, get, query, seg } from "../api.js";
import { errorBox, fill, h, link } from "../dom.js";
import { shortId, when } from "../format.js";
import { isNull, member, parse } from "../json.js";
import { coalesce, follow } from "../live.js";
import { can } from "../session.js";
import { block } from "./timeline.js";

/**
 * @typedef {object} Approval
 * @property {string} id
 * @property {string} execution_id
 * @property {string} step_id
 * @property {string} agent_id
 * @property {string} kind
 * @property {string} target
 * @property {string} status
 * @property {string[]} approvers
 * @property {string} timeout_at
 * @property {string} created_at
 * @property {string} [message]
 * @property {string} [decided_by]
 * @property {string} [rationale]
 * @property {string} [decided_at]
 */

const LIMIT = 200;

/** @param {import("../app.js").PageContext} ctx @returns {import("../app.js").Page} */
export function page(ctx) {
  const s = ctx.session;
  const mayDecide = can(s, "approver");
  // Without a key (auth off) the kernel takes the decider's name from the
  // request, so the console asks for one.
  const nameInput = h("input", { id: "decider", name: "decided_by", autocomplete: "name", placeholder: "your name" });
  const who = !mayDecide
    ? h("p", { class: "note" }, `Your role (${s.role}) cannot decide approvals; an approver, operator or admin key can.`)
    : s.key
      ? h("p", { class: "muted" }, "Decisions are recorded as made by ", h("strong", null, s.name ?? ""), ".")
      : h("p", { class: "muted" }, h("label", { for: "decider" }, "Decide as "), nameInput, " (recorded as the decider; no key says who you are)");
  const pending = h("div", { class: "cards" });
  const decided = h("div", { class: "cards" });
  const problem = h("div");
  const more = h("p", { class: "muted small" });
  /** @type {Map<string, HTMLElement>} */
  const cards = new Map();
  /** @type {Set<string>} */
  const decidedHere = new Set();

  const reload = coalesce(async () => {
    try {
      /** @type {Approval[]} */
      const list = await get(`/v0/approvals${query({ status: "pending", limit: LIMIT })}`);
      const ids = new Set(list.map((a) => a.id));
      for (const [id, el] of cards) {
        if (!ids.has(id) && !decidedHere.has(id)) {
          el.remove();
          cards.delete(id);
        }
      }
      for (const a of list) {
        if (!cards.has(a.id)) {
          const el = card(a);
          cards.set(a.id, el);
          pending.append(el);
        }
      }
      if (!pending.childElementCount) fill(pending, h("p", { class: "muted empty" }, "No approvals are waiting."));
      else pending.querySelector(".empty")?.remove();
      fill(more, list.length === LIMIT ? `Showing the oldest ${LIMIT}; decide some to see the rest.` : "");
      problem.replaceChildren();
    } catch (e) {
      fill(problem, errorBox(e));
    }
  });
  const live = follow("/v0/execution-summaries/stream", { onMessage: () => reload() });
  reload();

  /** @param {Approval} a */
  function card(a) {
    const args = h("div");
    const reason = h("textarea", { id: `reason-${a.id}`, name: "rationale", rows: 2, placeholder: "optional" });
    const status = h("div", { class: "form-status" });
    const decide = async (/** @type {boolean} */ grant) => {
      for (const b of el.querySelectorAll("button")) b.disabled = true;
      /** @type {Record<string, string>} */
      const body = {};
      if (reason.value.trim()) body.rationale = reason.value.trim();
      if (!s.key && nameInput.value.trim()) body.decided_by = nameInput.value.trim();
      try {
        await call("POST", `/v0/approvals/${seg(a.id)}/${grant ? "grant" : "deny"}`, { body });
        decidedHere.add(a.id);
        /** @type {Approval} */
        const now = await get(`/v0/approvals/${seg(a.id)}`);
        fill(form, h("p", { class: `decision ${now.status}` },
          now.status === "granted" ? "Approved" : now.status === "denied" ? "Denied" : now.status,
          now.decided_by ? [" by ", h("strong", { class: "decider" }, now.decided_by)] : "",
          now.decided_at ? ` at ${when(now.decided_at)}` : "",
          now.rationale ? [": ", h("span", { class: "rationale" }, now.rationale)] : ""));
        decided.prepend(el);
      } catch (e) {
        fill(status, errorBox(e));
        for (const b of el.querySelectorAll("button")) b.disabled = false;
      }
    };
    const form = mayDecide
      ? h("div", { class: "decide" },
        h("label", { for: `reason-${a.id}` }, "Reason"), reason,
        h("div", { class: "actions" },
          h("button", { type: "button", class: "approve", onclick: () => void decide(true) }, "Approve"),
          h("button", { type: "button", class: "deny", onclick: () => void decide(false) }, "Deny")),
        status)
      : h("div");
    const el = h("article", { class: "card approval", "data-approval-id": a.id },
      h("header", null,
        h("span", { class: "kind" }, a.kind), " ", h("strong", { class: "target" }, a.target),
        " in ", h("a", { href: `/ui/executions/${seg(a.execution_id)}`, class: "mono", title: a.execution_id }, shortId(a.execution_id)),
        " of ", link(`/ui/agents/${seg(a.agent_id)}`, a.agent_id)),
      a.message ? h("p", { class: "message" }, a.message) : null,
      h("p", { class: "muted small" },
        `asked ${when(a.created_at)} · expires ${when(a.timeout_at)} · `,
        a.approvers.length ? `approvers: ${a.approvers.join(", ")}` : "anyone may decide"),
      args,
      form);
    call("GET", `/v0/executions/${seg(a.execution_id)}/steps/${seg(a.step_id)}`).then(({ text }) => {
      const v = member(parse(text), "args");
      if (v && !isNull(v)) fill(args, block("arguments", v));
    }, () => {});
    return el;
  }

  const node = h("section", null,
    h("div", { class: "title-row" }, h("h1", null, "Approvals"), live.indicator),
    who, problem,
    h("h2", null, "Waiting"), pending, more,
    h("h2", null, "Decided here"), decided);
  return { title: "Approvals", node, dispose: () => live.close() };
}
