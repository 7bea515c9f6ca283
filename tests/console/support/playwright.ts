/**
 * Chromium through playwright-core: Playwright's Page and BrowserContext are
 * the seam of browser.ts as they are.
 */

import { chromium as playwright, type BrowserContext, type Page } from "playwright-core";
import { VIEWPORT, type BrowserDriver } from "./browser.ts";

const FLAGS = ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run", "--disable-background-networking",
  "--disable-component-update", "--disable-sync"];

export function chromium(executablePath: string): BrowserDriver<Page, BrowserContext> {
  return {
    name: "chromium",
    async launch() {
      // Headless, with a fresh profile per launch (Playwright's --user-data-dir).
      const browser = await playwright.launch({ executablePath, headless: true, args: FLAGS });
      return {
        async newPage() {
          const context = await browser.newContext({ viewport: VIEWPORT });
          return { page: await context.newPage(), context };
        },
        close: () => browser.close(),
      };
    },
  };
}
