/** Serving in-process agents against a test kernel. */

import { Agent, type AgentOptions, type Handler, type HandlerOptions } from "../../src/agent.js";
import type { StandardSchemaV1 } from "../../src/input.js";
import type { Kernel } from "./kernel.js";

export const SECRET = "ts-e2e-secret-0123456789";

export interface Served {
  agent: Agent;
  webhook: string;
  close(): Promise<void>;
}

/** Serve `handler` as agent `id` on a free port and register it with the kernel. */
export async function serveAgent<S extends StandardSchemaV1 | undefined = undefined>(kernel: Kernel, id: string, handler: Handler,
  options: HandlerOptions<S> & { agent?: AgentOptions; leaseTimeoutSeconds?: number } = {}): Promise<Served> {
  const agent = new Agent(id, { secret: SECRET, baseUrl: kernel.url, ...options.agent });
  await agent.serve({ port: 0, handleSignals: false }, handler, options);
  const webhook = `http://127.0.0.1:${agent.address!.port}/webhook`;
  await kernel.client().registerAgent(id, webhook, SECRET, options.leaseTimeoutSeconds ? { leaseTimeoutSeconds: options.leaseTimeoutSeconds } : {});
  return { agent, webhook, close: () => agent.close() };
}
