/**
 * What every console test needs: the real kernel (`rebuno dev`, with a
 * bootstrap token unless the test wants auth off), API keys of each role,
 * the TypeScript SDK agent of agents/agent.ts with a policy that asks a human
 * before every email, the gate server, and a browser (browser.ts): Chromium
 * unless another is given.
 */

import fs from "node:fs";
import os from "node:os";
import path from "node:path";
import { fileURLToPath } from "node:url";
import type { BrowserContext as PlaywrightContext, Page as PlaywrightPage } from "playwright-core";
import { AgentProcess, Kernel, eventually } from "../../../sdk/typescript/test/support/kernel.ts";
import type { Browser, BrowserDriver, Context, Page } from "./browser.ts";
import { Gates } from "./gates.ts";
import { chromium } from "./playwright.ts";
import { firefox } from "./puppeteer.ts";

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

/** The browsers every scenario runs in, from Debian's packages (make test-console installs them); never a download. */
export const CHROMIUM = chromium(process.env.REBUNO_CHROMIUM ?? "/usr/bin/chromium");
export const FIREFOX = firefox(process.env.REBUNO_FIREFOX ?? "/usr/bin/firefox-esr");
export const BROWSERS: BrowserDriver[] = [CHROMIUM, FIREFOX];

/** P and C are the page and context types of the driver: Playwright's own for Chromium, which bench/console uses as they are. */
export class World<P extends Page = PlaywrightPage, C extends Context = PlaywrightContext> {
  kernel: Kernel;
  gates = new Gates();
  agent: AgentProcess | undefined;
  browser: Browser<P, C> | undefined;
  keys: Record<string, string> = {};
  readonly driver: BrowserDriver<P, C>;
  private resources = fs.mkdtempSync(path.join(os.tmpdir(), "rebuno-console-ws-"));

  constructor(readonly auth = true, driver?: BrowserDriver<P, C>) {
    this.kernel = new Kernel(auth ? ["--bearer-token", BOOTSTRAP] : [], false);
    // Without a driver P and C are Playwright's, which CHROMIUM gives.
    this.driver = driver ?? (CHROMIUM as unknown as BrowserDriver<P, C>);
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
    this.browser = await this.driver.launch();
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
  async page(key?: string): Promise<{ page: P; context: C; dialogs: string[] }> {
    const { page, context } = await this.browser!.newPage();
    const dialogs: string[] = [];
    page.on("dialog", (d) => {
      dialogs.push(`${d.type()}: ${d.message()}`);
      void d.dismiss();
    });
    page.on("pageerror", (e) => dialogs.push(`pageerror: ${e.message}`));
    if (key) await signIn(page, this.url, key);
    return { page, context, dialogs };
  }

  /**
   * Saves a picture of the page when asked for (make console-screenshots),
   * else nothing. The pictures of docs/console.md are Chromium's.
   */
  async screenshot(page: P, name: string, fullPage = false): Promise<void> {
    const dir = process.env.REBUNO_CONSOLE_SCREENSHOTS;
    if (!dir || this.driver.name !== CHROMIUM.name) return;
    fs.mkdirSync(dir, { recursive: true });
    await page.screenshot({ path: path.join(dir, `${name}.png`), fullPage });
  }
}

/** Signs in through the console's form. */
export async function signIn(page: Page, url: string, key: string): Promise<void> {
  await page.goto(`${url}/ui/sign-in`);
  await page.getByLabel("API key", { exact: true }).fill(key);
  await page.getByRole("button", { name: "Sign in", exact: true }).click();
  await page.getByRole("heading", { name: "Executions", exact: true }).waitFor();
}
