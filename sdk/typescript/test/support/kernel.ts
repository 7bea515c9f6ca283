/**
 * The real `rebuno` binary for end-to-end tests: `$REBUNO_BIN` (the Makefile
 * builds `bin/rebuno-test`), else a test build made once with the
 * `rebuno_test` tag. One `rebuno dev` process per test file, on a fresh
 * SQLite file, with the manual clock so that tests can make leases lapse.
 */

import { type ChildProcess, execFileSync, spawn } from "node:child_process";
import fs from "node:fs";
import net from "node:net";
import os from "node:os";
import path from "node:path";
import { fileURLToPath } from "node:url";
import { Client } from "../../src/client.js";

export const REPO = fileURLToPath(new URL("../../../../", import.meta.url));

let built: string | undefined;

// Every child process the tests start, so that none outlives them: a test that
// times out never reaches its own clean-up.
const children = new Set<ChildProcess>();
process.once("exit", () => {
  for (const child of children) child.kill("SIGKILL");
});
function track(child: ChildProcess): ChildProcess {
  children.add(child);
  child.once("exit", () => children.delete(child));
  return child;
}

export function kernelBinary(): string {
  const env = process.env.REBUNO_BIN;
  if (env) {
    if (!fs.existsSync(env)) throw new Error(`REBUNO_BIN=${env} does not exist`);
    return env;
  }
  if (!built) {
    const out = path.join(fs.mkdtempSync(path.join(os.tmpdir(), "rebuno-ts-bin-")), "rebuno-test");
    execFileSync("go", ["build", "-tags", "rebuno_test", "-o", out, "./cmd/rebuno"], { cwd: REPO, stdio: "inherit" });
    built = out;
  }
  return built;
}

/** Poll `cond` until it returns something truthy; throw after `timeout` ms. */
export async function eventually<T>(cond: () => T | Promise<T>, what = "condition", timeout = 20_000): Promise<NonNullable<T>> {
  const deadline = Date.now() + timeout;
  for (;;) {
    const v = await cond();
    if (v) return v as NonNullable<T>;
    if (Date.now() > deadline) throw new Error(`${what} not met within ${timeout} ms`);
    await new Promise((r) => setTimeout(r, 20));
  }
}

export class Kernel {
  url = "";
  readonly dir: string;
  private proc: ChildProcess | undefined;
  private log: string[] = [];

  constructor(private readonly args: string[] = [], private readonly manualClock = true) {
    this.dir = fs.mkdtempSync(path.join(os.tmpdir(), "rebuno-ts-kernel-"));
  }

  async start(): Promise<this> {
    const env = { ...process.env };
    delete env.REBUNO_BEARER_TOKEN;
    if (this.manualClock) env.REBUNO_TEST_CLOCK = "manual";
    const proc = spawn(kernelBinary(), ["dev", "--db", path.join(this.dir, "rebuno.db"), "--listen-addr", this.url ? this.url.replace("http://", "") : "127.0.0.1:0", "--no-repl", ...this.args],
      { env, stdio: ["ignore", "ignore", "pipe"] });
    this.proc = track(proc);
    this.url = await new Promise<string>((resolve, reject) => {
      let buffered = "";
      const timer = setTimeout(() => reject(new Error(`kernel did not start:\n${this.log.join("")}`)), 30_000);
      proc.stderr!.on("data", (c: Buffer) => {
        const text = c.toString("utf8");
        this.log.push(text);
        buffered += text;
        const m = /url:\s+(http:\/\/\S+)/.exec(buffered);
        if (m) {
          clearTimeout(timer);
          resolve(m[1]!);
        }
      });
      proc.once("exit", (code) => reject(new Error(`kernel exited (${code}):\n${this.log.join("")}`)));
    });
    await eventually(async () => (await fetch(`${this.url}/v0/ready`).catch(() => undefined))?.status === 200, "kernel ready", 15_000);
    return this;
  }

  client(): Client {
    return new Client(this.url);
  }

  /** Move the kernel's manual clock. */
  async advance(seconds: number): Promise<void> {
    const r = await fetch(`${this.url}/v0/test/clock`, { method: "POST", headers: { "content-type": "application/json" }, body: JSON.stringify({ advance: `${seconds}s` }) });
    if (!r.ok) throw new Error(`advance: ${r.status} ${await r.text()}`);
  }

