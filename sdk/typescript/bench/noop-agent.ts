/** The benchmark's TypeScript agent: `n` no-op tool steps per execution. */

import { Agent, defineTool } from "../src/index.js";

const noop = defineTool({ name: "noop", execute: ({ i }: { i: number }) => i });

const agent = new Agent(process.env.AGENT_ID!);
await agent.serve({ port: Number(process.env.PORT) }, async (input: { n: number }) => {
  for (let i = 0; i < input.n; i++) await noop({ i });
  return { n: input.n };
});
console.log(`PORT ${agent.address!.port}`);
