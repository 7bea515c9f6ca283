// Agents: each with its last webhook delivery; one agent with its policy and
// a box that explains which rule would decide a step.

import { ApiError, call, get, seg } from "../api.js";
import { errorBox, fill, h, link } from "../dom.js";
import { plural, shortId, when } from "../format.js";
import { parse } from "../json.js";

/**
 * @typedef {object} Agent
 * @property {string} id
 * @property {string} webhook_url
 * @property {string} policy_bundle
 * @property {string} registered_at
 * @property {string} updated_at
 * @property {number} [lease_timeout_seconds]
 * @property {string} [description]
 */

/**
 * @typedef {object} Delivery
 * @property {string} execution_id
 * @property {number} event_seq
 * @property {string} type
 * @property {string} status
 * @property {number} attempt
 * @property {number} [http_status]
 * @property {string} [error]
 * @property {string} at
 */

/** @param {import("../app.js").PageContext} _ctx @returns {import("../app.js").Page} */
export function listPage(_ctx) {
  const rows = h("tbody");
  const problem = h("div");
  get("/v0/agents").then((/** @type {Agent[]} */ agents) => {
    fill(rows, agents.length ? agents.map((a) => {
      const delivery = h("td", { class: "last-delivery" }, "…");
      void lastDelivery(a.id).then((d) => fill(delivery, d), (e) => fill(delivery, errorBox(e)));
      return h("tr", { "data-agent": a.id },
        h("td", null, link(`/ui/agents/${seg(a.id)}`, a.id), a.description ? h("div", { class: "muted small" }, a.description) : null),
        h("td", { class: "mono small" }, a.webhook_url),
        h("td", null, policySummary(a.policy_bundle)),
        delivery,
        h("td", null, when(a.updated_at)));
    }) : h("tr", null, h("td", { colspan: 5, class: "muted" }, "No agents are registered.")));
  }, (e) => fill(problem, errorBox(e)));
  return {
    title: "Agents",
    node: h("section", null, h("h1", null, "Agents"), problem,
      h("table", { class: "list" },
        h("thead", null, h("tr", null, ["Agent", "Webhook", "Policy", "Last delivery", "Updated"].map((c) => h("th", { scope: "col" }, c)))),
        rows)),
  };
}

/** @param {import("../app.js").PageContext} ctx @returns {import("../app.js").Page} */
export function page(ctx) {
  const id = ctx.params.id ?? "";
  const facts = h("div");
  const policy = h("div");
  const delivery = h("div");
  get(`/v0/agents/${seg(id)}`).then((/** @type {Agent} */ a) => {
    fill(facts, h("dl", { class: "facts" },
      h("dt", null, "webhook"), h("dd", { class: "mono" }, a.webhook_url),
      h("dt", null, "lease"), h("dd", null, a.lease_timeout_seconds ? `${a.lease_timeout_seconds} s` : "the kernel's default"),
      h("dt", null, "registered"), h("dd", null, when(a.registered_at)),
      h("dt", null, "updated"), h("dd", null, when(a.updated_at)),
      a.description ? [h("dt", null, "description"), h("dd", null, a.description)] : null,
      h("dt", null, "executions"), h("dd", null, link(`/ui/?agent_id=${seg(a.id)}`, "list"))));
    fill(policy, a.policy_bundle.trim()
      ? h("pre", { class: "policy" }, a.policy_bundle)
      : h("p", { class: "muted" }, "No policy: every step is allowed (rule permissive)."));
  }, (e) => fill(facts, errorBox(e instanceof ApiError && e.status === 404 ? "No such agent." : e)));
  lastDelivery(id).then((d) => fill(delivery, d), (e) => fill(delivery, errorBox(e)));

  return {
    title: `Agent ${id}`,
    node: h("section", null,
      h("h1", null, "Agent ", h("span", { class: "id" }, id)),
      facts,
      h("h2", null, "Last delivery"), delivery,
      h("h2", null, "Active policy"), policy,
      h("h2", null, "Explain"), explainBox(id)),
  };
}

/**
 * The box that asks the kernel which rule would decide a step.
 * @param {string} agentId
 */
