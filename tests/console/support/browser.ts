/**
 * The seam between the console scenarios and the browser libraries: the part
 * of Playwright's page API the scenarios use, written down as interfaces.
 * Playwright's own Page and BrowserContext implement it (Chromium, over CDP);
 * puppeteer.ts implements it over puppeteer-core (Firefox, over WebDriver
 * BiDi, which Playwright cannot speak to a stock Firefox). A scenario written
 * against these types runs unchanged in both.
 *
 * Accessible names are matched whole (`exact: true`): Firefox answers
 * accessibility queries by exact name only, so the scenarios ask the same of
 * Chromium.
 */

/** The roles the scenarios look elements up by. */
export type Role = "alert" | "button" | "dialog" | "heading" | "link";

export type WaitState = "attached" | "detached" | "visible" | "hidden";

/**
 * Elements found from a page or from other elements, found again on every
 * use. Waiting methods and single-element methods expect exactly one match
 * and fail at once on more; count and allTextContents take what is there now.
 */
export interface Locator {
  locator(selector: string): Locator;
  getByRole(role: Role, options?: { name: string; exact: true }): Locator;
  /** The form control a `<label>` names. */
  getByLabel(text: string, options: { exact: true }): Locator;
  /** hasText: a string is a case-insensitive substring of the whitespace-collapsed text; a RegExp is tested against the text as it is. */
  filter(options: { hasText?: string | RegExp; visible?: true }): Locator;
  first(): Locator;
  last(): Locator;
  nth(index: number): Locator;

  /** Waits for the element to be visible, or for the state given. */
  waitFor(options?: { state?: WaitState }): Promise<void>;
  count(): Promise<number>;
  textContent(): Promise<string | null>;
  allTextContents(): Promise<string[]>;
  getAttribute(name: string): Promise<string | null>;
  inputValue(): Promise<string>;
  /** Whether the one element is visible now; false when there is none. */
  isVisible(): Promise<boolean>;
  /** Waits until the element is visible and enabled, then clicks it. */
  click(): Promise<void>;
  /** Replaces an input's or a textarea's value as typing would. */
  fill(value: string): Promise<void>;
  selectOption(value: string): Promise<string[]>;
}

export interface Request {
  url(): string;
}

export interface Response {
  url(): string;
  status(): number;
}

export interface Dialog {
  type(): string;
  message(): string;
  dismiss(): Promise<void>;
}

export interface Page {
  locator(selector: string): Locator;
  getByRole(role: Role, options?: { name: string; exact: true }): Locator;
  getByLabel(text: string, options: { exact: true }): Locator;
  goto(url: string): Promise<unknown>;
  url(): string;
  evaluate<R>(fn: () => R | Promise<R>): Promise<R>;
  evaluate<R, A>(fn: (arg: A) => R | Promise<R>, arg: A): Promise<R>;
  /** Waits until the page's URL passes the test, including same-document navigations. */
  waitForURL(test: (url: URL) => boolean): Promise<void>;
  waitForResponse(test: (response: Response) => boolean): Promise<Response>;
  on(event: "request", listener: (request: Request) => void): unknown;
  on(event: "dialog", listener: (dialog: Dialog) => void): unknown;
  on(event: "pageerror", listener: (error: Error) => void): unknown;
  screenshot(options: { path: string; fullPage: boolean }): Promise<unknown>;
}

export interface Cookie {
  name: string;
  value: string;
  path: string;
  httpOnly?: boolean;
  secure?: boolean;
  sameSite?: string;
}

/** A browser context: its own cookies and storage. */
export interface Context {
  cookies(): Promise<Cookie[]>;
  close(): Promise<void>;
}

export interface Browser<P extends Page = Page, C extends Context = Context> {
  /** A page in a fresh context (no cookies, no storage) with the viewport of VIEWPORT. */
  newPage(): Promise<{ page: P; context: C }>;
  close(): Promise<void>;
}

/** A browser the scenarios run in, from the machine's packages, never a download. */
export interface BrowserDriver<P extends Page = Page, C extends Context = Context> {
  readonly name: string;
  launch(): Promise<Browser<P, C>>;
}

export const VIEWPORT = { width: 1280, height: 900 };
