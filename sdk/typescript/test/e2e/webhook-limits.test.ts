/**
 * A webhook's body is read up to a fixed limit before its signature is
 * checked: an unsigned 300 MiB POST to a real agent process is refused with
 * `413` long before it has been sent, and the agent's memory does not grow
 * with it (the Python SDK's tests/e2e/test_webhook_limits.py holds the same).
 */

import fs from "node:fs";
import net from "node:net";
import path from "node:path";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { MAX_WEBHOOK_BODY } from "../../src/index.js";
import { SECRET } from "../support/agents.js";
import { AgentProcess, freePort, Kernel } from "../support/kernel.js";

const SCRIPT = new URL("./agents/crash-agent.ts", import.meta.url).pathname;
const MiB = 1 << 20;
const HUGE = 300 * MiB;
/** How much the agent's peak resident memory may grow while it is sent HUGE bytes. */
const RSS_GROWTH_MAX = 20 * MiB;

let kernel: Kernel;
let agent: AgentProcess;
let port: number;

beforeAll(async () => {
  kernel = await new Kernel().start();
  port = await freePort();
  agent = new AgentProcess(SCRIPT, {
    REBUNO_URL: kernel.url, REBUNO_AGENT_SECRET: SECRET, AGENT_ID: "limits", PORT: String(port),
    MARKERS: path.join(kernel.dir, "markers"), REBUNO_LOCAL_RESOURCES: path.join(kernel.dir, "resources"),
  });
  await agent.webhook();
});
afterAll(async () => {
  await agent?.stop();
  await kernel?.destroy();
});

/** The process's peak resident set size (VmHWM), in bytes. */
function peakRss(pid: number): number {
  const m = /^VmHWM:\s+(\d+) kB$/m.exec(fs.readFileSync(`/proc/${pid}/status`, "utf8"));
  if (!m) throw new Error("no VmHWM in /proc/<pid>/status");
  return Number(m[1]) * 1024;
}

interface Answer {
  status: number;
  body: { code: string };
  /** Body bytes written before the answer arrived. */
  sent: number;
}

/**
 * POST /webhook with `head` (request line and headers) and then the body
 * from `parts`, written as the socket drains, until the agent answers. An
 * agent that refuses a body closes the connection with the rest unread, so
 * write errors after the answer are expected and ignored.
 */
function post(head: string, parts: Iterable<Buffer>): Promise<Answer> {
  return new Promise((resolve, reject) => {
    const socket = net.connect(port, "127.0.0.1");
    let sent = 0;
    let answered = false;
    let data = Buffer.alloc(0);
    const timer = setTimeout(() => socket.destroy(new Error("no answer within 120 s")), 120_000);
    const it = parts[Symbol.iterator]();
    const pump = (): void => {
      for (;;) {
        if (answered || socket.destroyed) return;
        const next = it.next();
        if (next.done) return;
        sent += next.value.length;
        if (!socket.write(next.value)) {
          socket.once("drain", pump);
          return;
        }
      }
    };
    socket.on("data", (chunk) => {
      data = Buffer.concat([data, chunk]);
      const text = data.toString("latin1");
      const end = text.indexOf("\r\n\r\n");
      if (end < 0) return;
      const length = Number(/\r\ncontent-length:\s*(\d+)/i.exec(text.slice(0, end))?.[1] ?? NaN);
      if (text.length < end + 4 + length) return;
      answered = true;
      clearTimeout(timer);
      socket.destroy();
      resolve({ status: Number(text.split(" ")[1]), body: JSON.parse(text.slice(end + 4, end + 4 + length)), sent });
    });
    socket.on("error", (e) => {
      if (!answered) reject(e);
    });
    socket.on("close", () => {
      clearTimeout(timer);
      if (!answered) reject(new Error(`the connection closed without a whole answer: ${data.toString("latin1")}`));
    });
    socket.write(`POST /webhook HTTP/1.1\r\nHost: 127.0.0.1:${port}\r\nContent-Type: application/json\r\n${head}\r\n`);
    pump();
  });
}

/** `total` bytes of "0", one MiB (or less) a part, the same buffer each time. */
function* zeros(total: number): Generator<Buffer> {
  const block = Buffer.alloc(MiB, "0");
  for (let start = 0; start < total; start += MiB) yield block.subarray(0, Math.min(MiB, total - start));
}

/** The chunked transfer coding of a body. */
function* chunked(parts: Iterable<Buffer>): Generator<Buffer> {
  for (const part of parts) {
    yield Buffer.from(`${part.length.toString(16)}\r\n`);
    yield part;
    yield Buffer.from("\r\n");
  }
  yield Buffer.from("0\r\n\r\n");
}

describe("an unsigned 300 MiB webhook", () => {
  it("is refused with 413 before it is sent, and the agent's memory stays flat", async () => {
    // Warm up: an unsigned webhook within the limit is read, then refused as unsigned.
    const small = Buffer.from('{"execution_id":"x"}');
    expect((await post(`Content-Length: ${small.length}\r\n`, [small])).status).toBe(401);
    const before = peakRss(agent.pid);

    // Declared too large: refused from the header, before any of the body is read.
    let r = await post(`Content-Length: ${HUGE}\r\n`, zeros(HUGE));
    expect([r.status, r.body.code]).toEqual([413, "payload_too_large"]);
    expect(r.sent).toBeLessThan(HUGE / 2);

    // Streamed without a length: refused once the limit is crossed.
    r = await post("Transfer-Encoding: chunked\r\n", chunked(zeros(HUGE)));
    expect([r.status, r.body.code]).toEqual([413, "payload_too_large"]);
    expect(r.sent).toBeLessThan(HUGE / 2);

    const growth = peakRss(agent.pid) - before;
    console.log(`peak RSS before ${(before / MiB).toFixed(1)} MiB, growth ${(growth / MiB).toFixed(1)} MiB`);
    expect(growth).toBeLessThanOrEqual(RSS_GROWTH_MAX);

    // Exactly at the limit is still read and checked; one byte more is not.
    const atLimit = Buffer.from("{" + " ".repeat(MAX_WEBHOOK_BODY - 2) + "}");
    r = await post("Transfer-Encoding: chunked\r\n", chunked([atLimit]));
    expect([r.status, r.body.code]).toEqual([401, "unauthorized"]);
    r = await post("Transfer-Encoding: chunked\r\n", chunked([atLimit, Buffer.from(" ")]));
    expect([r.status, r.body.code]).toEqual([413, "payload_too_large"]);
  }, 300_000);
});
