/**
 * The client of Rebuno's TypeScript row (client.py on the
 * TypeScript SDK's `Client`): `client.run` when the SDK has it, else the
 * execution's event stream to its end.
 */

import { Client } from "../../../sdk/typescript/dist/index.js";
import { check, serve, STEPS } from "../loop.ts";

const AGENT_ID = process.env.AGENT_ID!;
const client = new Client(process.env.REBUNO_URL!);
await client.registerAgent(AGENT_ID, process.env.AGENT_URL!, process.env.REBUNO_AGENT_SECRET!);

type WithRun = Client & { run?: (agentId: string, input: unknown) => Promise<unknown> };
const run = (client as WithRun).run?.bind(client);

async function byStream(): Promise<void> {
  const execution = await client.create(AGENT_ID, { n: STEPS });
  for await (const event of client.streamEvents(execution.id)) {
    if (event.type === "execution.completed") return check(event.payload.output);
    if (event.type === "execution.failed" || event.type === "execution.cancelled") break;
  }
  throw new Error(`execution ${execution.id} did not complete`);
}

if (run) await serve(async () => check(await run(AGENT_ID, { n: STEPS })), "client.run");
else await serve(byStream, "event stream");