  async stop(): Promise<void> {
    const proc = this.proc;
    this.proc = undefined;
    if (!proc || proc.exitCode !== null) return;
    const exited = new Promise((r) => proc.once("exit", r));
    proc.kill("SIGTERM");
    const timer = setTimeout(() => proc.kill("SIGKILL"), 20_000);
    await exited;
    clearTimeout(timer);
  }

  /** Stop and remove the database. */
  async destroy(): Promise<void> {
    await this.stop();
    fs.rmSync(this.dir, { recursive: true, force: true });
  }
}

/**
 * A child process running an agent script, that can be killed with SIGKILL:
 * a TypeScript one with node and tsx's loader (one process), or any other
 * with the `interpreter` given.
 */
export class AgentProcess {
  readonly output: string[] = [];
  port: number | undefined;
  private readonly proc: ChildProcess;
  private readonly ready: Promise<number>;

  constructor(script: string, env: Record<string, string>, args: string[] = [], interpreter?: string) {
    const tsx = path.join(REPO, "sdk/typescript/node_modules/tsx/dist/loader.mjs");
    const [cmd, ...pre] = interpreter ? [interpreter] : [process.execPath, "--import", tsx];
    this.proc = track(spawn(cmd!, [...pre, script, ...args], { env: { ...process.env, ...env }, stdio: ["ignore", "pipe", "pipe"] }));
    this.ready = new Promise((resolve, reject) => {
      let buffered = "";
      const onData = (c: Buffer): void => {
        const text = c.toString("utf8");
        this.output.push(text);
        buffered += text;
        const m = /^PORT (\d+)$/m.exec(buffered);
        if (m && this.port === undefined) {
          this.port = Number(m[1]);
          resolve(this.port);
        }
      };
      this.proc.stdout!.on("data", onData);
      this.proc.stderr!.on("data", onData);
      this.proc.once("exit", (code) => reject(new Error(`agent exited (${code}):\n${this.output.join("")}`)));
    });
    this.ready.catch(() => undefined);
  }

  /** The child's process id. */
  get pid(): number {
    return this.proc.pid!;
  }

  /** The webhook URL once the agent accepts connections (it may print its port before). */
  async webhook(timeout = 60_000): Promise<string> {
    const port = await Promise.race([this.ready, new Promise<never>((_, reject) => setTimeout(() => reject(new Error(`agent did not start:\n${this.output.join("")}`)), timeout))]);
    await eventually(() => listening(port), "the agent to listen", timeout);
    return `http://127.0.0.1:${port}/webhook`;
  }

  /** SIGKILL: no shutdown, nothing reported. */
  async kill(): Promise<void> {
    if (this.proc.exitCode !== null || this.proc.signalCode !== null) return;
    const exited = new Promise((r) => this.proc.once("exit", r));
    this.proc.kill("SIGKILL");
    await exited;
  }

  async stop(): Promise<void> {
    if (this.proc.exitCode !== null || this.proc.signalCode !== null) return;
    const exited = new Promise((r) => this.proc.once("exit", r));
    this.proc.kill("SIGTERM");
    const timer = setTimeout(() => this.proc.kill("SIGKILL"), 10_000);
    await exited;
    clearTimeout(timer);
  }
}

/** Lines appended to a marker file by agent processes (one per body run). */
export function markers(file: string): string[] {
  try {
    return fs.readFileSync(file, "utf8").split(/\s+/).filter(Boolean);
  } catch {
    return [];
  }
}

/** Whether something accepts connections on a loopback port. */
export function listening(port: number): Promise<boolean> {
  return new Promise((resolve) => {
    const socket = net.connect(port, "127.0.0.1");
    socket.once("connect", () => (socket.destroy(), resolve(true)));
    socket.once("error", () => resolve(false));
  });
}

/** A TCP port free on 127.0.0.1 when asked (the OS picks it). */
export async function freePort(): Promise<number> {
  const server = net.createServer();
  await new Promise<void>((resolve) => server.listen(0, "127.0.0.1", resolve));
  const port = (server.address() as net.AddressInfo).port;
  await new Promise((resolve) => server.close(resolve));
  return port;
}
