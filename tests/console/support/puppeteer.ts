/**
 * Firefox through puppeteer-core over WebDriver BiDi, behind the seam of
 * browser.ts. Puppeteer's pages already answer the seam's navigation,
 * evaluation, network and dialog calls; what it lacks is Playwright's
 * locators, which this file supplies: a locator is a list of steps (a CSS or
 * accessibility query, a filter, a pick) run again from the page on every
 * attempt, so that an element the console has replaced is found anew.
 */

import { setTimeout as sleep } from "node:timers/promises";
import puppeteer, { type BrowserContext, type ElementHandle, type Page as PuppeteerPage } from "puppeteer-core";
import { VIEWPORT, type BrowserDriver, type Dialog, type Locator, type Page, type Request, type Response, type Role, type WaitState } from "./browser.ts";

/** How long a wait pauses before looking at the page again (Puppeteer's own locators retry on a timer too). */
const RETRY_MS = 50;
/** The controls a `<label>` can name. */
const LABELLED = "input, select, textarea";

type Handle = ElementHandle<Element>;

type Step =
  | { kind: "css"; selector: string }
  /** Puppeteer's ARIA selector, answered by the browser's accessibility tree; controls keeps only form controls. */
  | { kind: "aria"; selector: string; controls: boolean }
  | { kind: "text"; text: string | RegExp }
  | { kind: "visible" }
  /** A negative index counts from the end. */
  | { kind: "nth"; index: number };

export function firefox(executablePath: string): BrowserDriver<FirefoxPage, BrowserContext> {
  return {
    name: "firefox",
    async launch() {
      // Puppeteer starts Firefox with a fresh profile and its own automation preferences.
      const browser = await puppeteer.launch({ browser: "firefox", executablePath, headless: true, defaultViewport: VIEWPORT });
      return {
        async newPage() {
          const context = await browser.createBrowserContext();
          return { page: new FirefoxPage(await context.newPage()), context };
        },
        close: () => browser.close(),
      };
    },
  };
}

export class FirefoxPage implements Page {
  constructor(private readonly page: PuppeteerPage) {}

  locator(selector: string): Locator {
    return new PuppeteerLocator(this.page, [css(selector)]);
  }

  getByRole(role: Role, options?: { name: string }): Locator {
    return new PuppeteerLocator(this.page, [byRole(role, options?.name)]);
  }

  getByLabel(text: string): Locator {
    return new PuppeteerLocator(this.page, [byLabel(text)]);
  }

  goto(url: string): Promise<unknown> {
    return this.page.goto(url);
  }

  url(): string {
    return this.page.url();
  }

  evaluate<R>(fn: () => R | Promise<R>): Promise<R>;
  evaluate<R, A>(fn: (arg: A) => R | Promise<R>, arg: A): Promise<R>;
  evaluate<R, A>(fn: (arg?: A) => R | Promise<R>, arg?: A): Promise<R> {
    return this.page.evaluate(fn as (arg: unknown) => R | Promise<R>, arg);
  }

  async waitForURL(test: (url: URL) => boolean): Promise<void> {
    await poll(this.page, "a URL that passes the test", async () => (test(new URL(this.page.url())) ? true : undefined));
  }

  waitForResponse(test: (response: Response) => boolean): Promise<Response> {
    return this.page.waitForResponse(test);
  }

  on(event: "request", listener: (request: Request) => void): unknown;
  on(event: "dialog", listener: (dialog: Dialog) => void): unknown;
  on(event: "pageerror", listener: (error: Error) => void): unknown;
  on(event: "request" | "dialog" | "pageerror", listener: (arg: never) => void): unknown {
    return this.page.on(event, listener as (arg: unknown) => void);
  }

  screenshot(options: { path: string; fullPage: boolean }): Promise<unknown> {
    return this.page.screenshot({ path: options.path as `${string}.png`, fullPage: options.fullPage });
  }
}

class PuppeteerLocator implements Locator {
  constructor(private readonly page: PuppeteerPage, private readonly steps: readonly Step[]) {}

  locator(selector: string): Locator {
    return this.then(css(selector));
  }

  getByRole(role: Role, options?: { name: string }): Locator {
    return this.then(byRole(role, options?.name));
  }

  getByLabel(text: string): Locator {
    return this.then(byLabel(text));
  }

