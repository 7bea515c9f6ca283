// The console's frame: who is signed in, the header, the banner, and a
// router that shows one page per path under /ui/ without reloading.

import { UNAUTHORIZED } from "./api.js";
import { errorBox, fill, h } from "./dom.js";
import { can, signOut, whoami } from "./session.js";
import * as agents from "./pages/agents.js";
import * as approvals from "./pages/approvals.js";
import * as audit from "./pages/audit.js";
import * as execution from "./pages/execution.js";
import * as executions from "./pages/executions.js";
import * as signin from "./pages/signin.js";

/**
 * @typedef {object} PageContext
 * @property {import("./session.js").Session} session
 * @property {Record<string, string>} params path parameters
 * @property {URLSearchParams} search
 * @property {(path: string, replace?: boolean) => void} go
 * @property {() => Promise<void>} refreshSession
 */

/**
 * @typedef {object} Page
 * @property {string} title
 * @property {HTMLElement} node
 * @property {() => void} [dispose] stops the page's streams and timers
 */

/** @typedef {(ctx: PageContext) => Page} PageFactory */

/** @type {Array<{pattern: RegExp, names: string[], page: PageFactory, nav?: string}>} */
const routes = [
  { pattern: /^\/ui\/?$/, names: [], page: executions.page, nav: "executions" },
  { pattern: /^\/ui\/executions\/([^/]+)$/, names: ["id"], page: execution.page, nav: "executions" },
  { pattern: /^\/ui\/approvals$/, names: [], page: approvals.page, nav: "approvals" },
  { pattern: /^\/ui\/agents$/, names: [], page: agents.listPage, nav: "agents" },
  { pattern: /^\/ui\/agents\/([^/]+)$/, names: ["id"], page: agents.page, nav: "agents" },
  { pattern: /^\/ui\/audit$/, names: [], page: audit.page, nav: "audit" },
];

const SIGN_IN = "/ui/sign-in";

/** @type {import("./session.js").Session | null} */
let session = null;
/** @type {Page | null} */
let current = null;
/** Where to go after signing in. */
let returnTo = "/ui/";

const top = /** @type {HTMLElement} */ (document.getElementById("top"));
const banner = /** @type {HTMLElement} */ (document.getElementById("banner"));
const main = /** @type {HTMLElement} */ (document.getElementById("main"));

/**
 * Shows the page of a path.
 * @param {string} path
 * @param {boolean} [replace]
 */
function go(path, replace = false) {
  if (replace) history.replaceState(null, "", path);
  else history.pushState(null, "", path);
  void render();
}

async function refreshSession() {
  session = await whoami();
}

async function render() {
  current?.dispose?.();
  current = null;
  const url = new URL(location.href);
  if (session === null && url.pathname !== SIGN_IN) {
    returnTo = url.pathname + url.search;
    history.replaceState(null, "", SIGN_IN);
    return render();
  }
  if (url.pathname === SIGN_IN) {
    showChrome(null);
    current = signin.page({ done: async () => { await refreshSession(); go(returnTo, true); } });
    document.title = `${current.title} · Rebuno`;
    fill(main, current.node);
    return;
  }
  const s = /** @type {import("./session.js").Session} */ (session);
  for (const r of routes) {
    const m = r.pattern.exec(url.pathname);
    if (!m) continue;
    /** @type {Record<string, string>} */
    const params = {};
    r.names.forEach((name, i) => { params[name] = decodeURIComponent(m[i + 1] ?? ""); });
    showChrome(r.nav ?? "");
    try {
      current = r.page({ session: s, params, search: url.searchParams, go, refreshSession });
      document.title = `${current.title} · Rebuno`;
      fill(main, current.node);
    } catch (e) {
      fill(main, errorBox(e));
    }
    return;
  }
  showChrome("");
  fill(main, h("section", null, h("h1", null, "Not found"), h("p", null, "No page here. ", h("a", { href: "/ui/" }, "Executions"))));
}

/**
 * Draws the header and the banner for the current session.
 * @param {string | null} active the nav entry to mark; null on the sign-in page
 */
function showChrome(active) {
  const s = session;
  /** @type {Array<[string, string, string]>} */
  const items = [["executions", "/ui/", "Executions"], ["approvals", "/ui/approvals", "Approvals"], ["agents", "/ui/agents", "Agents"]];
  if (s && can(s, "admin")) items.push(["audit", "/ui/audit", "Audit"]);
  const nav = active === null ? null : h("nav", { "aria-label": "Pages" },
    items.map(([key, href, label]) => h("a", { href, "aria-current": key === active ? "page" : null }, label)));
  let who = null;
  if (s?.key) {
    who = h("div", { class: "who" },
      h("span", { class: "identity" }, h("strong", null, s.name ?? ""), " · ", s.role),
      h("button", { type: "button", class: "quiet", onclick: () => void doSignOut() }, "Sign out"));
  } else if (s) {
    who = h("div", { class: "who" }, h("span", { class: "identity" }, "no sign-in · ", s.role));
  }
  fill(top, h("a", { class: "brand", href: "/ui/" }, "Rebuno"), nav, who);
  if (s && !s.auth && !s.key) {
    banner.hidden = false;
    fill(banner, h("strong", null, "Auth is off."),
      " This kernel runs without --bearer-token: the console needs no sign-in, and anyone who can reach it can do everything.");
  } else {
    banner.hidden = true;
    fill(banner);
  }
}

async function doSignOut() {
  try {
    await signOut();
  } finally {
    await start("/ui/");
  }
}

/**
 * Reads the session and shows the current page.
 * @param {string} [after] a path to go to first
 */
async function start(after) {
  try {
    await refreshSession();
  } catch (e) {
    fill(main, errorBox(e));
    return;
  }
  if (after) history.replaceState(null, "", after);
  await render();
}

window.addEventListener(UNAUTHORIZED, () => {
  if (location.pathname === SIGN_IN) return;
  session = null;
  void render();
});
window.addEventListener("popstate", () => void render());
document.addEventListener("click", (e) => {
  if (e.defaultPrevented || e.button !== 0 || e.metaKey || e.ctrlKey || e.shiftKey || e.altKey) return;
  const a = e.target instanceof Element ? e.target.closest("a") : null;
  if (!a || a.target || a.origin !== location.origin || !a.pathname.startsWith("/ui")) return;
  e.preventDefault();
  go(a.pathname + a.search);
});

void start();
