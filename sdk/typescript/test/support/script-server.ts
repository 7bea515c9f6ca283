/**
 * A scripted OpenAI-compatible server on loopback, standing in for a paid
 * LLM API. Its next action is a function of the request alone: it counts the
 * tool results in the conversation (`role: "tool"` messages on the chat
 * completions wire, `function_call_output` items on the responses wire) and
 * answers with script entry N+1. A replayed conversation therefore asks the
 * same question and gets the same answer, and a fork's live calls are
 * deterministic. Both wires answer plain and streamed (`"stream": true`).
 */

import http from "node:http";
import type { AddressInfo } from "node:net";

/** A scripted answer: write or read a file (a tool call), or a final text. */
export type Entry = ["write", string, string] | ["read", string] | ["answer", string];

export const DEFAULT_SCRIPT: Entry[] = [
  ["write", "a.txt", "1"], ["write", "b.txt", "2"], ["read", "a.txt"], ["write", "c.txt", "3"], ["write", "a.txt", "4"],
  ["write", "d.txt", "5"], ["read", "b.txt"], ["write", "e.txt", "6"], ["answer", "done"],
];

/** The files a script writes, in order. */
export function writesOf(script: Entry[]): [string, string][] {
  return script.filter((e): e is ["write", string, string] => e[0] === "write").map(([, p, c]) => [p, c]);
}

export interface LoggedRequest {
  path: string;
  /** Tool results the request carried: it was answered with entry n + 1. */
  n: number;
  stream: boolean;
  body: Record<string, unknown>;
}

function call(entry: Entry): [string, string] {
  return entry[0] === "write" ? ["write_file", JSON.stringify({ path: entry[1], content: entry[2] })] : ["read_file", JSON.stringify({ path: entry[1] })];
}

const sse = (res: http.ServerResponse): ((data: unknown) => void) => {
  res.writeHead(200, { "content-type": "text/event-stream", "cache-control": "no-cache" });
  return (data) => res.write(`data: ${typeof data === "string" ? data : JSON.stringify(data)}\n\n`);
};

export class ScriptServer {
  readonly requests: LoggedRequest[] = [];
  url = "";
  private server: http.Server | undefined;

  constructor(public script: Entry[] = DEFAULT_SCRIPT) {}

  /** Entry n + 1 (the last one past the end). */
  entry(n: number): Entry {
    return this.script[Math.min(n, this.script.length - 1)]!;
  }

  /** The `n` of every logged request to `path`, in arrival order. */
  counts(path = "/v1/responses"): number[] {
    return this.requests.filter((r) => r.path === path).map((r) => r.n);
  }

  async start(): Promise<string> {
    this.server = http.createServer((req, res) => void this.handle(req, res));
    await new Promise<void>((resolve) => this.server!.listen(0, "127.0.0.1", resolve));
    this.url = `http://127.0.0.1:${(this.server.address() as AddressInfo).port}/v1`;
    return this.url;
  }

  async stop(): Promise<void> {
    this.server?.closeAllConnections();
    await new Promise<void>((resolve) => (this.server ? this.server.close(() => resolve()) : resolve()));
  }

  private async handle(req: http.IncomingMessage, res: http.ServerResponse): Promise<void> {
    const chunks: Buffer[] = [];
    for await (const c of req) chunks.push(c as Buffer);
    const body = JSON.parse(Buffer.concat(chunks).toString("utf8") || "{}") as Record<string, unknown>;
    const path = (req.url ?? "").split("?")[0]!;
    const stream = body.stream === true;
    if (path === "/v1/chat/completions") {
      const messages = Array.isArray(body.messages) ? (body.messages as Record<string, unknown>[]) : [];
      const n = messages.filter((m) => m?.role === "tool").length;
      this.requests.push({ path, n, stream, body });
      return this.chat(res, n, String(body.model ?? "scripted"), stream);
    }
    if (path === "/v1/responses") {
      const input = Array.isArray(body.input) ? (body.input as Record<string, unknown>[]) : [];
      const n = input.filter((i) => i?.type === "function_call_output").length;
      this.requests.push({ path, n, stream, body });
      return this.responses(res, n, String(body.model ?? "scripted"), stream);
    }
    res.writeHead(404, { "content-type": "application/json" }).end(JSON.stringify({ error: { message: "not found" } }));
  }

