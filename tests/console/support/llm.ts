/**
 * A streamed chat completion that stops half-way until the test lets it go,
 * standing in for an LLM provider: the console must show the first tokens
 * while the call still runs.
 */

import http from "node:http";
import type { AddressInfo } from "node:net";
import type { Gates } from "./gates.ts";

export const FIRST_TOKENS = ["Hel", "lo from ", "the model"];
export const LAST_TOKENS = [", streamed", " live."];

export async function startLLM(gates: Gates, gate: string): Promise<{ url: string; stop: () => Promise<void> }> {
  const server = http.createServer(async (req, res) => {
    for await (const _ of req) { /* drain the request */ }
    res.writeHead(200, { "content-type": "text/event-stream", "cache-control": "no-cache" });
    const chunk = (content: string) =>
      res.write(`data: ${JSON.stringify({ id: "c1", object: "chat.completion.chunk", model: "scripted", choices: [{ index: 0, delta: { content } }] })}\n\n`);
    // The test says when each half comes, through the gates the tools use.
    await fetch(`${gates.url}/wait/${gate}-start`).then((r) => r.text());
    for (const t of FIRST_TOKENS) chunk(t);
    await fetch(`${gates.url}/wait/${gate}-end`).then((r) => r.text());
    for (const t of LAST_TOKENS) chunk(t);
    res.end("data: [DONE]\n\n");
  });
  await new Promise<void>((resolve) => server.listen(0, "127.0.0.1", resolve));
  return {
    url: `http://127.0.0.1:${(server.address() as AddressInfo).port}/v1`,
    stop: async () => {
      server.closeAllConnections();
      await new Promise<void>((resolve) => server.close(() => resolve()));
    },
  };
}