function explainBox(agentId) {
  const kind = h("select", { id: "explain-kind", name: "kind" }, ["tool_call", "llm_call", "local"].map((k) => h("option", { value: k }, k)));
  const target = h("input", { id: "explain-target", name: "target", placeholder: "tool name, model or local step", autocomplete: "off" });
  const args = h("textarea", { id: "explain-args", name: "args", rows: 3, placeholder: '{"to": "eve@example.org"}', spellcheck: "false" });
  const out = h("div", { class: "explanation", "aria-live": "polite" });
  const form = h("form", { class: "explain", onsubmit: (e) => void submit(e) },
    h("label", { for: "explain-kind" }, "Kind"), kind,
    h("label", { for: "explain-target" }, "Target"), target,
    h("label", { for: "explain-args" }, "Arguments (JSON)"), args,
    h("button", { type: "submit" }, "Explain"));

  /** @param {Event} e */
  async function submit(e) {
    e.preventDefault();
    const text = args.value.trim() || "null";
    try {
      parse(text);
      JSON.parse(text);
    } catch {
      fill(out, errorBox("The arguments are not JSON."));
      return;
    }
    // The arguments go as typed: numbers and key order exactly as written.
    const json = `{"kind":${JSON.stringify(kind.value)},"target":${JSON.stringify(target.value)},"args":${text}}`;
    try {
      const { data } = await call("POST", `/v0/agents/${seg(agentId)}/explain`, { json });
      fill(out, explanation(data));
    } catch (err) {
      fill(out, errorBox(err));
    }
  }
  return h("div", null, form, out);
}

/**
 * @typedef {object} Report
 * @property {string} decision
 * @property {string} rule_id
 * @property {string} reason
 * @property {number} [priority]
 * @property {number} [line]
 * @property {{approvers: string[], timeout?: string, message?: string}} [approval]
 * @property {{max_calls: number, window: string, per_what: string, on_limiter_error: string}} [rate_limit]
 * @property {Array<{rule_id: string, priority: number, line: number, matched: boolean, failed?: string}>} trace
 * @property {number} not_tried
 */

/** @param {Report} r */
function explanation(r) {
  const where = r.line ? ` (priority ${r.priority}, line ${r.line})` : "";
  return h("div", null,
    h("p", { class: `verdict decision-${r.decision}` }, "Decision: ", h("strong", { class: "decision" }, r.decision),
      " by rule ", h("strong", { class: "rule" }, r.rule_id), where, r.reason ? ` — ${r.reason}` : ""),
    r.approval ? h("p", null, "Approval by ", r.approval.approvers.length ? r.approval.approvers.join(", ") : "anyone",
      r.approval.timeout ? `, within ${r.approval.timeout}` : "", r.approval.message ? `: ${r.approval.message}` : "") : null,
    r.rate_limit ? h("p", null, `Rate limit: ${plural(r.rate_limit.max_calls, "call")} per ${r.rate_limit.window} per ${r.rate_limit.per_what}`) : null,
    r.trace.length ? h("table", { class: "list trace" },
      h("thead", null, h("tr", null, ["Rule", "Priority", "Line", "Result"].map((c) => h("th", { scope: "col" }, c)))),
      h("tbody", null, r.trace.map((t) => h("tr", { class: t.matched ? "matched" : "" },
        h("td", null, t.rule_id), h("td", { class: "num" }, String(t.priority)), h("td", { class: "num" }, String(t.line)),
        h("td", null, t.matched ? "matches: every condition holds" : `no: ${t.failed ?? ""}`))))) : null,
    r.not_tried ? h("p", { class: "muted small" }, `${plural(r.not_tried, "later rule")} not tried.`) : null);
}

/**
 * The agent's last delivery, in words.
 * @param {string} agentId
 */
async function lastDelivery(agentId) {
  const { data } = await call("GET", `/v0/agents/${seg(agentId)}/last-delivery`);
  /** @type {Delivery | undefined} */
  const d = data.delivery;
  if (!d) return h("span", { class: "muted" }, "none recorded");
  const at = h("a", { href: `/ui/executions/${seg(d.execution_id)}#event-${d.event_seq}`, title: d.execution_id }, when(d.at));
  switch (d.type) {
    case "dispatch.acked":
      return h("span", { class: "delivery ok" }, "delivered ", at, ` (attempt ${d.attempt}${d.http_status ? `, HTTP ${d.http_status}` : ""})`);
    case "dispatch.failed":
      return h("span", { class: "delivery bad" }, "failed ", at, ` (attempt ${d.attempt})`, d.http_status ? `: HTTP ${d.http_status}` : "", d.error ? ` — ${d.error}` : "");
    default:
      return h("span", { class: "delivery bad" }, "lease expired ", at, ` (attempt ${d.attempt}, dispatch ${d.status}) in ${shortId(d.execution_id)}`);
  }
}

/** @param {string} bundle */
function policySummary(bundle) {
  if (!bundle.trim()) return h("span", { class: "muted" }, "none");
  const rules = (bundle.match(/^\s*-\s+id:/gm) ?? []).length;
  return rules ? plural(rules, "rule") : "set";
}