  private chat(res: http.ServerResponse, n: number, model: string, stream: boolean): void {
    const entry = this.entry(n);
    const id = `chatcmpl-${n + 1}`;
    const callId = `call_${n + 1}`;
    const usage = { prompt_tokens: 10, completion_tokens: 5, total_tokens: 15 };
    if (stream) {
      const send = sse(res);
      const frame = (choices: unknown[], extra: Record<string, unknown> = {}): void =>
        send({ id, object: "chat.completion.chunk", created: 1_700_000_000, model, choices, ...extra });
      if (entry[0] === "answer") {
        frame([{ index: 0, delta: { role: "assistant", content: "" }, finish_reason: null }]);
        for (let i = 0; i < entry[1].length; i += 3) frame([{ index: 0, delta: { content: entry[1].slice(i, i + 3) }, finish_reason: null }]);
        frame([{ index: 0, delta: {}, finish_reason: "stop" }]);
      } else {
        const [name, args] = call(entry);
        frame([{ index: 0, delta: { role: "assistant", content: null, tool_calls: [{ index: 0, id: callId, type: "function", function: { name, arguments: "" } }] }, finish_reason: null }]);
        frame([{ index: 0, delta: { tool_calls: [{ index: 0, function: { arguments: args } }] }, finish_reason: null }]);
        frame([{ index: 0, delta: {}, finish_reason: "tool_calls" }]);
      }
      frame([], { usage });
      send("[DONE]");
      res.end();
      return;
    }
    const message: Record<string, unknown> = { role: "assistant", content: entry[0] === "answer" ? entry[1] : null };
    if (entry[0] !== "answer") {
      const [name, args] = call(entry);
      message.tool_calls = [{ id: callId, type: "function", function: { name, arguments: args } }];
    }
    res.writeHead(200, { "content-type": "application/json" }).end(JSON.stringify({
      id, object: "chat.completion", created: 1_700_000_000, model,
      choices: [{ index: 0, message, finish_reason: entry[0] === "answer" ? "stop" : "tool_calls" }], usage,
    }));
  }

  private responses(res: http.ServerResponse, n: number, model: string, stream: boolean): void {
    const entry = this.entry(n);
    const usage = { input_tokens: 10, output_tokens: 5, total_tokens: 15, input_tokens_details: { cached_tokens: 0 }, output_tokens_details: { reasoning_tokens: 0 } };
    const item = entry[0] === "answer"
      ? { type: "message", id: `msg_${n + 1}`, status: "completed", role: "assistant", content: [{ type: "output_text", text: entry[1], annotations: [] }] }
      : { type: "function_call", id: `fc_${n + 1}`, call_id: `call_${n + 1}`, name: call(entry)[0], arguments: call(entry)[1], status: "completed" };
    const response = { id: `resp_${n + 1}`, object: "response", created_at: 1_700_000_000, status: "completed", model, incomplete_details: null };
    if (!stream) {
      res.writeHead(200, { "content-type": "application/json" }).end(JSON.stringify({ ...response, output: [item], usage }));
      return;
    }
    const send = sse(res);
    let seq = 0;
    const event = (type: string, data: Record<string, unknown>): void => send({ type, sequence_number: seq++, ...data });
    event("response.created", { response: { ...response, status: "in_progress", output: [] } });
    if (entry[0] === "answer") {
      event("response.output_item.added", { output_index: 0, item: { ...item, status: "in_progress", content: [] } });
      for (let i = 0; i < entry[1].length; i += 3) {
        event("response.output_text.delta", { item_id: item.id, output_index: 0, content_index: 0, delta: entry[1].slice(i, i + 3) });
      }
    } else {
      event("response.output_item.added", { output_index: 0, item: { ...item, arguments: "", status: "in_progress" } });
      event("response.function_call_arguments.delta", { item_id: item.id, output_index: 0, delta: (item as { arguments: string }).arguments });
    }
    event("response.output_item.done", { output_index: 0, item });
    event("response.completed", { response: { ...response, output: [item], usage } });
    res.end();
  }
}
