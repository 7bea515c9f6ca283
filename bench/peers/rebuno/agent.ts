/** Rebuno's side of the peers benchmark, TypeScript: the agent of agent.py on the TypeScript SDK. */

import { Agent, defineTool } from "../../../sdk/typescript/dist/index.js";

const noop = defineTool({ name: "noop", execute: ({ i }: { i: number }) => i });

const agent = new Agent(process.env.AGENT_ID!);
await agent.serve({ port: Number(process.env.PORT), host: "127.0.0.1" }, async ({ n }: { n: number }) => {
  for (let i = 0; i < n; i++) await noop({ i });
  return n;
});
