/**
 * What every console test needs: the real kernel (`rebuno dev`, with a
 * bootstrap token unless the test wants auth off), API keys of each role,
 * the TypeScript SDK agent of agents/agent.ts with a policy that asks a human
 * before every email, the gate server, and the system Chromium.
 */

import fs from "node:fs";
import os from "node:os";
import path from "node:path";
import { fileURLToPath } from "node:url";
import { chromium, type Browser, type BrowserContext, type Page } from "playwright-core";
import { AgentProcess, Kernel, eventually } from "../../../sdk/typescript/test/support/kernel.ts";
import { Gates } from "./gates.ts";

export { eventually };

export const BOOTSTRAP = "bootstrap-token-for-console-tests";
export const AGENT = "console-agent";
const SECRET = "console-agent-secret-0123456789";
const HERE = path.dirname(fileURLToPath(import.meta.url));

export const POLICY = `default_action: allow
rules:
  - id: ask-email
    priority: 10
    when: {target: send_email}
    then:
      decision: require_approval
      approval_config: {message: "Check the recipient."}
`;

/** Chromium from Debian's package (make test-console installs it); never a download. */
export const CHROMIUM = process.env.REBUNO_CHROMIUM ?? "/usr/bin/chromium";
const CHROMIUM_FLAGS = ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run", "--disable-background-networking",
  "--disable-component-update", "--disable-sync"];

export class World {
  kernel: Kernel;
  gates = new Gates();
  agent: AgentProcess | undefined;
  browser: Browser | undefined;
  keys: Record<string, string> = {};
  private resources = fs.mkdtempSync(path.join(os.tmpdir(), "rebuno-console-ws-"));

  constructor(readonly auth = true) {
    this.kernel = new Kernel(auth ? ["--bearer-token", BOOTSTRAP] : [], false);
  }

  get url(): string {
    return this.kernel.url;
  }

  async start(): Promise<this> {
    await this.kernel.start();
    await this.gates.start();
    this.agent = new AgentProcess(path.join(HERE, "../agents/agent.ts"), {
      AGENT_ID: AGENT, REBUNO_URL: this.url, REBUNO_AGENT_SECRET: SECRET, GATE_URL: this.gates.url, REBUNO_LOCAL_RESOURCES: this.resources,
    });
    await this.api("POST", "/v0/agents", { id: AGENT, webhook_url: await this.agent.webhook(), secret: SECRET });
    await this.api("POST", `/v0/policies/${AGENT}`, { bundle: POLICY });
    if (this.auth) {
      for (const [name, role] of [["ada", "admin"], ["otto", "operator"], ["amy", "approver"], ["vic", "viewer"]] as const) {
        this.keys[name] = (await this.api("POST", "/v0/keys", { name, role })).token;
      }
    }
    // Headless, with a fresh profile per launch (Playwright's --user-data-dir).
    this.browser = await chromium.launch({ executablePath: CHROMIUM, headless: true, args: CHROMIUM_FLAGS });
    return this;
  }

  async stop(): Promise<void> {
    await this.browser?.close();
    await this.agent?.stop();
    await this.gates.stop();
    await this.kernel.destroy();
    fs.rmSync(this.resources, { recursive: true, force: true });
  }

  /** Calls the API with the bootstrap token. */
  async api(method: string, p: string, body?: unknown): Promise<any> {
    const headers: Record<string, string> = { Authorization: `Bearer ${BOOTSTRAP}` };
    if (body !== undefined) headers["content-type"] = "application/json";
    const r = await fetch(this.url + p, { method, headers, body: body === undefined ? undefined : JSON.stringify(body) });
    const text = await r.text();
    if (!r.ok) throw new Error(`${method} ${p}: ${r.status} ${text}`);
    return text ? JSON.parse(text) : null;
  }

  /** Starts an execution of the test agent. */
  async run(input: Record<string, unknown>): Promise<string> {
    return (await this.api("POST", "/v0/executions", { agent_id: AGENT, input })).id;
  }

  /** Waits until an execution's status is one of those given. */
  async until(id: string, ...statuses: string[]): Promise<any> {
    return eventually(async () => {
      const e = await this.api("GET", `/v0/executions/${id}`);
      return statuses.includes(e.status) ? e : undefined;
    }, `execution ${id} to be ${statuses.join(" or ")}`, 30_000);
  }

  /** The pending approval of an execution, once it asks. */
  async approvalOf(id: string): Promise<any> {
    return eventually(async () => (await this.api("GET", `/v0/approvals?execution_id=${id}&status=pending`))[0], `an approval in ${id}`, 30_000);
  }

  /** A page in a fresh browser context (no cookies), signed in with a key when given. */
  async page(key?: string): Promise<{ page: Page; context: BrowserContext; dialogs: string[] }> {
    const context = await this.browser!.newContext({ viewport: { width: 1280, height: 900 } });
    const page = await context.newPage();
    const dialogs: string[] = [];
    page.on("dialog", (d) => {
      dialogs.push(`${d.type()}: ${d.message()}`);
      void d.dismiss();
    });
    page.on("pageerror", (e) => dialogs.push(`pageerror: ${e.message}`));
    if (key) await signIn(page, this.url, key);
    return { page, context, dialogs };
  }
}

/** Signs in through the console's form. */
export async function signIn(page: Page, url: string, key: string): Promise<void> {
  await page.goto(`${url}/ui/sign-in`);
  await page.getByLabel("API key").fill(key);
  await page.getByRole("button", { name: "Sign in" }).click();
  await page.getByRole("heading", { name: "Executions" }).waitFor();
}

/** Where screenshots go when asked for (make console-screenshots), else nowhere. */
export async function screenshot(page: Page, name: string, fullPage = false): Promise<void> {
  const dir = process.env.REBUNO_CONSOLE_SCREENSHOTS;
  if (!dir) return;
  fs.mkdirSync(dir, { recursive: true });
  await page.screenshot({ path: path.join(dir, `${name}.png`), fullPage });
}
