// The execution list: newest first, a page at a time (keyset paging), read
// again whenever the kernel says an execution changed.

import { get, query, seg } from "../api.js";
import { badge, errorBox, fill, h, link } from "../dom.js";
import { TERMINAL, plural, runTime, shortId, when } from "../format.js";
import { coalesce, follow } from "../live.js";

export const STATUSES = ["pending", "running", "blocked", "completed", "failed", "cancelled"];
const PAGE = 50;

/**
 * @typedef {object} Summary
 * @property {string} id
 * @property {string} agent_id
 * @property {string} status
 * @property {string} created_at
 * @property {string} updated_at
 * @property {number} step_count
 * @property {number} last_event_seq
 * @property {string} [forked_from]
 * @property {number} [fork_seq]
 * @property {string} [parent_execution_id]
 * @property {string} [failure_reason]
 */

/** @param {import("../app.js").PageContext} ctx @returns {import("../app.js").Page} */
export function page(ctx) {
  const status = ctx.search.get("status") ?? "";
  const agent = ctx.search.get("agent_id") ?? "";
  const cursor = ctx.search.get("cursor") ?? "";

  const statusSelect = h("select", { id: "filter-status", name: "status" },
    h("option", { value: "" }, "any status"),
    STATUSES.map((s) => h("option", { value: s, selected: s === status }, s)));
  const agentList = h("datalist", { id: "agent-ids" });
  const agentInput = h("input", { id: "filter-agent", name: "agent_id", list: "agent-ids", value: agent, placeholder: "any agent", autocomplete: "off" });
  const filters = h("form", { class: "filters", onsubmit: (e) => {
    e.preventDefault();
    ctx.go(`/ui/${query({ status: statusSelect.value, agent_id: agentInput.value.trim() })}`);
  } },
  h("label", { for: "filter-status" }, "Status"), statusSelect,
  h("label", { for: "filter-agent" }, "Agent"), agentInput, agentList,
  h("button", { type: "submit" }, "Filter"),
  (status || agent) ? link("/ui/", "Clear") : null);

  const rows = h("tbody");
  const table = h("table", { class: "list executions" },
    h("thead", null, h("tr", null, ["Execution", "Agent", "Status", "Created", "Duration", "Steps"].map((c) => h("th", { scope: "col" }, c)))),
    rows);
  const pager = h("nav", { class: "pager", "aria-label": "Pages of executions" });
  const problem = h("div");
  const live = follow("/v0/execution-summaries/stream", { onMessage: () => reload() });

  /** @type {Summary[]} */
  let shown = [];
  const reload = coalesce(async () => {
    try {
      const res = await get(`/v0/execution-summaries${query({ status, agent_id: agent, cursor, limit: PAGE })}`);
      shown = res.executions;
      fill(rows, shown.length ? shown.map(row) : h("tr", null, h("td", { colspan: 6, class: "muted" }, "No executions yet.")));
      fill(pager,
        cursor ? link(`/ui/${query({ status, agent_id: agent })}`, "← Newest") : null,
        res.next_cursor ? link(`/ui/${query({ status, agent_id: agent, cursor: res.next_cursor })}`, "Older →") : null);
      problem.replaceChildren();
    } catch (e) {
      fill(problem, errorBox(e));
    }
  });
  reload();
  get("/v0/agents").then((list) => fill(agentList, list.map((/** @type {{id: string}} */ a) => h("option", { value: a.id }))), () => {});

  // Running executions' durations grow; nothing else on the page changes
  // without news from the kernel.
  const ticker = setInterval(() => {
    shown.forEach((e, i) => {
      if (TERMINAL.includes(e.status)) return;
      const cell = rows.children[i]?.querySelector(".duration");
      if (cell) cell.textContent = runTime(e);
    });
  }, 1000);

  const node = h("section", null,
    h("div", { class: "title-row" }, h("h1", null, "Executions"), live.indicator),
    filters, problem, table, pager);
  return { title: "Executions", node, dispose: () => { live.close(); clearInterval(ticker); } };
}

/** @param {Summary} e */
function row(e) {
  return h("tr", { "data-id": e.id },
    h("td", null,
      h("a", { href: `/ui/executions/${seg(e.id)}`, title: e.id, class: "mono" }, shortId(e.id)),
      e.forked_from ? h("span", { class: "muted small" }, " fork of ", h("a", { href: `/ui/executions/${seg(e.forked_from)}`, class: "mono", title: e.forked_from }, shortId(e.forked_from)), ` at #${e.fork_seq}`) : null),
    h("td", null, link(`/ui/agents/${seg(e.agent_id)}`, e.agent_id)),
    h("td", null, badge(e.status), e.failure_reason ? h("span", { class: "muted small" }, ` ${e.failure_reason}`) : null),
    h("td", null, h("time", { datetime: e.created_at }, when(e.created_at))),
    h("td", { class: "duration" }, runTime(e)),
    h("td", { class: "num", title: plural(e.step_count, "step") }, String(e.step_count)));
}