  filter(options: { hasText?: string | RegExp; visible?: true }): Locator {
    let l: PuppeteerLocator = this;
    if (options.hasText !== undefined) l = l.then({ kind: "text", text: options.hasText });
    if (options.visible) l = l.then({ kind: "visible" });
    return l;
  }

  first(): Locator {
    return this.nth(0);
  }

  last(): Locator {
    return this.nth(-1);
  }

  nth(index: number): Locator {
    return this.then({ kind: "nth", index });
  }

  async waitFor(options?: { state?: WaitState }): Promise<void> {
    const state = options?.state ?? "visible";
    await this.until(`waitFor(${state})`, async (found) => {
      if (state === "detached") return found.length === 0 || undefined;
      const only = this.only(found, "waitFor");
      switch (state) {
        case "attached": return only !== undefined || undefined;
        case "visible": return (only !== undefined && (await only.isVisible())) || undefined;
        case "hidden": return (only === undefined || !(await only.isVisible())) || undefined;
      }
    });
  }

  count(): Promise<number> {
    return this.now(async (found) => found.length);
  }

  textContent(): Promise<string | null> {
    return this.withOne("textContent", (el) => el.evaluate((e) => e.textContent));
  }

  allTextContents(): Promise<string[]> {
    return this.now((found) => texts(this.page, found));
  }

  getAttribute(name: string): Promise<string | null> {
    return this.withOne("getAttribute", (el) => el.evaluate((e, n) => e.getAttribute(n), name));
  }

  inputValue(): Promise<string> {
    return this.withOne("inputValue", (el) => el.evaluate((e) => (e as HTMLInputElement).value));
  }

  isVisible(): Promise<boolean> {
    return this.now(async (found) => this.only(found, "isVisible")?.isVisible() ?? false);
  }

  click(): Promise<void> {
    return this.act("click", (el) => el.click(), (e) => !(e as HTMLButtonElement).disabled);
  }

  fill(value: string): Promise<void> {
    return this.act("fill", async (el) => {
      // Typing over the selected value replaces it, as Playwright's fill does.
      await el.evaluate((e) => (e as HTMLInputElement).select());
      if (value) await el.type(value);
      else await el.press("Backspace");
    }, (e) => !(e as HTMLInputElement).disabled && !(e as HTMLInputElement).readOnly);
  }

  selectOption(value: string): Promise<string[]> {
    return this.act("selectOption", (el) => el.select(value), (e) => !(e as HTMLSelectElement).disabled);
  }

  toString(): string {
    return this.steps.map(stepText).join(" >> ");
  }

  private then(step: Step): PuppeteerLocator {
    return new PuppeteerLocator(this.page, [...this.steps, step]);
  }

  /** Runs f on the elements found now, then lets their handles go. */
  private async now<T>(f: (found: Handle[]) => Promise<T>): Promise<T> {
    const found = await resolve(this.page, this.steps);
    try {
      return await f(found);
    } finally {
      await Promise.all(found.map((h) => h.dispose()));
    }
  }

  /** Looks again until f, given the elements found, answers something other than undefined. */
  private until<T>(what: string, f: (found: Handle[]) => Promise<T | undefined>): Promise<T> {
    return poll(this.page, `${what} on ${this}`, () => this.now(f));
  }

  /** The one element found, or undefined for none; more than one is a mistake in the scenario. */
  private only(found: Handle[], what: string): Handle | undefined {
    if (found.length > 1) throw new Error(`${what} on ${this}: ${found.length} elements match, not one`);
    return found[0];
  }

  /** Waits for exactly one element, then reads it. */
  private async withOne<T>(what: string, read: (el: Handle) => Promise<T>): Promise<T> {
    const box = await this.until(what, async (found) => {
      const el = this.only(found, what);
      return el && { value: await read(el) };
    });
    return box.value;
  }

  /**
   * Waits for exactly one visible element that passes ready (in the page),
   * then acts on it; an element the console replaced mid-way is found again.
   */
  private async act<T>(what: string, action: (el: Handle) => Promise<T>, ready: (e: Element) => boolean): Promise<T> {
    const box = await this.until(what, async (found) => {
      const el = this.only(found, what);
      if (!el || !(await el.isVisible()) || !(await el.evaluate(ready))) return undefined;
      try {
        return { value: await action(el) };
      } catch (err) {
        if (await el.evaluate((e) => e.isConnected).catch(() => false)) throw err;
        return undefined;
      }
    });
    return box.value;
  }
}

function css(selector: string): Step {
  return { kind: "css", selector };
}

