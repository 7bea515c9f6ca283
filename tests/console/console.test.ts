/**
 * The web console in the system Chromium and Firefox against the real kernel
 * and a real TypeScript SDK agent: sign-in, the live list and timeline,
 * approvals by role, forks, untrusted text, policy explain, the audit page,
 * and a kernel with auth off. Every scenario runs once per browser, through
 * the page API of support/browser.ts.
 */

import http from "node:http";
import type { AddressInfo } from "node:net";
import { afterAll, beforeAll, describe, expect, test } from "vitest";
import { WINDOW } from "../../internal/console/ui/assets/pages/timeline.js";
import { FIRST_TOKENS, LAST_TOKENS, startLLM } from "./support/llm.ts";
import { AGENT, BROWSERS, World, signIn } from "./support/world.ts";

const ev = (type: string) => `li.event[data-type="${type}"]`;

describe.each(BROWSERS.map((d) => [d.name, d] as const))("%s", (_, driver) => {
  describe("with auth on", () => {
    const w = new World(true, driver);
    beforeAll(async () => { await w.start(); });
    afterAll(async () => { await w.stop(); });

    test("signs in with an API key kept in no storage or URL, and signs out", async () => {
      const { page, context } = await w.page();
      await page.goto(`${w.url}/ui/`);
      await page.getByRole("button", { name: "Sign in", exact: true }).waitFor();
      expect(new URL(page.url()).pathname).toBe("/ui/sign-in");
      await w.screenshot(page, "sign-in");
      const key = w.keys.otto!;
      await page.getByLabel("API key", { exact: true }).fill(key);
      await page.getByRole("button", { name: "Sign in", exact: true }).click();
      await page.getByRole("heading", { name: "Executions", exact: true }).waitFor();
      expect(await page.locator("#top .identity").textContent()).toBe("otto · operator");

      expect(page.url()).not.toContain(key);
      const cookies = await context.cookies();
      expect(cookies).toHaveLength(1);
      const [session] = cookies;
      expect(session).toMatchObject({ name: "rebuno_session", path: "/v0", httpOnly: true, sameSite: "Strict", secure: false });
      expect(session!.value).not.toContain(key);
      const seen = await page.evaluate(() => JSON.stringify({ cookie: document.cookie, local: { ...localStorage }, session: { ...sessionStorage } }));
      expect(seen).toBe(JSON.stringify({ cookie: "", local: {}, session: {} }));

      await page.getByRole("button", { name: "Sign out", exact: true }).click();
      await page.getByRole("button", { name: "Sign in", exact: true }).waitFor();
      expect(await context.cookies()).toHaveLength(0);
      // The session is over on the kernel too.
      const r = await fetch(`${w.url}/v0/whoami`, { headers: { Cookie: `rebuno_session=${session!.value}` } });
      expect(r.status).toBe(401);
      await context.close();
    });

    test("a wrong key is refused with the kernel's reason", async () => {
      const { page, context } = await w.page();
      await page.goto(`${w.url}/ui/sign-in`);
      await page.getByLabel("API key", { exact: true }).fill(w.keys.vic!.slice(0, -3));
      await page.getByRole("button", { name: "Sign in", exact: true }).click();
      await page.getByRole("alert").filter({ hasText: "malformed API key" }).waitFor();
      expect(await page.getByLabel("API key", { exact: true }).inputValue()).toBe("");
      await context.close();
    });

    test("the list shows a new execution without reload and follows its status", async () => {
      const { page, context } = await w.page(w.keys.vic);
      await page.evaluate(() => { (window as unknown as { sameDocument: boolean }).sameDocument = true; });
      const id = await w.run({ scenario: "gate", gate: "list" });
      const row = page.locator(`tr[data-id="${id}"]`);
      await row.waitFor();
      expect(await row.locator("td").nth(1).textContent()).toBe(AGENT);
      await expect.poll(() => row.locator(".badge").textContent()).toBe("running");
      w.gates.release("list");
      await expect.poll(() => row.locator(".badge").textContent(), { timeout: 30_000 }).toBe("completed");
      expect(await row.locator("td").nth(5).textContent()).toBe("3");
      expect(await page.evaluate(() => (window as unknown as { sameDocument?: boolean }).sameDocument)).toBe(true);

      await page.locator("#filter-status").selectOption("completed");
      await page.getByRole("button", { name: "Filter", exact: true }).click();
      await expect.poll(() => new URL(page.url()).search).toBe("?status=completed");
      await row.waitFor();
      await context.close();
    });

    test("a timeline fills live", async () => {
      const id = await w.run({ scenario: "gate", gate: "timeline" });
      await w.gates.reached("timeline");
      const { page, context } = await w.page(w.keys.vic);
      await page.goto(`${w.url}/ui/executions/${id}`);
      await page.locator(ev("step.executing")).filter({ hasText: "wait_gate" }).waitFor();
      await page.locator('[data-stream="events"]').filter({ hasText: /^live$/ }).waitFor();
      expect(await page.locator(ev("execution.completed")).count()).toBe(0);
      expect(await page.locator('[data-fact="status"] .badge').textContent()).toBe("running");
      await page.evaluate(() => { (window as unknown as { sameDocument: boolean }).sameDocument = true; });

      w.gates.release("timeline");
      const done = page.locator(ev("step.succeeded")).filter({ hasText: "wait_gate" });
      await done.locator('[data-part="result"] pre').filter({ hasText: "released timeline" }).waitFor();
      await page.locator(ev("execution.completed")).waitFor();
      await expect.poll(() => page.locator('[data-fact="status"] .badge').textContent()).toBe("completed");
      // The arguments of each step, and the echo tool's result, verbatim.
      await page.locator(ev("step.proposed")).filter({ hasText: "wait_gate" }).locator("pre").filter({ hasText: '"name": "timeline"' }).waitFor();
      expect(await page.evaluate(() => (window as unknown as { sameDocument?: boolean }).sameDocument)).toBe(true);
      await context.close();
    });

    test("an approval is approved from the inbox, the execution goes on, and the record names the key", async () => {
      const id = await w.run({ scenario: "email", to: "bob@example.org" });
      const approval = await w.approvalOf(id);
      const { page, context } = await w.page(w.keys.amy);
      await page.goto(`${w.url}/ui/approvals`);
      const card = page.locator(`article[data-approval-id="${approval.id}"]`);
      await card.waitFor();
      expect(await card.textContent()).toContain("Check the recipient.");
      await card.locator("pre").filter({ hasText: '"to": "bob@example.org"' }).waitFor();
      const approve = card.getByRole("button", { name: "Approve", exact: true });
      expect(await approve.count()).toBe(1);
      expect(await card.getByRole("button", { name: "Deny", exact: true }).count()).toBe(1);
      await card.getByLabel("Reason", { exact: true }).fill("recipient checked");
      await w.screenshot(page, "approvals");
      await approve.click();
      await card.locator(".decision").filter({ hasText: "Approved by amy" }).waitFor();
      expect(await card.locator(".rationale").textContent()).toBe("recipient checked");

      const e = await w.until(id, "completed");
      expect(e.output).toEqual({ sent: "sent to bob@example.org" });
      const record = await w.api("GET", `/v0/approvals/${approval.id}`);
      expect(record).toMatchObject({ status: "granted", decided_by: "amy", rationale: "recipient checked" });
      const audit: Array<{ action: string; actor: string; subject: string }> = await w.api("GET", "/v0/audit");
      expect(audit).toContainEqual(expect.objectContaining({ action: "approval.granted", actor: "amy", subject: approval.id }));

      await page.goto(`${w.url}/ui/executions/${id}`);
      await page.locator(ev("approval.granted")).locator(".decider").filter({ hasText: /^amy$/ }).waitFor();
      await context.close();
    });

    test("a viewer is offered no Approve, and a forged request with its cookie is refused and changes nothing", async () => {
      const id = await w.run({ scenario: "email", to: "mallory@example.org" });
      const approval = await w.approvalOf(id);
      const { page, context } = await w.page(w.keys.vic);
      await page.goto(`${w.url}/ui/approvals`);
      await page.locator(`article[data-approval-id="${approval.id}"]`).waitFor();
      await page.locator("p").filter({ hasText: "Your role (viewer) cannot decide approvals" }).waitFor();
      expect(await page.getByRole("button", { name: "Approve", exact: true }).count()).toBe(0);
      expect(await page.getByRole("button", { name: "Deny", exact: true }).count()).toBe(0);

      const forged = await page.evaluate(async (path) => {
        const r = await fetch(path, { method: "POST", headers: { "Content-Type": "application/json" }, body: '{"decided_by":"vic"}' });
        return { status: r.status, body: await r.json() };
      }, `/v0/approvals/${approval.id}/grant`);
      expect(forged.status).toBe(403);
      expect(forged.body).toMatchObject({ code: "forbidden", details: { role: "viewer", role_needed: "approver" } });
      expect((await w.api("GET", `/v0/approvals/${approval.id}`)).status).toBe("pending");
      await context.close();
    });

    test("a cross-origin POST carrying an approver's cookie is refused by the origin check", async () => {
      const id = await w.run({ scenario: "email", to: "trudy@example.org" });
      const approval = await w.approvalOf(id);
      const { page, context } = await w.page(w.keys.amy);
      // Another origin on the same host: the same site, so SameSite=Strict
      // still sends the cookie, and only the kernel's Origin check stands.
      // The page first reads whoami, which only a request with the cookie
      // passes (200, not 401), then tries the grant.
      const whoami = `${w.url}/v0/whoami`;
      const target = `${w.url}/v0/approvals/${approval.id}/grant`;
      const evil = http.createServer((_req, res) => {
        res.writeHead(200, { "content-type": "text/html" });
        res.end(`<!doctype html><script>
          fetch(${JSON.stringify(whoami)}, {mode: "no-cors", credentials: "include"}).then(() =>
            fetch(${JSON.stringify(target)}, {method: "POST", mode: "no-cors", credentials: "include",
              headers: {"Content-Type": "text/plain"}, body: "{}"}));</script>`);
      });
      await new Promise<void>((resolve) => evil.listen(0, "127.0.0.1", resolve));
      try {
        const read = page.waitForResponse((r) => r.url() === whoami);
        const granted = page.waitForResponse((r) => r.url() === target);
        await page.goto(`http://127.0.0.1:${(evil.address() as AddressInfo).port}/`);
        expect((await read).status()).toBe(200);
        expect((await granted).status()).toBe(403);
      } finally {
        evil.closeAllConnections();
        await new Promise<void>((resolve) => evil.close(() => resolve()));
      }
      expect((await w.api("GET", `/v0/approvals/${approval.id}`)).status).toBe("pending");
      await w.api("POST", `/v0/approvals/${approval.id}/deny`, { rationale: "test over" });
      await context.close();
    });

    test("Fork here says when a point is not covered, and on a covered one forks and opens the child", async () => {
      const id = await w.run({ scenario: "workspace" });
      await w.until(id, "completed");
      const { page, context } = await w.page(w.keys.otto);
      await page.goto(`${w.url}/ui/executions/${id}`);
      const registered = page.locator(ev("resource.registered"));
      await registered.waitFor();
      // Every event offers it, without hovering.
      const events = await page.locator("li.event").count();
      expect(await page.locator("li.event button.fork-here").filter({ visible: true }).count()).toBe(events);

      await registered.getByRole("button", { name: "Fork here", exact: true }).click();
      const dialog = page.getByRole("dialog");
      await dialog.locator(".coverage").filter({ hasText: /^not covered$/ }).waitFor();
      expect(await dialog.textContent()).toContain("no checkpoint was taken before this point");
      await dialog.getByRole("button", { name: "Cancel", exact: true }).click();
      await dialog.waitFor({ state: "detached" });
      expect((await w.api("GET", `/v0/executions/${id}/forks`)).executions).toHaveLength(0);

      const checkpoint = page.locator(ev("resource.checkpointed")).last();
      const ref = await checkpoint.locator(".ev-summary code").textContent();
      await checkpoint.getByRole("button", { name: "Fork here", exact: true }).click();
      await dialog.locator(".coverage").filter({ hasText: /^covered$/ }).waitFor();
      expect(await dialog.locator("code.checkpoint-ref").textContent()).toBe(ref);
      await w.screenshot(page, "fork");
      expect((await w.api("GET", `/v0/executions/${id}/forks`)).executions).toHaveLength(0);
      await dialog.getByRole("button", { name: "Create fork", exact: true }).click();

      await page.waitForURL((u) => u.pathname.startsWith("/ui/executions/") && !u.pathname.endsWith(id));
      const child = new URL(page.url()).pathname.split("/").pop()!;
      await page.locator(ev("execution.forked")).waitFor();
      expect(await page.locator('[data-fact="forked from"]').textContent()).toContain(id);
      const forks = (await w.api("GET", `/v0/executions/${id}/forks`)).executions;
      expect(forks.map((f: { id: string }) => f.id)).toEqual([child]);
      await w.until(child, "completed");
      await page.locator(ev("execution.completed")).waitFor();
      expect(await page.locator("ul.tree a").filter({ hasText: id.slice(-8) }).count()).toBe(1);
      await context.close();
    });

    test("a tool result of markup shows the markup as text", async () => {
      const id = await w.run({ scenario: "markup" });
      await w.until(id, "completed");
      const { page, context, dialogs } = await w.page(w.keys.vic);
      await page.goto(`${w.url}/ui/executions/${id}`);
      const result = page.locator(ev("step.succeeded")).locator('[data-part="result"] pre');
      await expect.poll(() => result.textContent()).toBe("<img src=x onerror=alert(1)>");
      await page.locator(ev("execution.completed")).locator("pre").filter({ hasText: '"html": "<img src=x onerror=alert(1)>"' }).waitFor();
      expect(await page.locator("main img").count()).toBe(0);
      expect(dialogs).toEqual([]);
      await context.close();
    });

    test("an LLM call's tokens stream into the timeline while it runs", async () => {
      const llm = await startLLM(w.gates, "llm");
      try {
        const id = await w.run({ scenario: "llm", llm: llm.url });
        await w.gates.reached("llm-start");
        const { page, context } = await w.page(w.keys.vic);
        await page.goto(`${w.url}/ui/executions/${id}`);
        const executing = page.locator(ev("step.executing")).filter({ hasText: "llm_call" });
        await executing.waitFor();
        await page.locator('[data-stream="deltas"]').filter({ hasText: /^live$/ }).waitFor();
        w.gates.release("llm-start");
        await executing.locator(".stream pre").filter({ hasText: new RegExp(`^${FIRST_TOKENS.join("")}$`) }).waitFor();
        expect(await page.locator(ev("step.succeeded")).count()).toBe(0);
        w.gates.release("llm-end");
        await page.locator(ev("step.succeeded")).waitFor();
        await executing.locator(".stream pre").filter({ hasText: [...FIRST_TOKENS, ...LAST_TOKENS].join("") }).waitFor();
        await w.until(id, "completed");
        await context.close();
      } finally {
        await llm.stop();
      }
    });

    test("a long history opens on its newest events and loads earlier ones on request", async () => {
      const id = await w.run({ scenario: "many", n: 80 });
      await w.until(id, "completed");
      const last: number = (await w.api("GET", `/v0/executions/${id}/coverage`)).last_event_seq;
      expect(last).toBeGreaterThan(WINDOW + 50);
      const { page, context } = await w.page(w.keys.vic);
      const reads: string[] = [];
      page.on("request", (r) => { if (r.url().includes("/events?")) reads.push(new URL(r.url()).search); });
      await page.goto(`${w.url}/ui/executions/${id}`);
      await page.locator(ev("execution.completed")).waitFor();
      expect(await page.locator("li.event").count()).toBe(WINDOW);
      expect(await page.locator("li.event").first().getAttribute("data-seq")).toBe(String(last - WINDOW + 1));
      expect(reads).toEqual([`?after_seq=${last - WINDOW}&limit=${WINDOW}`]);
      await page.getByRole("button", { name: "Load earlier events", exact: true }).click();
      await expect.poll(() => page.locator("li.event").count()).toBe(last);
      expect(await page.locator("li.event").first().getAttribute("data-seq")).toBe("1");
      await context.close();
    });

    test("agents show their last delivery and policy, and explain says which rule decides", async () => {
      const { page, context } = await w.page(w.keys.vic);
      await page.goto(`${w.url}/ui/agents`);
      const row = page.locator(`tr[data-agent="${AGENT}"]`);
      await row.locator(".last-delivery").filter({ hasText: "delivered" }).waitFor();
      await row.getByRole("link", { name: AGENT, exact: true }).click();
      await page.locator("pre.policy").filter({ hasText: "id: ask-email" }).waitFor();
      await page.getByLabel("Target", { exact: true }).fill("send_email");
      await page.getByLabel("Arguments (JSON)", { exact: true }).fill('{"to": "eve@example.org"}');
      await page.getByRole("button", { name: "Explain", exact: true }).click();
      await expect.poll(() => page.locator(".explanation .decision").textContent()).toBe("require_approval");
      expect(await page.locator(".explanation .rule").textContent()).toBe("ask-email");
      await w.screenshot(page, "agent");
      await page.getByLabel("Target", { exact: true }).fill("echo");
      await page.getByRole("button", { name: "Explain", exact: true }).click();
      await expect.poll(() => page.locator(".explanation .rule").textContent()).toBe("default");
      expect(await page.locator(".explanation .decision").textContent()).toBe("allow");
      await page.getByLabel("Arguments (JSON)", { exact: true }).fill("{not json");
      await page.getByRole("button", { name: "Explain", exact: true }).click();
      await page.getByRole("alert").filter({ hasText: "not JSON" }).waitFor();
      await context.close();
    });

    test("the audit page is an administrator's: it lists keys and decisions", async () => {
      const viewer = await w.page(w.keys.vic);
      expect(await viewer.page.locator("#top nav a").allTextContents()).toEqual(["Executions", "Approvals", "Agents"]);
      await viewer.context.close();
      const { page, context } = await w.page(w.keys.ada);
      await page.getByRole("link", { name: "Audit", exact: true }).click();
      await page.getByRole("heading", { name: "Audit log", exact: true }).waitFor();
      for (const name of ["ada", "otto", "amy", "vic"]) await page.locator("td strong").filter({ hasText: new RegExp(`^${name}$`) }).first().waitFor();
      await page.locator("table.audit tr").filter({ hasText: "key.created" }).first().waitFor();
      await w.screenshot(page, "audit");
      await context.close();
    });

    test("an operator's screens: the list of everything so far, and an execution page", async () => {
      // The pictures of docs/console.md, taken last so that the list has a history.
      const id = await w.run({ scenario: "gate", gate: "shot" });
      w.gates.release("shot");
      await w.until(id, "completed");
      const { page, context } = await w.page(w.keys.otto);
      const rows = page.locator("table.executions tbody tr[data-id]");
      await expect.poll(() => rows.count()).toBeGreaterThan(10);
      expect(await page.locator("table.executions .badge").filter({ hasText: /^(completed|cancelled|failed)$/ }).count()).toBeGreaterThan(0);
      await w.screenshot(page, "executions");
      await page.locator(`tr[data-id="${id}"] a`).first().click();
      await page.locator(ev("execution.completed")).waitFor();
      await page.getByRole("button", { name: "Fork here", exact: true }).first().waitFor();
      await w.screenshot(page, "execution", true);
      await context.close();
    });
  });

  describe("with auth off", () => {
    const w = new World(false, driver);
    beforeAll(async () => { await w.start(); });
    afterAll(async () => { await w.stop(); });

    test("the console works without sign-in and says so in a banner", async () => {
      const { page, context } = await w.page();
      await page.goto(`${w.url}/ui/`);
      await page.getByRole("heading", { name: "Executions", exact: true }).waitFor();
      expect(await page.locator("#banner").textContent()).toContain("Auth is off.");
      expect(await page.locator("#banner").isVisible()).toBe(true);

      const id = await w.run({ scenario: "email", to: "dev@example.org" });
      const approval = await w.approvalOf(id);
      await page.getByRole("link", { name: "Approvals", exact: true }).click();
      const card = page.locator(`article[data-approval-id="${approval.id}"]`);
      await card.waitFor();
      await page.getByLabel("Decide as", { exact: true }).fill("devon");
      await card.getByRole("button", { name: "Deny", exact: true }).click();
      await card.locator(".decision").filter({ hasText: "Denied by devon" }).waitFor();
      expect((await w.api("GET", `/v0/approvals/${approval.id}`)).decided_by).toBe("devon");
      await context.close();
    });

    test("signing in with a key still names the decider", async () => {
      const key = (await w.api("POST", "/v0/keys", { name: "dora", role: "approver" })).token;
      const { page, context } = await w.page();
      await signIn(page, w.url, key);
      expect(await page.locator("#banner").isVisible()).toBe(false);
      expect(await page.locator("#top .identity").textContent()).toBe("dora · approver");
      await context.close();
    });
  });
});
