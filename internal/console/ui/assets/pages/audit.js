// The access audit log and the API keys, for administrators: who made and
// revoked keys, and who decided which approval.

import { get, query } from "../api.js";
import { errorBox, fill, h } from "../dom.js";
import { when } from "../format.js";
import { can } from "../session.js";

const PAGE = 200;

/**
 * @typedef {object} Entry
 * @property {number} seq
 * @property {string} at
 * @property {string} actor
 * @property {string} action
 * @property {string} subject
 * @property {Record<string, unknown> | null} detail
 */

/**
 * @typedef {object} Key
 * @property {string} name
 * @property {string} role
 * @property {string} created_at
 * @property {string} created_by
 * @property {string} [expires_at]
 * @property {string} [revoked_at]
 * @property {string} [last_used_at]
 */

/** @param {import("../app.js").PageContext} ctx @returns {import("../app.js").Page} */
export function page(ctx) {
  if (!can(ctx.session, "admin")) {
    return { title: "Audit", node: h("section", null, h("h1", null, "Audit"), h("p", { class: "note" }, "The audit log is for administrators.")) };
  }
  const rows = h("tbody");
  const more = h("button", { type: "button", class: "quiet", hidden: true, onclick: () => void load() }, "Load more");
  const problem = h("div");
  let after = 0;

  async function load() {
    try {
      /** @type {Entry[]} */
      const entries = await get(`/v0/audit${query({ after, limit: PAGE })}`);
      if (after === 0 && entries.length === 0) fill(rows, h("tr", null, h("td", { colspan: 5, class: "muted" }, "Nothing recorded yet.")));
      for (const e of entries) {
        rows.append(h("tr", null,
          h("td", { class: "num" }, String(e.seq)),
          h("td", null, when(e.at)),
          h("td", null, h("strong", null, e.actor)),
          h("td", null, e.action),
          h("td", null, h("span", { class: "mono" }, e.subject), e.detail ? h("div", { class: "muted small" },
            Object.entries(e.detail).map(([k, v]) => `${k}: ${typeof v === "string" ? v : JSON.stringify(v)}`).join(" · ")) : null)));
      }
      if (entries.length) after = entries[entries.length - 1]?.seq ?? after;
      more.hidden = entries.length < PAGE;
    } catch (e) {
      fill(problem, errorBox(e));
    }
  }
  void load();

  const keys = h("tbody");
  /** @param {Key} k */
  const keyRow = (k) => h("tr", { class: k.revoked_at ? "revoked" : "" },
    h("td", null, h("strong", null, k.name)),
    h("td", null, k.role),
    h("td", null, when(k.created_at), " by ", k.created_by),
    h("td", null, k.last_used_at ? when(k.last_used_at) : "never"),
    h("td", null, k.revoked_at ? `revoked ${when(k.revoked_at)}` : k.expires_at ? `expires ${when(k.expires_at)}` : "no expiry"));
  get("/v0/keys").then(
    (/** @type {Key[]} */ list) => fill(keys, list.length ? list.map(keyRow)
      : h("tr", null, h("td", { colspan: 5, class: "muted" }, "No keys. Make one with rebuno keys create."))),
    (e) => fill(problem, errorBox(e)));

  return {
    title: "Audit",
    node: h("section", null,
      h("h1", null, "Audit"), problem,
      h("h2", null, "API keys"),
      h("table", { class: "list" }, h("thead", null, h("tr", null, ["Name", "Role", "Created", "Last used", "State"].map((c) => h("th", { scope: "col" }, c)))), keys),
      h("h2", null, "Audit log"),
      h("table", { class: "list audit" }, h("thead", null, h("tr", null, ["#", "When", "Actor", "Action", "Subject"].map((c) => h("th", { scope: "col" }, c)))), rows),
      more),
  };
}