function byRole(role: Role, name: string | undefined): Step {
  return { kind: "aria", selector: ariaSelector({ role, name }), controls: false };
}

function byLabel(text: string): Step {
  return { kind: "aria", selector: ariaSelector({ name: text }), controls: true };
}

/** Puppeteer's ARIA selector syntax has no escapes, so a quote cannot be asked for. */
function ariaSelector(attrs: { role?: string; name?: string | undefined }): string {
  const parts = Object.entries(attrs).filter(([, v]) => v !== undefined).map(([k, v]) => {
    if (v!.includes('"')) throw new Error(`an accessible ${k} with a double quote cannot be looked up: ${v}`);
    return `[${k}="${v}"]`;
  });
  return `::-p-aria(${parts.join("")})`;
}

function stepText(step: Step): string {
  switch (step.kind) {
    case "css": return step.selector;
    case "aria": return step.controls ? `${step.selector} (a form control)` : step.selector;
    case "text": return `has text ${step.text}`;
    case "visible": return "visible";
    case "nth": return `nth=${step.index}`;
  }
}

/** The elements the steps find from the page, in document order. */
async function resolve(page: PuppeteerPage, steps: readonly Step[]): Promise<Handle[]> {
  const made: Handle[] = [];
  let found: Handle[] = [];
  try {
    for (const [i, step] of steps.entries()) found = await apply(page, i === 0 ? null : found, step, made);
  } catch (err) {
    await Promise.all(made.map((h) => h.dispose()));
    throw err;
  }
  const kept = new Set(found);
  await Promise.all(made.filter((h) => !kept.has(h)).map((h) => h.dispose()));
  return found;
}

/** One step from the elements found so far (null: from the page); new handles are added to made. */
async function apply(page: PuppeteerPage, from: Handle[] | null, step: Step, made: Handle[]): Promise<Handle[]> {
  const query = async (selector: string) => {
    const lists = from === null ? [await page.$$(selector)] : await Promise.all(from.map((h) => h.$$(selector)));
    const hs = lists.flat() as Handle[];
    made.push(...hs);
    return connectedOnce(page, hs);
  };
  const only = (keep: boolean[]) => (from ?? []).filter((_, i) => keep[i]);
  switch (step.kind) {
    case "css":
      return query(step.selector);
    case "aria": {
      const hs = await query(step.selector);
      if (!step.controls || !hs.length) return hs;
      const controls = await page.evaluate((sel, ...els) => els.map((e) => e.matches(sel)), LABELLED, ...hs);
      return hs.filter((_, i) => controls[i]);
    }
    case "text": {
      const t = await texts(page, from ?? []);
      return only(t.map((s) => hasText(s, step.text)));
    }
    case "visible":
      return only(await Promise.all((from ?? []).map((h) => h.isVisible())));
    case "nth": {
      const h = (from ?? []).at(step.index);
      return h ? [h] : [];
    }
  }
}

/** Drops elements the page has since removed, and repeats (when several elements each found the same one). */
async function connectedOnce(page: PuppeteerPage, hs: Handle[]): Promise<Handle[]> {
  if (!hs.length) return hs;
  const keep = await page.evaluate((...els) => els.map((e, i) => e.isConnected && els.indexOf(e) === i), ...hs);
  return hs.filter((_, i) => keep[i]);
}

async function texts(page: PuppeteerPage, hs: Handle[]): Promise<string[]> {
  if (!hs.length) return [];
  return page.evaluate((...els) => els.map((e) => e.textContent ?? ""), ...hs);
}

/** Playwright's hasText: a string is a case-insensitive substring of the whitespace-collapsed text; a RegExp tests the text as it is. */
function hasText(text: string, want: string | RegExp): boolean {
  if (want instanceof RegExp) {
    want.lastIndex = 0;
    return want.test(text);
  }
  const collapse = (s: string) => s.replace(/\s+/g, " ").trim().toLowerCase();
  return collapse(text).includes(collapse(want));
}

/** Calls attempt until it answers something other than undefined, within the page's default timeout. */
async function poll<T>(page: PuppeteerPage, what: string, attempt: () => Promise<T | undefined>): Promise<T> {
  const timeout = page.getDefaultTimeout();
  const deadline = Date.now() + timeout;
  for (;;) {
    const v = await attempt();
    if (v !== undefined) return v;
    if (Date.now() > deadline) throw new Error(`${what}: not so after ${timeout} ms`);
    await sleep(RETRY_MS);
  }
}
