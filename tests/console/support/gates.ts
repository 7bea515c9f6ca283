/**
 * Gates the test opens for the agent: a tool asks GET /wait/NAME and gets its
 * answer when the test releases NAME, so a test decides when an execution
 * moves on and knows when it has reached a gate, without sleeping.
 */

import http from "node:http";
import type { AddressInfo } from "node:net";

export class Gates {
  url = "";
  private server: http.Server | undefined;
  private held = new Map<string, http.ServerResponse[]>();
  private released = new Set<string>();
  private arrivals = new Map<string, Array<() => void>>();

  async start(): Promise<this> {
    this.server = http.createServer((req, res) => {
      const m = /^\/wait\/([^/]+)$/.exec(req.url ?? "");
      if (!m) {
        res.writeHead(404).end();
        return;
      }
      const name = decodeURIComponent(m[1]!);
      if (this.released.has(name)) {
        res.end(name);
      } else {
        this.held.set(name, [...(this.held.get(name) ?? []), res]);
      }
      for (const notify of this.arrivals.get(name) ?? []) notify();
      this.arrivals.delete(name);
    });
    await new Promise<void>((resolve) => this.server!.listen(0, "127.0.0.1", resolve));
    this.url = `http://127.0.0.1:${(this.server.address() as AddressInfo).port}`;
    return this;
  }

  /** Resolves once something waits at the gate (at once if something does). */
  reached(name: string): Promise<void> {
    if (this.held.has(name)) return Promise.resolve();
    return new Promise((resolve) => this.arrivals.set(name, [...(this.arrivals.get(name) ?? []), resolve]));
  }

  /** Lets everything waiting at the gate, and everything that comes later, through. */
  release(name: string): void {
    this.released.add(name);
    for (const res of this.held.get(name) ?? []) res.end(name);
    this.held.delete(name);
  }

  async stop(): Promise<void> {
    for (const list of this.held.values()) for (const res of list) res.destroy();
    this.server?.closeAllConnections();
    await new Promise<void>((resolve) => (this.server ? this.server.close(() => resolve()) : resolve()));
  }
}
